"""Every prompt is seen however fast: 600 prompts of 5-25 ms through the stand-in, one in four
running out of VRAM, with ``oom-sentinel run`` killed (SIGKILL) a third of the way through and
started again after 200 more prompts ran unwatched (tests/fast_prompts.py). Every prompt gets
one run row, every OOM one incident (``storm_window_s = 0``: each its own snapshot), and the
prompts that ran while no daemon watched are read back from ``/history`` after the restart.

    .venv/bin/python -m pytest -s tests/test_watch_fast_prompts.py   # prints the figures
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fast_prompts import run_fast_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_600_fast_prompts_with_a_kill_9_each_get_one_run_row_and_every_oom_an_incident(
    tmp_path: Path,
) -> None:
    f = run_fast_prompts(tmp_path, prompts=600, kill_at=200, back_at=400)
    print(f"\n[fast prompts] {f.line(200, 400)}")
    assert not f.lost and not f.doubled and len(f.runs) == f.prompts == 600
    assert f.oom_rows == f.ooms and len(f.ooms) == 150
    assert set(f.snapshot_prompts) == f.ooms and max(f.snapshot_prompts.values()) == 1
    assert f.snapshots == len(f.ooms)
    assert not f.no_incident_id
    assert "Traceback" not in f.daemon_log

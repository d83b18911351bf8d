"""Every prompt is seen however fast: 600 prompts of 5-25 ms through the stand-in, one in four
running out of VRAM, with ``oom-sentinel run`` killed (SIGKILL) a third of the way through and
started again after 200 more prompts ran unwatched (tests/fast_prompts.py). Every prompt gets
one run row, every OOM one incident (``storm_window_s = 0``: each its own snapshot), and the
prompts that ran while no daemon watched are read back from ``/history`` after the restart.

    .venv/bin/python -m pytest -s tests/test_watch_fast_prompts.py   # prints the figures
"""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fast_prompts import FastServer, run_fast_prompts

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


def real_server(tmp: Path) -> FastServer:
    """A real ComfyUI on the CPU: an 8x8 image previewed (a few ms), every fourth prompt an
    EmptyImage of 64 GiB (a RAM OOM)."""
    from test_comfy_watch_real import _image, start_real

    real = start_real(tmp)

    def make(i: int, rng: random.Random) -> tuple[dict[str, Any], bool]:
        oom = i % 4 == 3
        image = _image(16384, 64, i) if oom else _image(8, 1, i)
        return {
            "1": image,
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        }, oom

    def get_json(path: str) -> Any:
        with urllib.request.urlopen(real.url + path, timeout=30) as resp:
            return json.loads(resp.read())

    return FastServer(real.url, get_json, real.post, real.stop, make)


@pytest.mark.real_comfyui
def test_600_fast_prompts_through_a_real_comfyui_with_a_kill_9(tmp_path: Path) -> None:
    f = run_fast_prompts(tmp_path, 600, 200, 400, start_server=real_server)
    print(f"\n[fast prompts, real ComfyUI] {f.line(200, 400)}")
    assert not f.lost and not f.doubled and len(f.runs) == 600
    assert f.oom_rows == f.ooms and len(f.ooms) == 150
    assert set(f.snapshot_prompts) == f.ooms and f.snapshots == len(f.ooms)
    assert not f.no_incident_id

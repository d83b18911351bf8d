"""Exactly once under kill -9, Manager rotations and backlogs, against the real daemon process
(issue 11, item 3): 240 failures, rotations every few, ten SIGKILLs at random moments."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.exactly_once import run_stress

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and Manager's renames")


def test_every_failure_is_counted_once_through_kills_rotations_and_backlogs(tmp_path: Path) -> None:
    figures = run_stress(tmp_path, records=240, kills=12, seed=11, say=print)
    print(figures.line())
    assert figures.kills >= 12 and figures.kills_in_storm and figures.kills_in_backlog
    assert figures.rotations >= 240 // 8  # a Manager rotation every few failures
    assert figures.problems == []
    assert (figures.lost, figures.duplicated) == (0, 0), figures.line()
    assert figures.counted == figures.records
    # a storm that spans a restart stays one incident and one snapshot
    assert figures.incidents == figures.snapshots == figures.expected_incidents

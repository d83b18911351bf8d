"""Retention: at most N snapshots, none older than D days, never the newest; rows go too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import snapshot_samples as samples

from oom_sentinel.daemon.incidents.retention import plan_prune, prune_snapshots, snapshot_time_s
from oom_sentinel.daemon.incidents.snapshot import write_snapshot
from oom_sentinel.daemon.store.db import IncidentRow, Store

DAY = 86400.0
NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("ages_days", "max_count", "max_age_days", "deleted"),
    [
        ([0, 1, 2, 3], 0, 0, []),
        ([0, 1, 2, 3], 2, 0, ["s2", "s3"]),
        ([0, 1, 2, 3], 0, 1.5, ["s2", "s3"]),
        ([0, 1, 2, 3], 3, 1.5, ["s2", "s3"]),
        ([0, 1, 2, 3], 1, 0, ["s1", "s2", "s3"]),
        ([10, 20], 0, 5, ["s1"]),  # all too old: the newest still stays
        ([100], 1, 1, []),
        ([], 5, 5, []),
    ],
    ids=[
        "no-limits",
        "count",
        "age",
        "count-and-age",
        "keep-one",
        "newest-kept-though-old",
        "single-old",
        "empty",
    ],
)
def test_plan_prune(
    ages_days: list[float], max_count: int, max_age_days: float, deleted: list[str]
) -> None:
    entries = [(f"s{i}", NOW - age * DAY) for i, age in enumerate(ages_days)]
    got = plan_prune(entries, max_count=max_count, max_age_days=max_age_days, now_s=NOW)
    assert sorted(got) == deleted


def test_plan_prune_breaks_time_ties_by_id() -> None:
    entries = [("20260102T000000Z_gpu_a", NOW), ("20260102T000000Z_gpu_a_2", NOW)]
    assert plan_prune(entries, max_count=1, max_age_days=0, now_s=NOW) == (
        "20260102T000000Z_gpu_a",
    )


def test_snapshot_time_from_name() -> None:
    assert snapshot_time_s("20260102T101113Z_gpu_KSampler") == samples.T0 + 1 - 0.25
    assert snapshot_time_s("20261399T000000Z_gpu_x") is None
    assert snapshot_time_s("notes") is None


def test_prune_removes_dirs_and_rows_and_keeps_the_newest(tmp_path: Path) -> None:
    snaps = tmp_path / "snapshots"
    refs = []
    with Store.open(tmp_path) as store:
        for i in range(6):  # one per day, oldest first
            content = samples.content(at=samples.T0 + i * DAY)
            ref = write_snapshot(snaps, content)
            store.save_incident(IncidentRow.from_incident(content.incident, ref.id))
            refs.append(ref)
        (snaps / "my-notes").mkdir()  # not ours: never touched
        (snaps / "README.txt").write_text("mine")
        now = samples.T0 + 5 * DAY + 10
        removed = prune_snapshots(snaps, max_count=4, max_age_days=3.5, now_s=now, store=store)
        assert sorted(removed) == sorted(r.id for r in refs[:2])
        assert sorted(os.listdir(snaps)) == sorted(
            [r.id for r in refs[2:]] + ["my-notes", "README.txt"]
        )
        assert sorted(r.snapshot_id or "" for r in store.incidents()) == sorted(
            r.id for r in refs[2:]
        )
        # far in the future everything is too old, but the newest stays
        removed = prune_snapshots(
            snaps, max_count=4, max_age_days=1, now_s=now + 100 * DAY, store=store
        )
        assert sorted(removed) == sorted(r.id for r in refs[2:5])
        assert [r.snapshot_id for r in store.incidents()] == [refs[5].id]
    assert sorted(os.listdir(snaps)) == sorted([refs[5].id, "my-notes", "README.txt"])


def test_prune_without_store_or_snapshots_is_harmless(tmp_path: Path) -> None:
    assert prune_snapshots(tmp_path / "none", max_count=1, max_age_days=1, now_s=NOW) == ()
    write_snapshot(tmp_path, samples.content())
    write_snapshot(tmp_path, samples.content(at=samples.T0 + 5))
    assert len(prune_snapshots(tmp_path, max_count=1, max_age_days=0, now_s=NOW)) == 1
    assert len(os.listdir(tmp_path)) == 1

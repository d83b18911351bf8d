"""The exactly-once probe: real OOM records appended to a followed log, rotated the way
ComfyUI-Manager does at every ComfyUI start (comfyui-facts §3.4: ``comfyui.prev2.log`` deleted,
``.prev.log`` → ``.prev2.log``, ``comfyui.log`` → ``.prev.log``, a new ``comfyui.log``), and the
real daemon process killed with SIGKILL at random moments -- in a storm, in a backlog, anywhere.
Then every failure written must be counted by exactly one incident, once.

Used by ``tests/test_exactly_once.py`` (240 failures) and ``benchmarks/exactly_once.py`` (1,000).

Ground truth: failure *i* is one CUDA OOM (``cuda_oom_record``: the ``!!!`` line, the traceback,
``Got an OOM``) stamped with its own log time. The store's ``incident_records`` says which
incident counted each log record, at which record time; that maps back to the failure. A
failure none counted is *lost*; one counted by two incidents, or an incident whose count is
more than the failures it holds, is *duplicated*.

The one rule the writer keeps, because no follower can do better (logtail.py's limits): a
rotation that would delete ``.prev2.log`` waits until the daemon's saved position has left that
file -- Manager rotates at ComfyUI's start, which takes longer than the daemon takes to read.
"""

from __future__ import annotations

import bisect
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from tests.daemon_harness import Daemon, cuda_oom_record, noise_lines

__all__ = ["StressFigures", "run_stress"]

#: log time between two failures: longer than the tracker's repeat gap, shorter than its window
FAILURE_GAP_S = 3.0
#: storm window of the daemon under test (log time): a jump of more starts a new incident
STORM_WINDOW_S = 60


@dataclass
class StressFigures:
    records: int = 0
    kills: int = 0
    kills_in_storm: int = 0
    kills_in_backlog: int = 0
    rotations: int = 0
    starts: int = 0
    incidents: int = 0
    #: one per storm written (a jump past the storm window starts the next)
    expected_incidents: int = 0
    snapshots: int = 0
    counted: int = 0
    lost: int = 0
    duplicated: int = 0
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"records {self.records}, kill -9 {self.kills} (in a storm {self.kills_in_storm}, "
            f"in a backlog {self.kills_in_backlog}), rotations {self.rotations}, "
            f"daemon starts {self.starts}, incidents {self.incidents} (storms written "
            f"{self.expected_incidents}), snapshots "
            f"{self.snapshots}, sum of counts {self.counted}, lost {self.lost}, duplicated "
            f"{self.duplicated}, {self.elapsed_s:.1f} s"
        )


class _Writer:
    """Appends failures to the live log and rotates like Manager."""

    def __init__(self, live: Path) -> None:
        self.live = live
        self.prev = live.with_name(live.stem + ".prev.log")
        self.prev2 = live.with_name(live.stem + ".prev2.log")
        live.write_text("")

    def append(self, text: str) -> None:
        with open(self.live, "a", encoding="utf-8") as fh:
            fh.write(text)

    def rotate(self) -> None:
        if self.prev2.exists():
            self.prev2.unlink()
        if self.prev.exists():
            os.rename(self.prev, self.prev2)
        os.rename(self.live, self.prev)
        self.live.write_text("")


def _db(data_dir: Path) -> sqlite3.Connection | None:
    path = data_dir / "oom-sentinel.db"
    if not path.exists():
        return None
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)


def _cursor_inode(data_dir: Path) -> int | None:
    conn = _db(data_dir)
    if conn is None:
        return None
    try:
        row = conn.execute("SELECT ino FROM log_offsets").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return int(row[0]) if row else None


def _counted(data_dir: Path) -> int:
    conn = _db(data_dir)
    if conn is None:
        return 0
    try:
        row = conn.execute("SELECT coalesce(sum(count), 0) FROM incidents").fetchone()
    except sqlite3.Error:
        return 0
    finally:
        conn.close()
    return int(row[0])


def run_stress(
    tmp: Path,
    *,
    records: int = 240,
    kills: int = 10,
    seed: int = 11,
    say: Callable[[str], None] = lambda _: None,
) -> StressFigures:
    """Write ``records`` failures with rotations every few and ``kills`` SIGKILLs; measure."""
    rng = random.Random(seed)
    started = time.monotonic()
    figures = StressFigures(records=records)
    live = tmp / "user" / "comfyui.log"
    live.parent.mkdir(parents=True)
    writer = _Writer(live)
    config = (
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 200\n"
        f"[incidents]\nstorm_window_s = {STORM_WINDOW_S}\n"
    )
    daemon = Daemon(tmp, logs=[live], config=config)

    def start() -> None:
        daemon.start(timeout_s=60.0)
        figures.starts += 1

    def kill(kind: str) -> None:
        daemon.stop(signal.SIGKILL)
        figures.kills += 1
        if kind == "storm":
            figures.kills_in_storm += 1
        elif kind == "backlog":
            figures.kills_in_backlog += 1
        say(f"kill -9 #{figures.kills} ({kind}) after failure {written}")

    def kill_in_backlog(expected: int) -> None:
        # Spawn without waiting for the ready line (the first poll works through the backlog
        # before it), and kill once the store shows the backlog being counted.
        before = _counted(daemon.data_dir)
        daemon.spawn()
        figures.starts += 1
        deadline = time.monotonic() + 60.0
        while _counted(daemon.data_dir) == before and time.monotonic() < deadline:
            if not alive():
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        during = _counted(daemon.data_dir) < expected
        kill("backlog" if during else "random")

    def alive() -> bool:
        return daemon.proc is not None and daemon.proc.poll() is None

    def rotate() -> None:
        # Deleting .prev2.log is safe once the saved position has left it.
        if writer.prev2.exists():
            doomed = writer.prev2.stat().st_ino
            if not alive():
                start()
            deadline = time.monotonic() + 60.0
            while _cursor_inode(daemon.data_dir) == doomed:
                if time.monotonic() > deadline:
                    figures.problems.append("the saved position stayed on .prev2.log for 60 s")
                    break
                time.sleep(0.02)
        writer.rotate()
        figures.rotations += 1

    # Failure times: 3 s apart, with a jump past the storm window (a new incident) every
    # 20-60 failures -- and every 2-6 inside the backlogs below, so that working one through
    # writes several snapshots and a kill can land in the middle of it.
    times: list[datetime] = []
    clock = {"at": datetime(2026, 11, 30, 10, 0, 0), "jump": rng.randint(20, 60)}

    def failure(backlog: bool = False) -> str:
        """The next failure's lines (a few progress lines before it)."""
        if not times:
            figures.expected_incidents = 1
        if clock["jump"] <= 0:
            figures.expected_incidents += 1
            clock["at"] += timedelta(seconds=STORM_WINDOW_S * 3)
            clock["jump"] = rng.randint(2, 6) if backlog else rng.randint(20, 60)
        clock["jump"] -= 1
        at = clock["at"]
        clock["at"] = at + timedelta(seconds=FAILURE_GAP_S)
        times.append(at)
        return noise_lines(at, rng.randint(0, 3)) + cuda_oom_record(at)

    # Kill plan: about evenly spread (in failures written), every third one after a backlog
    # written while the daemon was down.
    gap = max(2, records // (kills + 2))
    next_kill = rng.randint(gap // 2, gap)
    planned = 0
    next_rotation = rng.randint(2, 6)
    start()
    written = 0
    try:
        while written < records:
            if written >= next_kill and planned < kills and planned % 3 == 2 and alive():
                # Down for a while: a backlog piles up (with a rotation in it), then the restart
                # works through it and is killed in the middle.
                kill("storm" if written and rng.random() < 0.5 else "random")
                planned += 2
                next_kill = written + rng.randint(gap // 2, gap * 3 // 2)
                burst = rng.randint(gap, 2 * gap)
                for _ in range(min(burst, records - written)):
                    writer.append(failure(backlog=True))
                    written += 1
                    if written >= next_rotation and (
                        not writer.prev2.exists()
                        or _cursor_inode(daemon.data_dir) != writer.prev2.stat().st_ino
                    ):
                        writer.rotate()
                        figures.rotations += 1
                        next_rotation = written + rng.randint(2, 6)
                kill_in_backlog(written)
                start()
                continue
            writer.append(failure())
            written += 1
            if written >= next_kill and planned < kills and planned % 3 != 2:
                planned += 1
                next_kill = written + rng.randint(gap // 2, gap * 3 // 2)
                time.sleep(rng.uniform(0.0, 0.3))
                kill("storm")
                start()
            if written >= next_rotation:
                rotate()
                next_rotation = written + rng.randint(2, 6)
            time.sleep(rng.uniform(0.0, 0.03))
        while figures.kills < kills:  # the plan ran out of failures: kill while it settles
            if not alive():
                start()
            time.sleep(rng.uniform(0.0, 0.3))
            kill("random")
        if not alive():
            start()
        deadline = time.monotonic() + 120.0
        while _counted(daemon.data_dir) < records and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # anything late (a duplicate) would land now
    finally:
        if alive():
            daemon.stop()
    figures.elapsed_s = time.monotonic() - started
    _measure(daemon.data_dir, times, figures)
    if "Traceback" in daemon.all_stderr():
        figures.problems.append("the daemon logged a traceback")
    return figures


def _measure(data_dir: Path, times: list[datetime], figures: StressFigures) -> None:
    starts = [t.timestamp() for t in times]
    conn = _db(data_dir)
    assert conn is not None, "the daemon made no store"
    try:
        incidents = conn.execute("SELECT id, snapshot_id, count FROM incidents").fetchall()
        rows = conn.execute("SELECT incident_id, at_s FROM incident_records").fetchall()
    finally:
        conn.close()
    figures.incidents = len(incidents)
    figures.counted = sum(int(c) for _, _, c in incidents)
    snapshots = data_dir / "snapshots"
    names = {p.name for p in snapshots.iterdir() if p.is_dir() and not p.name.startswith(".")}
    figures.snapshots = len(names)
    for incident_id, snapshot_id, _ in incidents:
        if snapshot_id not in names:
            figures.problems.append(f"incident {incident_id} has no snapshot on disk")
    if len(names) != len(incidents):
        figures.problems.append(f"{len(names)} snapshots for {len(incidents)} incidents")
    holders: dict[int, set[str]] = {}
    per_incident: dict[str, set[int]] = {}
    for incident_id, at_s in rows:
        i = bisect.bisect_right(starts, float(at_s) + 1e-3) - 1
        if i < 0 or float(at_s) - starts[i] > FAILURE_GAP_S:
            figures.problems.append(f"a counted record at {at_s} matches no failure written")
            continue
        holders.setdefault(i, set()).add(incident_id)
        per_incident.setdefault(incident_id, set()).add(i)
    figures.lost = sum(1 for i in range(len(times)) if i not in holders)
    extra_holders = sum(len(h) - 1 for h in holders.values())
    over_counted = sum(
        max(0, int(count) - len(per_incident.get(incident_id, ())))
        for incident_id, _, count in incidents
    )
    figures.duplicated = extra_holders + over_counted

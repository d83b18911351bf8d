"""``oom-sentinel run`` as a real process: logs in, snapshots out, exactly once."""

from __future__ import annotations

import os
import shutil
import signal
import stat
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from daemon_harness import (
    Daemon,
    append,
    cuda_oom_record,
    load_snapshot_json,
    noise_lines,
    snapshot_dirs,
    wait_for,
    wait_snapshots,
)

T0 = datetime(2026, 11, 30, 10, 0, 0)

pytestmark = pytest.mark.timeout(120)


def test_an_oom_record_becomes_one_complete_private_snapshot(tmp_path: Path) -> None:
    log = tmp_path / "user" / "comfyui.log"
    log.parent.mkdir()
    log.write_text(noise_lines(T0, 5))
    daemon = Daemon(tmp_path, logs=[log]).start()
    try:
        append(log, noise_lines(T0 + timedelta(seconds=1), 250))
        append(log, cuda_oom_record(T0 + timedelta(seconds=2), requested_gib=2.0))
        (snap,) = wait_snapshots(daemon, 1)
        data = load_snapshot_json(snap)
        assert data["schema_version"] == 1
        assert data["event"]["pool"] == "gpu"
        assert data["event"]["backend"] == "cuda"
        assert data["event"]["requested_bytes"] == 2 * 1024**3
        assert data["event"]["exception_type"] == "torch.OutOfMemoryError"
        assert data["advice"], "advice is part of every snapshot"
        assert data["memory"] is not None and data["memory"]["host"]["ram_total_bytes"] > 0
        assert data["host"]["python"]
        log_txt = (snap / "log.txt").read_text()
        assert "!!! Exception during processing !!!" in log_txt
        assert log_txt.count("loaded completely") >= 199  # the lines before the record
        assert (snap / "timeline.csv").read_text().startswith("time_utc,time_s")
        assert stat.S_IMODE(snap.stat().st_mode) == 0o700
        for f in snap.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    finally:
        assert daemon.stop() == 0


def test_records_written_just_before_a_manager_rotation_are_not_missed(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    log = user / "comfyui.log"
    log.write_text(noise_lines(T0, 3))
    daemon = Daemon(tmp_path, logs=[log]).start()
    try:
        # ComfyUI crashed right after this record, and Manager rotated at the next start.
        append(log, cuda_oom_record(T0 + timedelta(minutes=1)))
        os.rename(log, user / "comfyui.prev.log")
        log.write_text(noise_lines(T0 + timedelta(minutes=2), 3))
        (snap,) = wait_snapshots(daemon, 1)
        assert load_snapshot_json(snap)["event"]["pool"] == "gpu"
        # and the new file is followed from its start
        append(log, cuda_oom_record(T0 + timedelta(minutes=20)))
        wait_snapshots(daemon, 2)
    finally:
        daemon.stop()


def test_copy_truncate_is_followed_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "comfyui.log"
    log.write_text(noise_lines(T0, 50))
    daemon = Daemon(tmp_path, logs=[log]).start()
    try:
        wait_for(lambda: "following" in daemon.stderr(), what="follow line")
        shutil.copy(log, tmp_path / "comfyui.log.1")
        with open(log, "r+") as fh:
            fh.truncate(0)
        append(log, cuda_oom_record(T0 + timedelta(minutes=5)))
        (snap,) = wait_snapshots(daemon, 1)
        assert load_snapshot_json(snap)["event"]["requested_bytes"] == 2 * 1024**3
    finally:
        daemon.stop()


def test_kill_9_between_records_captures_every_incident_exactly_once(tmp_path: Path) -> None:
    log = tmp_path / "comfyui.log"
    log.write_text("")
    # each failure a separate incident: records are 10 minutes apart, storm window 1 minute
    config = (
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
        "[incidents]\nstorm_window_s = 60\n"
    )
    n = 4
    for i in range(n):
        daemon = Daemon(tmp_path, logs=[log], config=config).start()
        try:
            append(log, cuda_oom_record(T0 + timedelta(minutes=10 * i), requested_gib=1.0 + i))
            if i % 2 == 0:
                wait_snapshots(daemon, i + 1)  # handled, then killed
        finally:
            daemon.kill9()  # odd rounds: killed before (or while) it handled the record
    daemon = Daemon(tmp_path, logs=[log], config=config).start()
    try:
        snaps = wait_snapshots(daemon, n)
        requested = sorted(load_snapshot_json(s)["event"]["requested_bytes"] for s in snaps)
        assert requested == [int((1.0 + i) * 1024**3) for i in range(n)]
        # nothing more arrives: restart once more, no duplicate
    finally:
        daemon.stop()
    daemon = Daemon(tmp_path, logs=[log], config=config).start()
    try:
        append(log, noise_lines(T0 + timedelta(hours=2), 3))
        wait_for(lambda: "status" in os.listdir(tmp_path / "data") or True)
    finally:
        daemon.stop()
    assert len(snapshot_dirs(tmp_path / "data")) == n


def test_sigterm_and_sigint_stop_it_cleanly(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        daemon = Daemon(tmp_path).start()
        assert daemon.stop(sig) == 0
        assert "Traceback" not in daemon.stderr()


def test_without_any_install_it_keeps_running_and_says_what_it_waits_for(tmp_path: Path) -> None:
    # processes off: stand-ins of other tests on this machine must not count as found
    config = "[discovery]\nprocesses = false\n[logs]\npoll_interval_ms = 500\n"
    daemon = Daemon(tmp_path, config=config).start()
    try:
        # logged just after the ready line the harness waits for
        try:
            wait_for(lambda: "no ComfyUI install found yet" in daemon.stderr(), what="the hint")
        except AssertionError as exc:  # e.g. another ComfyUI running on this machine
            raise AssertionError(f"{exc}; the daemon said:\n{daemon.stderr()}") from None
        # an install that appears later is picked up by discovery: see test_daemon_discovery
    finally:
        assert daemon.stop() == 0


def test_a_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, config="[[instances]]\nport = 0\n")
    import subprocess

    proc = subprocess.run(daemon.args, env=daemon.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("instances[0].port: must be 1..65535, got 0")
    assert "Traceback" not in proc.stderr

"""Bounded evidence (issue 11, item 9): log context limited in bytes, UTF-16 logs decoded,
corrupt compressed files and deeply nested JSON one-line input errors (exit 3)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from daemon_harness import Daemon, append, cuda_oom_record, snapshot_dirs, wait_for

T0 = datetime(2026, 11, 30, 10, 0, 0)
CONFIG = "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 200\n"


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp / ".config")}
    env.pop("OOM_SENTINEL_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.timeout(180)
def test_a_huge_log_line_does_not_make_huge_snapshots(tmp_path: Path) -> None:
    log = tmp_path / "comfyui.log"
    log.write_text("")
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    try:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write("x" * (50 * 1024 * 1024) + "\n")
        append(log, cuda_oom_record(T0))
        append(log, cuda_oom_record(T0 + timedelta(minutes=10)))
        snaps = wait_for(
            lambda: len(snapshot_dirs(daemon.data_dir)) >= 2 and snapshot_dirs(daemon.data_dir),
            120,
            "2 snapshots",
        )
    finally:
        daemon.stop()
    for snap in snaps:
        size = sum(p.stat().st_size for p in snap.iterdir())
        assert size < 1024 * 1024, f"{snap.name}: {size} bytes"
        text = (snap / "log.txt").read_text("utf-8")
        assert "CUDA out of memory" in text
    assert "characters cut" in (snaps[0] / "log.txt").read_text("utf-8")


def test_diagnose_on_a_corrupt_gzip_file_is_one_line_and_exit_3(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(cuda_oom_record(T0).encode() * 50))
    for i in range(20, 60):
        data[i] ^= 0x55
    path = tmp_path / "comfyui.prev.log.gz"
    path.write_bytes(bytes(data))
    proc = _cli(tmp_path, "diagnose", str(path))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert str(path) in proc.stderr and "gzip" in proc.stderr


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"custom_nodes": ' + '{"a": ' * 500 + "1" + "}" * 501],
    ids=["deeper-than-the-parser", "deeper-than-the-reader"],
)
def test_states_show_on_deeply_nested_json_is_one_line_and_exit_3(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "snapshot.json"
    path.write_text(text)
    proc = _cli(tmp_path, "states", "show", str(path))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert str(path) in proc.stderr and "nested" in proc.stderr


def _utf16_log(bom: bool) -> bytes:
    text = cuda_oom_record(T0).replace("\n", "\r\n")  # PowerShell 5 writes CRLF
    return ("\ufeff" if bom else "").encode("utf-16-le") + text.encode("utf-16-le")


@pytest.mark.parametrize("bom", [True, False], ids=["bom", "detected"])
def test_diagnose_reads_a_utf16_log(tmp_path: Path, bom: bool) -> None:
    path = tmp_path / "comfyui.log"
    path.write_bytes(_utf16_log(bom))
    proc = _cli(tmp_path, "diagnose", "--json", str(path))
    assert proc.returncode == 1, proc.stderr  # 1: an OOM was found
    assert '"pool": "gpu"' in proc.stdout and "2147483648" in proc.stdout


@pytest.mark.timeout(120)
def test_the_daemon_reads_a_utf16_log(tmp_path: Path) -> None:
    log = tmp_path / "comfyui.log"
    log.write_bytes("\ufeffstarting\r\n".encode("utf-16-le"))
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    try:
        with open(log, "ab") as fh:
            fh.write(_utf16_log(bom=False))
        snaps = wait_for(lambda: snapshot_dirs(daemon.data_dir), 30, "a snapshot")
    finally:
        daemon.stop()
    text = (snaps[0] / "log.txt").read_text("utf-8")
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in text and "\x00" not in text


def test_utf16_lines_are_cut_at_aligned_newlines_across_any_chunking() -> None:
    from oom_sentinel.daemon.logs.tail import LineSplitter
    from oom_sentinel.daemon.logs.textenc import detect_encoding

    lines = ["\ufeffone", "zwei \u0a0a", "three"]  # U+0A0A holds the bytes of "\n\n"
    data = "\r\n".join(lines).encode("utf-16-le") + "\r\n".encode("utf-16-le")
    assert detect_encoding(data) == "utf-16-le"
    for chunk in (1, 3, 7, len(data)):
        sp = LineSplitter(0, encoding="utf-16-le")
        got = []
        for i in range(0, len(data), chunk):
            got += sp.feed(data[i : i + chunk])
        assert [raw.decode("utf-16-le") for raw, _, _ in got] == lines
        assert got[-1][2] == len(data) and [s for _, s, _ in got][1:] == [e for _, _, e in got][:-1]


def test_snapshots_show_on_a_deeply_nested_snapshot_is_one_line_and_exit_3(tmp_path: Path) -> None:
    snap = tmp_path / "20260102T101112Z_gpu_deep"
    snap.mkdir()
    (snap / "snapshot.json").write_text(
        '{"schema_version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    proc = _cli(tmp_path, "snapshots", "show", str(snap))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "nested too deeply" in proc.stderr

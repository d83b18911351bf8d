"""The sharded test command (``--shards`` / ``--shard`` in conftest.py): every test
runs in exactly one shard, so a sharded run is the whole suite, once."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT, _shard_of_files

FILES = ["tests/test_advice.py", "tests/test_alerts.py", "tests/test_alerts_format.py"]


def _collected(*args: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {ln for ln in out.stdout.splitlines() if "::" in ln}


def test_the_shards_split_the_files_and_together_are_the_whole_run() -> None:
    whole = _collected(*FILES)
    parts = [_collected(f"--shard={i}/2", *FILES) for i in range(2)]
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    assert parts[0] | parts[1] == whole
    files = [{node.split("::")[0] for node in part} for part in parts]
    assert not files[0] & files[1]  # whole files: a module's fixtures are set up in one shard


def test_longest_files_go_first_onto_the_least_loaded_shard() -> None:
    shard = _shard_of_files(["tests/test_bisect_e2e.py", "tests/test_advice.py", "x.py"], 2)
    assert set(shard.values()) == {0, 1}
    assert shard["tests/test_bisect_e2e.py"] != shard["tests/test_advice.py"]


def test_a_bad_shard_is_a_usage_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--shard=2/2", FILES[0]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 4 and "expected I/N with 0 <= I < N" in out.stderr


def test_shards_run_every_test_once_and_report_each_shard() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--shards=2", *FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OOM_SENTINEL_TEST_SHARDS": ""},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "===== shard 1/2 (exit 0) =====" in out.stdout
    counts = [int(m) for m in re.findall(r"(\d+) passed", out.stdout)]
    assert sum(counts) == len(_collected(*FILES))

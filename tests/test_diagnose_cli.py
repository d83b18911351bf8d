"""``oom-sentinel diagnose``: the real command in a subprocess, on the corpus, dumps, stdin, gzip,
unreadable files; exit statuses and the documented JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from corpus_score import KNOWN_MISSES, label_value, split_of

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "corpus"
#: the corpus' tune part: like test_classify_corpus, this holds diagnose to the labels of the
#: part the classifier is tuned on; the held-out part is only scored (tests/corpus_score.py),
#: or a held-out miss would have to be fixed, which is tuning on it
CASES: list[dict[str, Any]] = [
    case
    for case in tomllib.loads((CORPUS / "labels.toml").read_text(encoding="utf-8"))["case"]
    if split_of(case) == "tune" and case["file"] not in KNOWN_MISSES
]

DOCUMENTED = {
    "source",
    "line",
    "pool",
    "backend",
    "recovered",
    "count",
    "node_type",
    "node_id",
    "exception_type",
    "requested_bytes",
    "total_bytes",
    "free_bytes",
    "allocated_bytes",
    "reserved_unallocated_bytes",
    "reserved_bytes",
    "process_used_bytes",
    "other_processes",
    "other_process_named",
    "gpu_index",
    "mps_allocated_bytes",
    "mps_other_bytes",
    "mps_max_allowed_bytes",
    "killer",
    "killed_pid",
    "message",
    "rule",
    "timestamp",
    "extra",
    "advice",
    "advice_keys",
}


def _run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "diagnose", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


def _json(proc: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    return json.loads(proc.stdout.decode("utf-8"))


@pytest.fixture(scope="module")
def corpus_run() -> tuple[int, list[dict[str, Any]]]:
    proc = _run("--json", *[str(CORPUS / case["file"]) for case in CASES])
    assert proc.stderr == b""
    return proc.returncode, _json(proc)


def test_json_over_the_whole_corpus_matches_every_label(
    corpus_run: tuple[int, list[dict[str, Any]]],
) -> None:
    code, events = corpus_run
    assert code == 1
    for case in CASES:
        got = [e for e in events if Path(e["source"]).name == case["file"]]
        labels = case.get("event", [])
        assert len(got) == len(labels), case["file"]
        for event, label in zip(got, labels, strict=True):
            assert set(event) == DOCUMENTED
            assert (event["line"], event["pool"], event["backend"], event["recovered"]) == (
                label["line"],
                label["pool"],
                label["backend"],
                label["recovered"],
            )
            for key in (
                "requested_bytes",
                "total_bytes",
                "free_bytes",
                "allocated_bytes",
                "reserved_unallocated_bytes",
            ):
                assert event[key] == label_value(label, key), (case["file"], key)
            assert event["other_processes"] == label.get("other_processes", [])
            assert event["node_type"] == label.get("node_type") and event[
                "exception_type"
            ] == label.get("exception_type")
            assert event["advice"] and all(isinstance(a, str) and a for a in event["advice"])


@pytest.mark.parametrize("case", CASES, ids=[c["file"].removesuffix(".txt") for c in CASES])
def test_exit_status_is_one_exactly_when_a_failure_is_found(case: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from oom_sentinel.daemon.cli.main import main

    result = CliRunner().invoke(main, ["diagnose", str(CORPUS / case["file"])])
    failures = [e for e in case.get("event", []) if not e["recovered"]]
    assert result.exit_code == (1 if failures else 0), result.output
    if not case.get("event"):
        assert "No out-of-memory event found in 1 file." in result.output


def test_human_output_shows_pool_human_units_node_and_numbered_advice() -> None:
    proc = _run(str(CORPUS / "rocm_hip_error_report.txt"))
    out = proc.stdout.decode("utf-8")
    assert proc.returncode == 1
    assert (
        "rocm_hip_error_report.txt:18  OOM failure · GPU memory (rocm) · node KSampler #3 · torch.OutOfMemoryError"
        in out
    )
    assert (
        "requested 6.46 GiB · capacity 23.92 GiB · free 3.35 GiB · allocated by PyTorch 16.97 GiB · reserved but unallocated 127.91 MiB"
        in out
    )
    assert "    1. Lower the resolution in KSampler" in out
    assert out.rstrip().endswith("2 OOM failures, 0 recovered soft OOMs in 1 file.")


def test_recovered_soft_ooms_alone_exit_zero() -> None:
    proc = _run(str(CORPUS / "soft_oom_split_attention_storm.txt"))
    assert proc.returncode == 0
    assert "soft OOM, recovered ×18" in proc.stdout.decode()


def test_stdin_is_read_with_a_dash() -> None:
    text = (CORPUS / "ram_numpy_gib.txt").read_bytes()
    proc = _run("--json", "-", stdin=text)
    assert proc.returncode == 1
    (event,) = _json(proc)
    assert (event["source"], event["pool"], event["requested_bytes"]) == (
        "-",
        "ram",
        round(28.3 * 1024**3),
    )


def _entries(text: str, stamp: str = "2025-01-17T01:27:13.751046") -> list[dict[str, str]]:
    """Split text into writes as ComfyUI's ring buffer holds them (a print is text + newline)."""
    entries: list[dict[str, str]] = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        if line.startswith("  ") and entries:  # traceback bodies arrive in the same write
            entries[-1]["m"] += line
            continue
        entries.append({"t": stamp, "m": body})
        if line.endswith("\n"):
            entries.append({"t": stamp, "m": "\n"})
    return entries


@pytest.mark.parametrize("form", ["entries", "json-string", "entries-list"])
def test_internal_logs_dumps_are_read_in_both_forms(tmp_path: Path, form: str) -> None:
    text = (
        "got prompt\n"
        "!!! Exception during processing !!! Allocation on device \n"
        "Traceback (most recent call last):\n"
        '  File "/c/execution.py", line 327, in execute\n'
        "torch.OutOfMemoryError: Allocation on device \n"
        "\n"
        "Got an OOM, unloading all loaded models.\n"
        "Prompt executed in 3.14 seconds\n"
    )
    dump = tmp_path / "logs.json"
    if form == "entries":
        dump.write_text(json.dumps({"entries": _entries(text), "size": None}), encoding="utf-8")
    elif form == "entries-list":
        dump.write_text(json.dumps(_entries(text)), encoding="utf-8")
    else:
        dump.write_text(json.dumps(text), encoding="utf-8")
    proc = _run("--json", str(dump))
    assert proc.returncode == 1, proc.stderr
    (event,) = _json(proc)
    assert (event["pool"], event["backend"], event["line"]) == ("gpu", "cuda", 2)
    assert event["extra"] == {"comfy_unloaded_models": True}
    if form != "json-string":
        assert event["timestamp"] == "2025-01-17T01:27:13.751046"


def test_a_json_file_that_is_no_dump_is_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "odd.log"
    path.write_text(
        '{"not": "a dump"}\nRuntimeError: CUDA error: out of memory\n', encoding="utf-8"
    )
    proc = _run("--json", str(path))
    assert proc.returncode == 1 and _json(proc)[0]["line"] == 2


def test_gzip_rotated_logs_are_read(tmp_path: Path) -> None:
    path = tmp_path / "comfyui.prev.log.gz"
    path.write_bytes(gzip.compress((CORPUS / "mps_gib.txt").read_bytes()))
    proc = _run("--json", str(path))
    assert proc.returncode == 1
    assert _json(proc)[0]["pool"] == "unified-mps"


@pytest.mark.parametrize("bad", ["missing.log", "a-directory"], ids=["missing", "directory"])
def test_an_unreadable_file_is_one_line_and_exit_three(tmp_path: Path, bad: str) -> None:
    (tmp_path / "a-directory").mkdir()
    good = CORPUS / "mps_gib.txt"
    proc = _run(str(good), str(tmp_path / bad))
    assert proc.returncode == 3
    assert proc.stdout == b""  # nothing printed before the check
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oom-sentinel: error: ") and bad in lines[0]
    assert "Traceback" not in proc.stderr.decode()


def test_a_truncated_gzip_file_is_exit_three(tmp_path: Path) -> None:
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress(b"x\n" * 100_000)[:200])
    proc = _run(str(path))
    assert proc.returncode == 3 and b"cannot read" in proc.stderr


def test_a_large_generated_log_is_streamed(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    block = (
        b"[2026-01-02 10:11:12.345] loaded partially; 2419.36 MB usable, 2340.83 MB loaded, 263.30 MB offloaded\n"
        * 999
        + b"[2026-01-02 10:11:13.000] Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.\n"
    )
    with path.open("wb") as f:
        for _ in range(300):  # ~30 MB, 300 soft OOMs far apart
            f.write(block)
        f.write(b"[2026-01-02 10:11:14.000] Got an OOM, unloading all loaded models.\n")
    proc = _run("--json", str(path))
    events = _json(proc)
    assert proc.returncode == 1
    assert [e["recovered"] for e in events].count(True) == 300
    assert events[-1]["line"] == 300_001 and events[-1]["pool"] == "gpu"


def test_a_manager_log_starting_with_a_bracket_is_scanned_as_text(tmp_path: Path) -> None:
    path = tmp_path / "comfyui.log"
    path.write_text(
        "[2026-01-02 10:11:12.345] got prompt\n"
        "[2026-01-02 10:11:13.000] !!! Exception during processing !!! Allocation on device \n"
        "[2026-01-02 10:11:13.001] Traceback (most recent call last):\n"
        '  File "/c/execution.py", line 327, in execute\n'
        "torch.OutOfMemoryError: Allocation on device \n"
        "\n"
        "[2026-01-02 10:11:13.003] Got an OOM, unloading all loaded models.\n"
        "[2026-01-02 10:11:13.004] Prompt executed in 3.14 seconds\n",
        encoding="utf-8",
    )
    proc = _run("--json", str(path))
    (event,) = _json(proc)
    assert (event["line"], event["timestamp"], event["exception_type"]) == (
        2,
        "2026-01-02 10:11:13.000",
        "torch.OutOfMemoryError",
    )
    assert event["extra"] == {"comfy_unloaded_models": True}

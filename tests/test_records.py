"""Line prefixes and record assembly: what a record is, where it ends, how much it may hold."""

from __future__ import annotations

import io
import tracemalloc

import pytest

from oom_sentinel.daemon.classify import scan_stream
from oom_sentinel.daemon.logs.prefix import split_prefix, strip_prefix
from oom_sentinel.daemon.logs.records import Record, RecordAssembler

# -- prefixes -------------------------------------------------------------------------------------

PREFIX_TABLE = [
    ("[2026-01-02 10:11:12.345] got prompt", "2026-01-02 10:11:12.345", "got prompt", True),
    ("[2026-01-02 10:11] got prompt", "2026-01-02 10:11", "got prompt", True),
    ("2025-04-27T21:57:57.289009 - got prompt", "2025-04-27T21:57:57.289009", "got prompt", True),
    ("[2025-03-28 01:40:15.296] [info]  got prompt", "2025-03-28 01:40:15.296", "got prompt", True),
    (
        "2024-12-16 17:10:56,767 - root - ERROR - !!! Exception",
        "2024-12-16 17:10:56,767",
        "!!! Exception",
        True,
    ),
    (
        "ERROR:root:Traceback (most recent call last):",
        None,
        "Traceback (most recent call last):",
        True,
    ),
    ("[INFO] Prompt executed in 138.19 seconds", None, "Prompt executed in 138.19 seconds", True),
    ("[2026-01-02 10:11:12.345] [INFO] got prompt", "2026-01-02 10:11:12.345", "got prompt", True),
    ("\x1b[32m[INFO]\x1b[0m setup plugin alembic", None, "setup plugin alembic", True),
    (
        "May 15 23:09:27 host kernel: [  514.682838] Memory cgroup",
        "May 15 23:09:27",
        "Memory cgroup",
        False,
    ),
    (
        "comfyui     | /home/scripts/entrypoint.sh: line 42",
        None,
        "/home/scripts/entrypoint.sh: line 42",
        False,
    ),
    (
        '  File "execution.py", line 327, in execute',
        None,
        '  File "execution.py", line 327, in execute',
        False,
    ),
    ("[Previous line repeated 3 more times]", None, "[Previous line repeated 3 more times]", False),
    (
        "| Allocated memory      |  11515 MiB |",
        None,
        "| Allocated memory      |  11515 MiB |",
        False,
    ),
    ("", None, "", False),
]


@pytest.mark.parametrize(
    ("line", "timestamp", "message", "starts"),
    PREFIX_TABLE,
    ids=[f"p{i}" for i in range(len(PREFIX_TABLE))],
)
def test_prefixes_are_stripped_and_say_whether_a_record_starts(
    line: str, timestamp: str | None, message: str, starts: bool
) -> None:
    assert strip_prefix(line) == (timestamp, message)
    assert split_prefix(line).starts_record is starts


# -- assembly -------------------------------------------------------------------------------------


def _assemble(lines: list[str]) -> list[Record]:
    assembler = RecordAssembler()
    out: list[Record] = []
    offset = 0
    for line in lines:
        size = len(line.encode()) + 1
        out += assembler.feed(line, offset, offset + size)
        offset += size
    return out + assembler.flush()


def test_manager_traceback_is_one_record_with_its_bare_continuation_lines() -> None:
    records = _assemble(
        [
            "[2026-01-02 10:11:13.000] !!! Exception during processing !!! Allocation on device ",
            "[2026-01-02 10:11:13.001] Traceback (most recent call last):",
            '  File "/c/execution.py", line 327, in execute',
            "    output_data = get_output_data(obj)",
            "torch.OutOfMemoryError: Allocation on device ",
            "",
            "[2026-01-02 10:11:13.003] Got an OOM, unloading all loaded models.",
        ]
    )
    assert [r.line_no for r in records] == [1, 2, 7]
    assert [r.line_count for r in records] == [1, 5, 1]
    assert records[1].text.endswith("Allocation on device \n") and records[1].text.startswith(
        "[2026-01-02 10:11:13.001] Traceback"
    )
    assert records[1].timestamp == "2026-01-02 10:11:13.001"


def test_bare_console_keeps_header_traceback_and_exception_line_together() -> None:
    records = _assemble(
        [
            "got prompt",
            "!!! Exception during processing !!! CUDA error: out of memory",
            "CUDA kernel errors might be asynchronously reported at some other API call.",
            "",
            "Traceback (most recent call last):",
            '  File "/c/execution.py", line 516, in execute',
            "RuntimeError: CUDA error: out of memory",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "/c/main.py", line 1, in <module>',
            "ValueError: x",
            "Prompt executed in 0.09 seconds",
        ]
    )
    assert [(r.line_no, r.line_count) for r in records] == [(1, 1), (2, 11), (13, 1)]


def test_cudamallocasync_numbers_stay_with_their_message() -> None:
    records = _assemble(
        [
            "torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)",
            "Currently allocated     : 21.55 GiB",
            "Requested               : 952.00 MiB",
            "Device limit            : 24.00 GiB",
            "Free (according to CUDA): 0 bytes",
            "PyTorch limit (set by user-supplied memory fraction)",
            "                        : 17179869184.00 GiB",
            "",
            "Prompt executed in 188.48 seconds",
        ]
    )
    assert [r.line_count for r in records] == [8, 1]


def test_error_report_is_one_record_until_system_information() -> None:
    records = _assemble(
        [
            "# ComfyUI Error Report",
            "## Error Details",
            "- **Node Type:** KSampler",
            "- **Exception Message:** Allocation on device ",
            "## Stack Trace",
            '  File "x.py", line 1, in y',
            "## System Information",
            "- **ComfyUI Version:** 0.3.62",
        ]
    )
    assert [r.line_count for r in records] == [6, 1, 1]


def test_an_unfinished_report_does_not_swallow_what_follows() -> None:
    records = _assemble(
        [
            "# ComfyUI Error Report",
            "- **Node Type:** KSampler",
            "got prompt",
            "Prompt executed in 1.00 seconds",
        ]
    )
    assert [r.line_count for r in records] == [2, 1, 1]


def test_memory_summary_rows_join_their_table() -> None:
    records = _assemble(
        [
            "Memory summary: |===========================================================================|",
            "|                  PyTorch CUDA memory summary, device ID 0                 |",
            "|            CUDA OOMs: 1            |        cudaMalloc retries: 1         |",
            "|===========================================================================|",
            "Got an OOM, unloading all loaded models.",
        ]
    )
    assert [r.line_count for r in records] == [4, 1]


def test_pending_start_offset_lets_the_caller_commit_only_finished_records() -> None:
    assembler = RecordAssembler()
    assert assembler.pending_start_offset is None
    assert assembler.feed("[2026-01-02 10:00:00.000] got prompt", 0, 37) == []
    assert assembler.pending_start_offset == 0
    done = assembler.feed("[2026-01-02 10:00:01.000] Traceback (most recent call last):", 37, 98)
    assert [(r.start_offset, r.end_offset) for r in done] == [(0, 37)]
    assert assembler.pending_start_offset == 37
    assembler.feed('  File "x.py", line 1', 98, 120)
    assert assembler.pending_start_offset == 37 and assembler.pending_line_no == 2
    (last,) = assembler.flush()
    assert (last.start_offset, last.end_offset, last.line_count) == (37, 120, 2)
    assert assembler.pending_start_offset is None and assembler.flush() == []


def test_several_lines_in_one_feed_are_split_with_their_byte_offsets() -> None:
    assembler = RecordAssembler()
    text = "got prompt\nÄrger line\nPrompt executed in 1.00 seconds\n"
    records = assembler.feed(text, 100, 100 + len(text.encode())) + assembler.flush()
    assert [(r.start_offset, r.end_offset) for r in records] == [(100, 111), (111, 123), (123, 155)]


def test_a_huge_record_keeps_its_head_and_tail_within_the_caps() -> None:
    assembler = RecordAssembler(max_lines=50, head_lines=10, max_bytes=64 * 1024)
    assembler.feed("Traceback (most recent call last):")
    for i in range(10_000):
        assembler.feed(f'  File "frame{i}.py", line {i}, in f')
    assembler.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    (record,) = assembler.flush()
    lines = record.text.splitlines()
    assert record.line_count == 10_002 and record.dropped_lines == 10_002 - 50
    assert lines[0] == "Traceback (most recent call last):" and lines[-1].startswith(
        "torch.OutOfMemoryError"
    )
    assert "lines dropped" in lines[10] and len(lines) == 51


def test_a_record_is_capped_in_bytes_too() -> None:
    assembler = RecordAssembler(max_bytes=4096, head_lines=5)
    assembler.feed("Traceback (most recent call last):")
    for _ in range(200):
        assembler.feed("    " + "x" * 200)
    (record,) = assembler.flush()
    assert len(record.text.encode()) < 4096 + 400


def test_an_over_long_line_keeps_its_two_ends() -> None:
    assembler = RecordAssembler()
    assembler.feed("a" * 200_000 + " CUDA out of memory. Tried to allocate 2.00 GiB.")
    (record,) = assembler.flush()
    assert len(record.text) < 70_000 and record.text.endswith("Tried to allocate 2.00 GiB.")


# -- the byte scanner holds a bounded amount of memory -----------------------------------------------


def _big_log(lines: int) -> io.BytesIO:
    block = (
        b"[2026-01-02 10:11:12.345] loaded partially; 2419.36 MB usable, 2340.83 MB loaded, 263.30 MB offloaded\n"
        * 999
        + b"[2026-01-02 10:11:13.000] !!! Exception during processing !!! Allocation on device \n"
    )
    return io.BytesIO(block * (lines // 1000))


@pytest.mark.parametrize("size_lines", [100_000, 300_000], ids=["10MB", "30MB"])
def test_scanning_memory_does_not_grow_with_file_size(size_lines: int) -> None:
    stream = _big_log(size_lines)
    tracemalloc.start()
    try:
        count = sum(1 for _ in scan_stream(stream, chunk_size=1024 * 1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == size_lines // 1000
    assert peak < 6 * 1024 * 1024  # a few chunk-sized buffers, whatever the file size


def test_a_file_without_newlines_is_scanned_in_bounded_memory() -> None:
    stream = io.BytesIO(
        b"x" * (20 * 1024 * 1024) + b" CUDA out of memory. Tried to allocate 2.00 GiB."
    )
    tracemalloc.start()
    try:
        findings = list(scan_stream(stream, chunk_size=1024 * 1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024
    assert len(findings) == 1


def _records_fed(lines: list[str], *, bulk: bool) -> list[tuple[int, int, str]]:
    """Records of ``lines``, each indented run given to ``extend_indented`` when ``bulk`` (the
    byte scanner's path) or fed line by line (the line scanner's)."""
    asm = RecordAssembler()
    out: list[Record] = []
    i = 0
    while i < len(lines):
        j = i
        while bulk and j < len(lines) and lines[j][:1] in (" ", "\t"):
            j += 1
        if j > i and asm.extend_indented("\n".join(lines[i:j]), 0):
            i = j
            continue
        out += asm.feed_line(lines[i])
        i += 1
    out += asm.flush()
    return [(r.line_no, r.line_count, r.text) for r in out]


@pytest.mark.parametrize(
    "lines",
    [
        # a console's hard wrap after an indented line that said out of memory (found by the
        # fuzz test: the bulk path forgot the line had said it, and 'a' began a record)
        [
            "",
            " 2024-05-11 02:24:26,980 - ERROR: CUDA out of memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacty of 23.65 GiB of which 7.95 GiB is free. Process 1957120 has",
            "a",
            "",
            "2024-05-11 02:24:26,980 - ERROR: done",
        ],
        # an exception type alone on an indented line, its message on the next
        ["header", "  numpy.core._exceptions.MemoryError:", "Unable to allocate 2.00 GiB"],
        ["header", "  MemoryError:", "", "Unable to allocate 2.00 GiB"],
    ],
)
def test_extend_indented_keeps_the_state_feeding_line_by_line_would(lines: list[str]) -> None:
    assert _records_fed(lines, bulk=True) == _records_fed(lines, bulk=False)

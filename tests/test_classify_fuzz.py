"""The classifier and the scanners never raise, on any text or bytes (hypothesis).

The inner functions are fuzzed without the public functions' safety net, so a rule that trips
over its input shows up here instead of being silently swallowed.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oom_sentinel.daemon.classify import (
    NEEDLES,
    classify_execution_error,
    classify_record,
    has_needle,
    iter_findings,
    rules,
    scan_stream,
)
from oom_sentinel.daemon.events import OomEvent
from oom_sentinel.daemon.logformat import split_prefix, strip_prefix
from oom_sentinel.daemon.records import RecordAssembler

CORPUS = Path(__file__).parent / "corpus"
_CORPUS_LINES = sorted(
    {
        line
        for path in CORPUS.glob("*.txt")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    }
)
FRAGMENTS = [
    *NEEDLES,
    *_CORPUS_LINES[:: max(1, len(_CORPUS_LINES) // 150)],
    "Tried to allocate ",
    "GPU ",
    " has a total capacity of ",
    " is free. ",
    "Process ",
    " memory in use. ",
    "1.5 GiB",
    "0 bytes",
    "136. GiB",
    "9" * 40,
    ",",
    ".",
    ":",
    "(",
    ")",
    "\n",
    "  ",
    "\t",
    "\r",
    "\x1b[31m",
    "> ",
    "`",
    '"',
    "Traceback (most recent call last):\n",
    "!!! Exception during processing !!! ",
    "# ComfyUI Error Report\n",
    "- **Node Type:** ",
    "Error occurred when executing ",
    "[2026-01-02 10:11:12.345] ",
    "2025-04-27T21:57:57.289009 - ",
    "Killed process ",
    "Memory summary: ",
    "|",
]
texts = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(FRAGMENTS)), max_size=30).map(
    "".join
)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(texts)
def test_rules_never_raise_on_text_built_from_real_fragments(text: str) -> None:
    found = rules._classify(text)  # no safety net
    assert found is None or isinstance(found.event, OomEvent)
    event = classify_record(text)
    assert event is None or isinstance(event, OomEvent)


@FUZZ
@given(st.binary(max_size=600))
def test_rules_never_raise_on_arbitrary_bytes(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    rules._classify(text)
    assert classify_record(text) is None or has_needle(text)


@FUZZ
@given(st.text(max_size=300))
def test_no_needle_means_no_event(text: str) -> None:
    if not has_needle(text):
        assert classify_record(text) is None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | texts,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=8,
)
payload_keys = st.sampled_from(
    ["exception_type", "exception_message", "node_type", "node_id", "traceback", "prompt_id"]
)


@FUZZ
@given(st.dictionaries(payload_keys, json_values, max_size=6))
def test_execution_error_payloads_never_raise(payload: dict[str, object]) -> None:
    rules._classify_execution_error(payload)  # no safety net
    event = classify_execution_error(payload)
    assert event is None or isinstance(event, OomEvent)


@FUZZ
@given(texts)
def test_prefix_splitting_never_raises(line: str) -> None:
    timestamp, message = strip_prefix(line)
    assert timestamp is None or isinstance(timestamp, str)
    assert isinstance(message, str) and isinstance(split_prefix(line).starts_record, bool)


@FUZZ
@given(st.lists(texts, max_size=25))
def test_record_assembly_keeps_every_line_and_orders_offsets(lines: list[str]) -> None:
    assembler = RecordAssembler(max_lines=8, head_lines=3, max_bytes=2048)
    records = []
    offset = 0
    fed = 0
    for line in lines:
        for part in line.split("\n"):
            size = len(part.encode("utf-8", "replace")) + 1
            records += assembler.feed(part, offset, offset + size)
            offset += size
            fed += 1
            pending = assembler.pending_start_offset
            assert pending is None or pending <= offset
    records += assembler.flush()
    assert assembler.pending_start_offset is None
    assert sum(r.line_count for r in records) == fed
    assert all(a.end_offset <= b.start_offset for a, b in itertools.pairwise(records))
    assert all(r.text.count("\n") + 1 <= 8 + 1 for r in records)  # capped (+ the dropped marker)


@FUZZ
@given(st.binary(max_size=3000), st.integers(min_value=4096, max_value=9000))
def test_byte_scanner_never_raises_and_reports_lines_in_range(data: bytes, chunk: int) -> None:
    findings = list(scan_stream(io.BytesIO(data), chunk_size=chunk))
    lines = data.count(b"\n") + 1
    assert all(1 <= f.line_no <= lines for f in findings)


@FUZZ
@given(st.lists(texts, max_size=20))
def test_byte_scanner_and_line_scanner_agree_on_short_logs(parts: list[str]) -> None:
    text = "\n".join(parts)
    lines = text.split("\n")
    if len(lines) > 40:  # the scanner's lookbehind is 48 lines: beyond it records may start later
        return
    data = text.encode("utf-8", "replace")
    by_bytes = [(f.line_no, f.event) for f in scan_stream(io.BytesIO(data))]
    by_lines = [
        (f.line_no, f.event) for f in iter_findings(data.decode("utf-8", "replace").split("\n"))
    ]
    assert by_bytes == by_lines

"""Folding one failure seen twice into one event fills in what only one record showed.

The fields filled are ``events.MERGED_FIELDS``, derived from ``OomEvent`` itself; these tests
build their events from the same dataclass fields, so a field added later is covered too.
"""

from __future__ import annotations

from dataclasses import fields

from oom_sentinel.daemon.classify import iter_findings
from oom_sentinel.daemon.classify.events import (
    MERGED_FIELDS,
    Backend,
    OomEvent,
    OtherProcess,
    Pool,
    unknown,
)
from oom_sentinel.daemon.classify.fold import _combine

#: a known value for each field type OomEvent's facts have (a new type fails loudly here)
_KNOWN = {
    "Backend": Backend.ROCM,
    "str": "seen",
    "str | None": "seen",
    "int | None": 7,
    "tuple[OtherProcess, ...]": (OtherProcess(9, 512),),
}


def _bare() -> OomEvent:
    return OomEvent(pool=Pool.GPU, backend=Backend.UNKNOWN, recovered=False, message="")


def _knowing_everything() -> OomEvent:
    types = {f.name: str(f.type) for f in fields(OomEvent)}
    values = {name: _KNOWN[types[name]] for name in MERGED_FIELDS}
    return OomEvent(pool=Pool.GPU, recovered=False, **values)


def test_merged_fields_are_every_fact_of_the_event() -> None:
    names = {f.name for f in fields(OomEvent)}
    assert set(MERGED_FIELDS) == names - {
        "pool",
        "recovered",
        "other_process_named",
        "rule",
        "count",
        "extra",
    }
    assert {"reserved_bytes", "process_used_bytes"} <= set(MERGED_FIELDS)


def test_combine_fills_every_unknown_fact_from_the_other_record() -> None:
    secondary = _knowing_everything()
    merged = _combine(primary=_bare(), secondary=secondary)
    assert {name: getattr(merged, name) for name in MERGED_FIELDS} == {
        name: getattr(secondary, name) for name in MERGED_FIELDS
    }


def test_combine_keeps_what_the_primary_knows() -> None:
    primary = _knowing_everything()
    other = OomEvent(
        pool=Pool.RAM,
        backend=Backend.CUDA,
        recovered=False,
        message="other",
        requested_bytes=1,
        reserved_bytes=2,
        process_used_bytes=3,
    )
    assert _combine(primary=primary, secondary=other) == primary


def test_unknown_is_none_empty_or_the_unknown_backend() -> None:
    assert all(unknown(v) for v in (None, "", (), Backend.UNKNOWN))
    assert not any(unknown(v) for v in (0, "x", Backend.CPU, (OtherProcess(1, None),)))


def test_a_header_folds_with_its_traceback_keeping_the_header_s_numbers() -> None:
    """ComfyUI's header line shows the old torch's figures; the traceback's last line was cut
    before them. The folded event has both: the reserved total only the header showed."""
    lines = [
        "!!! Exception during processing !!! CUDA out of memory. Tried to allocate 20.00 MiB "
        "(GPU 0; 8.00 GiB total capacity; 6.50 GiB already allocated; 10.00 MiB free; "
        "7.20 GiB reserved in total by PyTorch)",
        "Traceback (most recent call last):",
        '  File "/ComfyUI/execution.py", line 151, in recursive_execute',
        "    output_data = get_output_data(obj, input_data_all)",
        "torch.cuda.OutOfMemoryError: CUDA out of memory.",
    ]
    (finding,) = list(iter_findings(lines))
    event = finding.event
    assert event.exception_type == "torch.cuda.OutOfMemoryError"
    assert event.reserved_bytes == round(7.2 * 1024**3)
    assert event.requested_bytes == 20 * 1024**2

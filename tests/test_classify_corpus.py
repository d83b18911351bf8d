"""The labelled corpus: excerpts users posted in public GitHub issues, and what each must yield.

Every field of every event is compared (pool, backend, recovered, exception and node type,
every number in bytes, other processes, the killer, the evidence line), so a mislabel or a
misread number fails here. The label file cites the source of each excerpt.
"""

from __future__ import annotations

import io
import tomllib
from pathlib import Path
from typing import Any

import pytest
from corpus_score import KNOWN_MISSES, hash_split, label_value, load_cases, score, split_of

from oom_sentinel.daemon.classify import Finding, iter_findings, scan_stream
from oom_sentinel.daemon.classify.events import MERGED_FIELDS, Backend, Pool

CORPUS = Path(__file__).parent / "corpus"
ALL_CASES: list[dict[str, Any]] = tomllib.loads(
    (CORPUS / "labels.toml").read_text(encoding="utf-8")
)["case"]
#: the part the classifier is tuned on and held to exactly; the held-out part is only scored
#: (``test_held_out_part_meets_the_targets``, tests/corpus_score.py)
CASES = [case for case in ALL_CASES if split_of(case) == "tune"]
ALL_IDS = [case["file"].removesuffix(".txt") for case in ALL_CASES]

#: the sizes a label gives, in bytes: every fact of an OomEvent named ``*_bytes``
SIZE_FIELDS = tuple(name for name in MERGED_FIELDS if name.endswith("_bytes"))
#: ... and the other facts compared one to one (backend, message and processes are apart)
OTHER_FIELDS = tuple(
    name
    for name in MERGED_FIELDS
    if name not in SIZE_FIELDS and name not in ("backend", "message", "other_processes")
)


def _expected(label: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "line": label["line"],
        "pool": label["pool"],
        "backend": label["backend"],
        "recovered": label["recovered"],
        "count": label.get("count", 1),
        "other_processes": [(p["pid"], p["bytes"]) for p in label.get("other_processes", [])],
        "other_process_named": label.get("other_process_named", False),
        "extra": label.get("extra", {}),
    }
    for name in (*SIZE_FIELDS, *OTHER_FIELDS):
        out[name] = label_value(label, name)
    return out


def _actual(finding: Finding) -> dict[str, Any]:
    event = finding.event
    out: dict[str, Any] = {
        "line": finding.line_no,
        "pool": str(event.pool),
        "backend": str(event.backend),
        "recovered": event.recovered,
        "count": event.count,
        "other_processes": [(p.pid, p.bytes) for p in event.other_processes],
        "other_process_named": event.other_process_named,
        "extra": dict(event.extra),
    }
    for name in (*SIZE_FIELDS, *OTHER_FIELDS):
        out[name] = getattr(event, name)
    return out


def _scan(data: bytes, chunk_size: int = 4 * 1024 * 1024) -> list[Finding]:
    return list(scan_stream(io.BytesIO(data), chunk_size=chunk_size))


def _tune_params() -> list[Any]:
    return [
        pytest.param(
            case,
            id=case["file"].removesuffix(".txt"),
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case["file"]])]
            if case["file"] in KNOWN_MISSES
            else [],
        )
        for case in CASES
    ]


def test_known_misses_are_tune_cases() -> None:
    assert set(KNOWN_MISSES) <= {case["file"] for case in CASES}


@pytest.mark.parametrize("case", _tune_params())
def test_corpus_excerpt_yields_exactly_its_labelled_events(case: dict[str, Any]) -> None:
    data = (CORPUS / case["file"]).read_bytes()
    got = [_actual(f) for f in _scan(data)]
    want = [_expected(label) for label in case.get("event", [])]
    assert got == want


@pytest.mark.parametrize("case", ALL_CASES, ids=ALL_IDS)
def test_line_by_line_assembly_finds_the_same_events_as_the_byte_scanner(
    case: dict[str, Any],
) -> None:
    text = (CORPUS / case["file"]).read_text(encoding="utf-8")
    by_lines = [_actual(f) for f in iter_findings(text.splitlines())]
    assert by_lines == [_actual(f) for f in _scan(text.encode())]


def test_whole_corpus_concatenated_scans_the_same_with_tiny_chunks_and_line_by_line() -> None:
    """Chunk borders falling anywhere (4 KiB reads) change nothing, nor does the fast path."""
    separator = b"\n" + b"filler line without any needle\n" * 200
    blob = separator.join((CORPUS / case["file"]).read_bytes() for case in CASES)
    big = [_actual(f) for f in _scan(blob)]
    small = [_actual(f) for f in _scan(blob, chunk_size=4096)]
    lines = [_actual(f) for f in iter_findings(blob.decode("utf-8").splitlines())]
    assert small == big == lines
    # excerpts glued together lose a little context (a prefixed excerpt makes the bare lines
    # after it continuation lines), but nearly every labelled event survives
    assert len(big) >= 0.9 * sum(len(case.get("event", [])) for case in CASES)


def test_corpus_has_150_real_excerpts_each_citing_its_source() -> None:
    real = [case for case in ALL_CASES if not case.get("derived_from")]
    assert len(real) >= 150
    for case in ALL_CASES:
        assert case["source"].startswith(("https://", "http://")), case[
            "file"
        ]  # (a page has no https)
        assert (CORPUS / case["file"]).is_file()
    assert len({case["file"] for case in ALL_CASES}) == len(ALL_CASES)
    # never the same excerpt twice
    texts = [(CORPUS / case["file"]).read_bytes() for case in ALL_CASES]
    assert len(set(texts)) == len(texts)


#: what a label may say beyond the event's own fields (``_expected``)
_LABEL_ONLY_KEYS = frozenset({"line", "count", "extra"})
_CASE_KEYS = frozenset(
    {"file", "source", "kind", "split", "round", "note", "derived_from", "event"}
)


def test_every_label_key_is_one_the_comparison_reads() -> None:
    """A key the comparison does not read is a label that checks nothing: a pack name written
    beside the fields instead of in ``extra`` once passed whatever the classifier said."""
    known = _LABEL_ONLY_KEYS | set(MERGED_FIELDS) | {"pool", "recovered", "other_process_named"}
    for case in ALL_CASES:
        assert set(case) <= _CASE_KEYS, (case["file"], sorted(set(case) - _CASE_KEYS))
        for label in case.get("event", []):
            assert set(label) <= known, (case["file"], sorted(set(label) - known))


def test_derived_variants_name_a_real_excerpt_they_were_made_from() -> None:
    files = {case["file"]: case for case in ALL_CASES}
    for case in ALL_CASES:
        if case.get("derived_from"):
            origin = files[case["derived_from"]]
            assert not origin.get("derived_from"), case["file"]
            assert origin["source"] == case["source"], case["file"]


def test_split_was_drawn_by_hash_of_the_file_name() -> None:
    """The split is a function of the name, fixed before tuning, not a choice per excerpt."""
    for case in ALL_CASES:
        if "split" in case:
            assert case["split"] == hash_split(case["file"]), case["file"]
    assert sum(split_of(case) == "held" for case in ALL_CASES) >= 30


def _held_score() -> Any:
    return score([case for case in load_cases() if split_of(case) == "held"])


#: held-out negatives called a failure (round 30: 1 of 21, batch 38c's, at first look and after
#: tuning; round 29: none of 21, at first look and after tuning;
#: round 28: none of 20, at first look and after tuning;
#: round 27: 1 of 19, batch 35a's, at first look and after tuning, none once spent; round 26: 2 of 15, one each of batches 34a and 34b,
#: at first look and after tuning, none once spent; round 25: none of 24 at first look and after tuning;
#: round 24: 1 of 16, batch 32c's, at its first look and after tuning; round 23: 1 of 29 at first look and after tuning, in batch 31b; round 22: none
#: of 22 at first look and after tuning;
#: round 21: 1 of 26 at first look and after tuning, in batch 29b; round 20: none of 31;
#: round 19: none of 21;
#: round 18: 3 of 28 at first look and after tuning, 1 once spent;
#: round 17: 2 of 26 at first look, 1 once a title or
#: sentence naming the error was read as the user's words; round 16: 3 of 28;
#: round 15: none of 17;
#: round 14: 1 of 21; round 13: none of 16; round 12: 1 of 27; round 11: 1 of 26; rounds 9
#: and 10: 2 each; rounds 7 and 8 none): a ceiling, so a change that flags one more fails here
HELD_NEGATIVES_FLAGGED = 1


def test_held_out_negatives_keep_their_measured_figure() -> None:
    result = _held_score()
    assert result.negatives > 0
    assert result.negatives_flagged <= HELD_NEGATIVES_FLAGGED


@pytest.mark.xfail(
    strict=True,
    reason="issue 12's hard target is missed on round 30's untouched held part: 1 of its 21 "
    "negatives is called a failure at first look and after tuning (its misses are not looked "
    "at until the round is spent); strict, so it turns red once none is",
)
def test_no_held_out_negative_is_called_a_failure() -> None:
    """Issue 12's hard target: no look-alike called an OOM on the untouched part. Met on rounds
    7, 8, 13, 15, 19, 20, 22, 25, 28 and 29; missed on rounds 9-12, 14, 16-18, 21, 23, 24, 26, 27
    and 30."""
    result = _held_score()
    assert result.negatives > 0
    assert result.negatives_flagged == 0


#: what the held-out part (round 30, tests/corpus_score.py HELD_ROUND) scores after tuning on
#: its tune part only (first look, all three batches with round 29 spent and no round-30
#: tuning: 18.0 % of 50 events on every figure; per batch 38a 4.8 % of 21, 38b 27.3 % of 22,
#: 38c 28.6 % of 7 detected; 44.0 / 44.0 / 42.0 % after tuning; its misses never listed;
#: tests/corpus/README.md): a floor, so a change that loses ground on logs nobody tuned for
#: fails here
HELD_FLOOR = 0.42  # 21 of 50 events (42.0 %, the numbers figure)


def test_held_out_part_keeps_its_measured_figures() -> None:
    figures = _held_score().figures()
    assert min(figures.values()) >= HELD_FLOOR, figures


@pytest.mark.xfail(
    strict=True,
    reason="issue 12: the untouched held-out part (round 30: 63 excerpts, 50 events) scores "
    "44.0 / 44.0 / 42.0 % (detection, pool, numbers) after tuning on its tune part (first "
    "look 18.0 % on every figure; per batch 4.8, 27.3 and 28.6 % detection), under the "
    "98/97/97 % targets; strict, so it turns red once they are met and this marker must go",
)
def test_held_out_part_meets_the_targets() -> None:
    figures = _held_score().figures()
    assert figures["detection"] >= 0.98
    assert figures["pool"] >= 0.97
    assert figures["numbers"] >= 0.97


def _labels() -> list[dict[str, Any]]:
    return [label for case in CASES for label in case.get("event", [])]


@pytest.mark.parametrize("pool", list(Pool), ids=[f"pool={p}" for p in Pool])
def test_every_pool_has_a_corpus_excerpt(pool: Pool) -> None:
    assert any(label["pool"] == str(pool) for label in _labels())


@pytest.mark.parametrize("backend", list(Backend), ids=[f"backend={b}" for b in Backend])
def test_every_backend_has_a_corpus_excerpt(backend: Backend) -> None:
    assert any(label["backend"] == str(backend) for label in _labels())


def test_recovered_soft_ooms_and_failures_are_both_in_the_corpus() -> None:
    labels = _labels()
    assert any(label["recovered"] for label in labels)
    assert any(not label["recovered"] for label in labels)
    assert any(label.get("killer") == "kernel" for label in labels)
    assert any(label.get("killer") == "earlyoom" for label in labels)
    assert any(label.get("other_processes") for label in labels)
    assert any(
        label["pool"] == "gpu-fragmentation" and label["backend"] == "rocm" for label in labels
    )


NEGATIVE_KINDS = {
    "illegal memory access": "negative_illegal_memory_access",
    "device-side assert": "negative_device_side_assert",
    "Torch not compiled with CUDA enabled": "negative_torch_not_compiled_with_cuda",
    "tensors on different devices": "negative_tensors_on_two_devices",
    "prose containing 'out of memory'": "negative_prose_out_of_memory",
    "XPU 4 GB single-block limit": "negative_xpu_4gb_block_limit",
}


@pytest.mark.parametrize("prefix", NEGATIVE_KINDS.values(), ids=list(NEGATIVE_KINDS))
def test_every_negative_kind_has_an_excerpt_that_stays_negative(prefix: str) -> None:
    cases = [case for case in CASES if case["file"].startswith(prefix)]
    assert cases
    for case in cases:
        assert case.get("event", []) == []
        assert _scan((CORPUS / case["file"]).read_bytes()) == []

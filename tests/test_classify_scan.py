"""The byte scanner's speed-ups change nothing it finds.

* every prefilter (the Aho-Corasick automaton when installed, the ``bytes.find`` fallback)
  marks exactly the lines that hold a needle;
* what the scan finds does not depend on where its reads end, long lines included;
* what it finds is what the line-by-line path finds, from the start of a file or its middle.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oom_sentinel.daemon.classify import (
    NEEDLES,
    PREFILTERS,
    Finding,
    has_needle,
    iter_findings,
    rules,
    scan_stream,
)
from oom_sentinel.daemon.cli.diagnose import open_log, scan_log

CORPUS = Path(__file__).parent / "corpus"
CORPUS_TEXTS = [p.read_bytes() for p in sorted(CORPUS.glob("*.txt"))]
PREFILTER_NAMES = sorted(PREFILTERS)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_NEEDLES_B = [n.encode() for n in NEEDLES]


def test_the_fast_prefilter_is_installed_where_ci_runs() -> None:
    """CI installs the ``fast`` extra (pyproject ``test``): the automaton path is tested there."""
    if os.environ.get("CI"):
        assert "ahocorasick" in PREFILTERS
    assert "find" in PREFILTERS


# -- prefilters -----------------------------------------------------------------------------------

PIECES = [
    *_NEEDLES_B,
    b"\n",
    b"\r\n",
    b" ",
    b"memory",
    b"Memory",
    b"OOMed",
    b"emor",
    b"OO",
    b"Kille",
    b"rror 145",
    b"_STATUS",
    b"[2026-01-02 10:11:12.345] ",
    b"\xff\xfe",
    b"\xe2\x96\x88",
]
blobs = st.lists(st.one_of(st.binary(max_size=12), st.sampled_from(PIECES)), max_size=60).map(
    b"".join
)


@FUZZ
@pytest.mark.parametrize("name", PREFILTER_NAMES)
@given(data=blobs)
def test_prefilter_marks_exactly_the_lines_that_hold_a_needle(name: str, data: bytes) -> None:
    hits = PREFILTERS[name](bytearray(data), len(data))
    assert hits == sorted(hits)
    assert all(any(data.startswith(n, pos) for n in _NEEDLES_B) for pos in hits)
    marked = {data.count(b"\n", 0, pos) for pos in hits}
    holding = {i for i, line in enumerate(data.split(b"\n")) if any(n in line for n in _NEEDLES_B)}
    assert marked == holding


def test_prefilter_looks_only_before_end() -> None:
    data = bytearray(b"fine\nCUDA out of memory\n")
    for name in PREFILTER_NAMES:
        assert PREFILTERS[name](data, 5) == []
        assert PREFILTERS[name](data, len(data)) == [data.find(b"emory")]


def _str_has_needle(text: str) -> bool:
    return any(n in text for n in NEEDLES)


@FUZZ
@given(data=blobs, pad=st.integers(min_value=0, max_value=2))
def test_the_automaton_needle_test_on_long_records_answers_as_the_str_tests(
    data: bytes, pad: int
) -> None:
    """Once a scan has built the automaton, ``has_needle`` tests long texts (a traceback's
    frames) with it: the answer must be the one of the ``in`` tests, whatever the text."""
    if "ahocorasick" not in PREFILTERS:
        pytest.skip("the fast extra is not installed")
    PREFILTERS["ahocorasick"](bytearray(b"x"), 1)  # the first scan builds the automaton
    assert rules._bytes_has_needle is not None
    filler = '  File "x.py", line 1, in f\n' * (pad * 40)
    for text in (
        filler + data.decode("utf-8", "replace"),
        data.decode("utf-8", "surrogateescape") + filler,
        filler + data.decode("latin-1"),
    ):
        assert has_needle(text) is _str_has_needle(text), text[-200:]


def test_the_automaton_needle_test_keeps_every_corpus_record() -> None:
    """Every corpus excerpt, alone and behind 4 KiB of frames, has the same needle answer with
    the automaton installed as with the ``in`` tests (and every record of it too)."""
    if "ahocorasick" not in PREFILTERS:
        pytest.skip("the fast extra is not installed")
    PREFILTERS["ahocorasick"](bytearray(b"x"), 1)
    filler = '  File "/ComfyUI/execution.py", line 327, in execute\n' * 80
    for data in CORPUS_TEXTS:
        text = data.decode("utf-8", "replace")
        for candidate in (text, filler + text, text + filler, filler):
            assert has_needle(candidate) is _str_has_needle(candidate)
        for finding in iter_findings(text.splitlines()):
            assert has_needle(finding.record.text)


def test_an_unknown_prefilter_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown prefilter"):
        list(scan_stream(io.BytesIO(b"x\n"), prefilter="grep"))


def _generated_log(seed: int, lines: int, *, long_every: int = 0) -> bytes:
    """ComfyUI-Manager lines with corpus excerpts (real OOM records) dropped in at random."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    for i in range(lines):
        stamp = f"[2026-01-02 10:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}] "
        r = rnd.random()
        if r < 0.004:
            out.append(rnd.choice(CORPUS_TEXTS).rstrip(b"\n"))
        elif long_every and i % long_every == 0:
            out.append((stamp + "100%|" + "\u2588" * rnd.randint(500, 3000) + "|").encode())
        elif r < 0.3:
            out.append(
                f"{stamp}{rnd.randint(0, 100)}%|\u2588\u2588   | 3/30 [00:01<00:09]".encode()
            )
        elif r < 0.5:
            out.append(f"{stamp}Requested to load {rnd.choice(['SDXL', 'Flux', 'WAN21'])}".encode())
        elif r < 0.6:
            out.append(f"{stamp}got prompt".encode())
        elif r < 0.7:
            out.append(f"{stamp}Prompt executed in {rnd.uniform(1, 99):.2f} seconds".encode())
        elif r < 0.75:
            out.append(b"KSampler")  # a bare node-type hint line
        else:
            out.append(f"{stamp}loaded partially; {rnd.uniform(1, 9e3):.2f} MB usable".encode())
    return b"\n".join(out) + b"\n"


def _key(findings: list[Finding]) -> list[tuple[object, ...]]:
    return [
        (f.line_no, f.end_line_no, f.record.line_no, f.record.start_offset, f.record.text, f.event)
        for f in findings
    ]


@pytest.mark.parametrize("seed", [1, 2, 3], ids=["seed1", "seed2", "seed3"])
def test_every_prefilter_finds_the_same(seed: int) -> None:
    data = _generated_log(seed, 6000)
    results = {
        name: _key(list(scan_stream(io.BytesIO(data), prefilter=name))) for name in PREFILTERS
    }
    first = next(iter(results.values()))
    assert first, "the generated log holds OOM records"
    assert all(found == first for found in results.values())


# -- independent of where reads end ---------------------------------------------------------------


@pytest.mark.parametrize("name", PREFILTER_NAMES)
def test_findings_do_not_depend_on_where_reads_end_with_long_lines(name: str) -> None:
    """Lines of a few KB (progress bars written with carriage returns) make the lookbehind span
    more than 64 KB; a refill still keeps what it needs, whatever the chunk size."""
    data = _generated_log(7, 3000, long_every=3)
    whole = _key(list(scan_stream(io.BytesIO(data), chunk_size=len(data) + 1, prefilter=name)))
    assert whole
    for chunk in (4096, 10_000, 65_536, 200_000):
        assert _key(list(scan_stream(io.BytesIO(data), chunk_size=chunk, prefilter=name))) == whole


def test_a_needle_after_long_lines_keeps_its_lookbehind_across_a_refill() -> None:
    """40 lines of 2 KB, a node-type hint line, then an OOM line: when a read ends inside the
    OOM line, the refill still keeps the hint line (an earlier rule dropped all lookbehind
    once 51 lines passed 64 KB, and the node type with it)."""
    filler = b"[2026-01-02 10:11:12.345] " + b"x" * 2000 + b"\n"
    head = b"[2026-01-02 10:11:11.000] got prompt\n" + filler * 40 + b"KSampler\n"
    oom = (
        b"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB\n"
    )
    data = head + oom + filler * 3
    whole = _key(list(scan_stream(io.BytesIO(data), chunk_size=len(data) + 1)))
    assert [f[-1].node_type for f in whole] == ["KSampler"]
    for chunk in [len(head) + d for d in (0, 1, 10, len(oom) - 1)] + list(
        range(4096, len(data), 3001)
    ):
        assert _key(list(scan_stream(io.BytesIO(data), chunk_size=chunk))) == whole, chunk


long_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [
                b"[2026-01-02 10:11:12.345] got prompt",
                b"KSampler",
                b"[2026-01-02 10:11:12.345] !!! Exception during processing !!! CUDA out of memory. Tried to allocate 20.00 MiB.",
                b"Traceback (most recent call last):",
                b'  File "x.py", line 1, in f',
                b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
                b"[2026-01-02 10:11:12.345] Got an OOM, unloading all loaded models.",
                b"",
            ]
        ),
        st.integers(min_value=100, max_value=9000).map(
            lambda n: b"[2026-01-02 10:11:12.345] " + b"=" * n
        ),
    ),
    max_size=90,
)


@FUZZ
@given(lines=long_lines, chunk=st.integers(min_value=4096, max_value=40_000))
def test_scan_is_the_same_for_any_read_size(lines: list[bytes], chunk: int) -> None:
    data = b"\n".join(lines) + b"\n"
    whole = _key(list(scan_stream(io.BytesIO(data), chunk_size=len(data) + 4096)))
    assert _key(list(scan_stream(io.BytesIO(data), chunk_size=chunk))) == whole


# -- a big file, from the start or the middle -------------------------------------------------------


@pytest.fixture
def big_log(tmp_path: Path) -> Path:
    path = tmp_path / "comfyui.log"
    path.write_bytes(_generated_log(11, 60_000, long_every=97))
    return path


def test_diagnose_scans_a_plain_file_as_scan_stream_does(big_log: Path) -> None:
    """``diagnose``'s own path (open_log, scan_log) hands a plain file to the scanner itself."""
    with big_log.open("rb") as f:
        want = _key(list(scan_stream(f)))
    assert len(want) > 50
    with open_log(str(big_log)) as stream:
        assert _key(list(scan_log(stream))) == want


def test_a_scan_from_the_middle_of_a_file_numbers_lines_from_there(big_log: Path) -> None:
    data = big_log.read_bytes()
    start = data.index(b"\n", len(data) // 3) + 1
    want = _key(list(scan_stream(io.BytesIO(data[start:]), chunk_size=65536)))
    with big_log.open("rb") as f:
        f.seek(start)
        got = list(scan_stream(f, chunk_size=65536))
    assert [(k[0], k[1], k[2], k[3] - start, k[4], k[5]) for k in _key(got)] == [
        (k[0], k[1], k[2], k[3], k[4], k[5]) for k in want
    ]


def test_findings_match_the_line_by_line_scan_on_a_big_file(big_log: Path) -> None:
    with big_log.open("rb") as f:
        got = list(scan_stream(f, chunk_size=65536))
    lines = big_log.read_bytes().decode("utf-8", "replace").split("\n")[:-1]
    want = list(iter_findings(lines))
    assert [(f.line_no, f.event) for f in got] == [(f.line_no, f.event) for f in want]


# -- the windowed scan against the full one, on real excerpts with noise around them -------------------

CORPUS_FILES = sorted(CORPUS.glob("*.txt"))


def _noise(rnd: random.Random, lines: int, first: int) -> list[str]:
    """Needle-free ComfyUI-Manager lines: progress bars, prompt boundaries, model loads, a
    bare node-type line now and then (a hint the next record may take), blank lines."""
    out = []
    for i in range(first, first + lines):
        stamp = f"[2026-01-02 11:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}] "
        out.append(
            rnd.choice(
                [
                    f"{stamp}{rnd.randint(0, 100)}%|\u2588\u2588   | 3/30 [00:01<00:09]",
                    f"{stamp}got prompt",
                    f"{stamp}Prompt executed in {rnd.uniform(1, 99):.2f} seconds",
                    f"{stamp}Requested to load SDXL",
                    "KSampler",
                    "",
                    f"{stamp}loaded partially; {rnd.uniform(1, 9e3):.2f} MB usable",
                ]
            )
        )
    return out


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_the_windowed_scan_finds_what_the_full_scan_finds_in_noise(path: Path) -> None:
    """Only the windows around prefilter hits are assembled and classified (scan_stream);
    the full scan (iter_findings) assembles and classifies every line. On each corpus excerpt
    set in needle-free noise of several lengths, both find the same events on the same lines,
    with either prefilter and reads small enough to end inside the excerpt."""
    text = path.read_bytes().decode("utf-8", "replace")
    rnd = random.Random(path.name)
    for before, after in ((0, 0), (1, 1), (3, 200), (200, 3), (60, 60)):
        lines = [*_noise(rnd, before, 0), *text.splitlines(), *_noise(rnd, after, before)]
        data = ("\n".join(lines) + "\n").encode("utf-8")
        full = [(f.line_no, f.end_line_no, f.event) for f in iter_findings(lines)]
        for name in PREFILTER_NAMES:
            for chunk in (4096, 1 << 20):
                got = list(scan_stream(io.BytesIO(data), prefilter=name, chunk_size=chunk))
                assert [(f.line_no, f.end_line_no, f.event) for f in got] == full, (
                    before,
                    after,
                    name,
                    chunk,
                )


# -- runs of plain lines between two needles --------------------------------------------------------

STAMP = "[2026-01-02 10:11:12.345] "
WINDOW_LINES = [
    STAMP + "got prompt",
    STAMP + "Prompt executed in 3.21 seconds",
    STAMP + "Interrupting prompt 1234",
    STAMP + "Processing interrupted",
    STAMP + "50%|█████     | 15/30 [00:10<00:10,  1.50it/s]",
    STAMP + "Requested to load SDXL",
    STAMP + "KSampler",
    "[2026-01-02 10:11] VAEDecode",
    STAMP + "VAEDecode\r",
    "\x1b[32m" + STAMP + "loaded completely\x1b[0m",
    "KSampler",
    "",
    STAMP + "Got an OOM, unloading all loaded models.",
    STAMP
    + "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.",
    STAMP
    + "!!! Exception during processing !!! CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 1.00 MiB is free.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
    STAMP + "Memory summary: |=====|",
    "|            CUDA OOMs: 1            |",
    STAMP + "Killed",
    "Killed",
]


FILLER = WINDOW_LINES[:12]
NEEDLE_LINES = WINDOW_LINES[12:]
segments = st.lists(
    st.one_of(
        st.sampled_from(NEEDLE_LINES).map(lambda line: [line]),
        st.lists(st.sampled_from(FILLER), max_size=140),
        st.integers(min_value=0, max_value=140).map(
            lambda n: [STAMP + "Requested to load SDXL"] * n
        ),
    ),
    min_size=1,
    max_size=8,
).map(lambda parts: [line for part in parts for line in part] or [""])


@FUZZ
@given(lines=segments, chunk=st.sampled_from([4096, 6000, 1 << 20]))
def test_filler_between_needles_is_skipped_without_changing_anything(
    lines: list[str], chunk: int
) -> None:
    """Windows spanning many plain lines (fed in bulk) find what the line-by-line scan finds:
    same events, same lines, prompt boundaries and node-type hints included."""
    data = ("\n".join(lines) + "\n").encode()
    by_bytes = [
        (f.line_no, f.end_line_no, f.record.text, f.event)
        for f in scan_stream(io.BytesIO(data), chunk_size=chunk)
    ]
    by_lines = [
        (f.line_no, f.end_line_no, f.record.text, f.event)
        for f in iter_findings(data.decode().split("\n")[:-1])
    ]
    assert by_bytes == by_lines


@pytest.mark.parametrize(
    ("middle", "events"),
    [
        (STAMP + "got prompt", 2),
        (STAMP + "Prompt executed in 3.21 seconds", 2),
        (STAMP + "Interrupting prompt 1234", 2),
        (STAMP + "Requested to load SDXL", 1),
    ],
    ids=["got-prompt", "prompt-executed", "interrupt", "no-boundary"],
)
def test_a_prompt_boundary_inside_skipped_filler_still_keeps_events_apart(
    middle: str, events: int
) -> None:
    oom = (
        STAMP
        + "!!! Exception during processing !!! CUDA out of memory. Tried to allocate 20.00 MiB."
    )
    filler = [STAMP + f"{i}%|██   | {i}/30 [00:01<00:09]" for i in range(30)]
    lines = [
        oom,
        *filler[:15],
        middle,
        *filler[15:],
        STAMP + "Got an OOM, unloading all loaded models.",
    ]
    data = ("\n".join(lines) + "\n").encode()
    got = list(scan_stream(io.BytesIO(data)))
    want = list(iter_findings(lines))
    assert [(f.line_no, f.end_line_no, f.event) for f in got] == [
        (f.line_no, f.end_line_no, f.event) for f in want
    ]
    assert len(got) == events


def test_a_node_name_line_ending_skipped_filler_names_the_node() -> None:
    filler = [STAMP + f"{i}%|██   | {i}/30 [00:01<00:09]" for i in range(30)]
    lines = [
        STAMP + "Got an OOM, unloading all loaded models.",
        *filler,
        STAMP + "VAEDecode",
        STAMP + "CUDA out of memory. Tried to allocate 20.00 MiB.",
    ]
    got = list(scan_stream(io.BytesIO(("\n".join(lines) + "\n").encode())))
    assert [f.event.node_type for f in got] == [f.event.node_type for f in iter_findings(lines)]
    assert got[-1].event.node_type == "VAEDecode"

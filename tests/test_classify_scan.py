"""The byte scanner's speed-ups change nothing it finds.

* every prefilter (the Aho-Corasick automaton when installed, the ``bytes.find`` fallback)
  marks exactly the lines that hold a needle;
* what the scan finds does not depend on where its reads end, long lines included;
* a big file cut into ranges at seams and scanned by worker processes gives the sequential
  scan's findings, in order, with the same line numbers and byte offsets, even when a worker
  dies.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oom_sentinel.daemon.classify import (
    NEEDLES,
    PREFILTERS,
    Finding,
    iter_findings,
    parallel,
    scan,
    scan_stream,
)
from oom_sentinel.daemon.logformat import split_prefix

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


# -- parallel ranges ------------------------------------------------------------------------------


@pytest.fixture
def big_log(tmp_path: Path) -> Path:
    path = tmp_path / "comfyui.log"
    path.write_bytes(_generated_log(11, 60_000, long_every=97))
    return path


def _sequential(path: Path, chunk: int, prefilter: str | None = None) -> list[Finding]:
    with path.open("rb") as f:
        return list(scan_stream(f, chunk_size=chunk, prefilter=prefilter))


@pytest.mark.parametrize("name", PREFILTER_NAMES)
def test_ranges_scanned_by_workers_give_the_sequential_findings(big_log: Path, name: str) -> None:
    chunk = 64 * 1024
    want = _sequential(big_log, chunk, name)
    assert len(want) > 50
    with big_log.open("rb") as f:
        fd, size = f.fileno(), os.fstat(f.fileno()).st_size
        ranges = parallel._plan_ranges(fd, 0, size, 6, PREFILTERS[name])
        assert len(ranges) == 6
        assert ranges[0][0] == 0 and ranges[-1][1] == size
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        got = list(parallel._scan_ranges(fd, ranges, chunk, name))
    assert _key(got) == _key(want)


def test_scan_stream_with_workers_gives_the_sequential_findings(big_log: Path) -> None:
    chunk = 64 * 1024
    want = _sequential(big_log, chunk)
    with big_log.open("rb") as f:
        got = list(scan_stream(f, chunk_size=chunk, workers=4, range_bytes=256 * 1024))
        assert f.tell() == big_log.stat().st_size
    assert _key(got) == _key(want)


_SPLIT_PROBE = """
import json, sys
from oom_sentinel.daemon.classify import parallel
from oom_sentinel.daemon.cli_diagnose import open_log, scan_log

used = []
real = parallel._scan_ranges

def counting(fd, ranges, *args, **kw):
    used.append((len(ranges), kw.get("workers")))
    return real(fd, ranges, *args, **kw)

parallel._scan_ranges = counting
parallel.PARALLEL_RANGE_BYTES = 512 * 1024
parallel._cpu_count = lambda: 4
with open_log(sys.argv[1]) as stream:
    got = [
        [f.line_no, f.end_line_no, f.record.line_no, f.record.start_offset, f.record.text,
         repr(f.event)]
        for f in scan_log(stream)
    ]
print(json.dumps({"used": used, "got": got}))
"""


def test_diagnose_splits_a_big_plain_file_and_finds_the_same(big_log: Path) -> None:
    """``diagnose``'s own path (open_log, scan_log) hands a plain file to the scanner, which
    splits it once it is at least two ranges big. Forking needs a single-threaded process,
    which this suite's own stops being once any test leaves a thread behind, so the split is
    watched in a fresh interpreter: the one ``oom-sentinel diagnose`` runs in."""
    want = [[*k[:5], repr(k[5])] for k in _key(_sequential(big_log, scan._CHUNK))]
    proc = subprocess.run(
        [sys.executable, "-c", _SPLIT_PROBE, str(big_log)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    (used,) = doc["used"]
    assert used[0] > 4 and used[1] == 3  # this process and 3 workers
    assert doc["got"] == want


def test_a_scan_from_the_middle_of_a_file_numbers_lines_from_there(big_log: Path) -> None:
    data = big_log.read_bytes()
    start = data.index(b"\n", len(data) // 3) + 1
    want = _key(list(scan_stream(io.BytesIO(data[start:]), chunk_size=65536)))
    with big_log.open("rb") as f:
        f.seek(start)
        got = list(scan_stream(f, chunk_size=65536, workers=3, range_bytes=128 * 1024))
    assert [(k[0], k[1], k[2], k[3] - start, k[4], k[5]) for k in _key(got)] == [
        (k[0], k[1], k[2], k[3], k[4], k[5]) for k in want
    ]


def test_a_dead_worker_s_range_is_scanned_by_the_parent(
    big_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 64 * 1024
    want = _sequential(big_log, chunk)

    def die(*_args: object) -> None:
        os._exit(3)

    monkeypatch.setattr(parallel, "_scan_range_to_file", die)
    with big_log.open("rb") as f:
        fd, size = f.fileno(), os.fstat(f.fileno()).st_size
        ranges = parallel._plan_ranges(fd, 0, size, 3, PREFILTERS["find"])
        assert len(ranges) == 3
        got = list(parallel._scan_ranges(fd, ranges, chunk, "find"))
    assert _key(got) == _key(want)


def test_a_worker_file_cut_short_is_replayed_then_the_rest_scanned_here(
    big_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 64 * 1024
    want = _sequential(big_log, chunk)
    real = parallel._scan_range_to_file

    def cut_short(*args: object) -> None:
        real(*args)  # type: ignore[arg-type]
        out_fd = args[-1]
        os.ftruncate(out_fd, os.fstat(out_fd).st_size // 2)  # type: ignore[arg-type]

    monkeypatch.setattr(parallel, "_scan_range_to_file", cut_short)
    with big_log.open("rb") as f:
        fd, size = f.fileno(), os.fstat(f.fileno()).st_size
        ranges = parallel._plan_ranges(fd, 0, size, 3, PREFILTERS["find"])
        got = list(parallel._scan_ranges(fd, ranges, chunk, "find"))
    assert _key(got) == _key(want)


def test_ranges_are_scanned_here_when_no_worker_can_start(
    big_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 64 * 1024
    want = _sequential(big_log, chunk)

    def no_temp_file() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parallel.tempfile, "TemporaryFile", no_temp_file)
    with big_log.open("rb") as f:
        fd, size = f.fileno(), os.fstat(f.fileno()).st_size
        ranges = parallel._plan_ranges(fd, 0, size, 3, PREFILTERS["find"])
        got = list(parallel._scan_ranges(fd, ranges, chunk, "find"))
    assert _key(got) == _key(want)


def test_findings_match_the_line_by_line_scan_across_seams(big_log: Path) -> None:
    with big_log.open("rb") as f:
        got = list(scan_stream(f, chunk_size=65536, workers=5, range_bytes=128 * 1024))
    lines = big_log.read_bytes().decode("utf-8", "replace").split("\n")[:-1]
    want = list(iter_findings(lines))
    assert [(f.line_no, f.event) for f in got] == [(f.line_no, f.event) for f in want]


def test_a_seam_is_a_record_start_followed_by_needle_free_lines(big_log: Path) -> None:
    data = big_log.read_bytes()
    with big_log.open("rb") as f:
        fd = f.fileno()
        for nominal in range(1000, len(data) - 1000, len(data) // 40):
            seam = parallel._seam_after(fd, nominal, len(data), PREFILTERS["find"])
            if seam is None:
                continue
            assert seam > nominal - 1 and data[seam - 1 : seam] == b"\n"
            zone = data[seam:].split(b"\n", parallel._SEAM_LINES)[: parallel._SEAM_LINES]
            assert len(zone) == parallel._SEAM_LINES
            assert not any(n in line for line in zone for n in _NEEDLES_B)
            assert split_prefix(zone[0].decode("utf-8", "replace")).starts_record


def test_no_seam_inside_a_stretch_full_of_needles(tmp_path: Path) -> None:
    oom = b"[2026-01-02 10:11:12.345] Got an OOM, unloading all loaded models.\n"
    path = tmp_path / "storm.log"
    path.write_bytes((b"[2026-01-02 10:11:12.345] got prompt\n" * 100 + oom) * 2000)
    with path.open("rb") as f:
        assert (
            parallel._seam_after(f.fileno(), 10_000, path.stat().st_size, PREFILTERS["find"])
            is None
        )
        assert parallel._plan_ranges(f.fileno(), 0, path.stat().st_size, 4, PREFILTERS["find"]) == [
            (0, path.stat().st_size)
        ]


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

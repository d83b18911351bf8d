"""How fast ``oom-sentinel diagnose`` reads a big ComfyUI log, next to grep, and in how much memory.

Generates a realistic ComfyUI-Manager log (default 200 MB: model loads, progress bars, prompt
timings, custom-node noise, non-OOM tracebacks, and 0.1 % of records OOM records of several
kinds with their tracebacks), scans it exactly as ``diagnose`` does (``open_log`` then
``scan_log``: the default prefilter, one process), runs
``grep -E -c`` with a pattern for the same OOM texts on the same file in the same run
(interleaved, so both see the same machine load), and prints MB/s, the ratio to grep, and
resident memory. Then it times each prefilter, so the figure without the optional
``ahocorasick-rs`` is known too.

Targets (issue 2): ≥ 100 MB/s, ≥ 0.3 × grep, flat memory; issue 12: ≥ 1.0 × grep in one
process with the ``fast`` extra, ≥ 0.5 × without it. It also prints how many lines the
prefilter marks per OOM record (how much work a second filter stage could save). Figures, not assertions: the test
suite never times anything. The machine may be shared: the spread of the repeats is printed.

    python benchmarks/classify_throughput.py [--size-mb 200] [--repeat 5] [--keep]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from oom_sentinel.daemon.classify import (
    DEFAULT_PREFILTER,
    PREFILTERS,
    iter_findings,
    scan_stream,
)
from oom_sentinel.daemon.cli.diagnose import open_log, scan_log

#: grep's equivalent of the classifier's rules: the texts that make an OOM record
GREP_PATTERN = "|".join(
    [
        "CUDA out of memory",
        "HIP out of memory",
        "XPU out of memory",
        "MPS backend out of memory",
        "Allocation on device",
        "CUDA error: out of memory",
        "_STATUS_ALLOC_FAILED",
        "_STATUS_NOT_ALLOCATED",
        "not enough GPU video memory",
        "DefaultCPUAllocator",
        "MemoryError",
        "rror 1455",
        "Out of memory: Kill",
        "Memory cgroup out of memory",
        "^Killed$",
        "Got an OOM",
        "out of memory error, ",
        "Ran out of memory when regular",
        "OOMed: switched",
        "ran out of memory while running softmax",
        "This error means you ran out of memory",
    ]
)

NODES = [
    "KSampler",
    "SamplerCustomAdvanced",
    "VAEDecode",
    "WanVideoSampler",
    "CLIPTextEncode",
    "UNETLoader",
]
MODELS = [
    "SDXL",
    "Flux",
    "WAN21",
    "AutoencoderKL",
    "SD1ClipModel",
    "QwenImageTEModel_",
    "HunyuanVideo",
]
PACKS = [
    "ComfyUI-KJNodes",
    "rgthree-comfy",
    "ComfyUI-VideoHelperSuite",
    "comfyui_controlnet_aux",
    "ComfyUI-Manager",
]


class _LogWriter:
    """Writes a plausible ComfyUI-Manager log, record by record."""

    def __init__(self, out: BinaryIO, oom_fraction: float, seed: int) -> None:
        self.out = out
        self.rnd = random.Random(seed)
        self.oom_fraction = oom_fraction
        self.seconds = 0.0
        self.records = 0
        self.oom_records = 0

    def ts(self) -> str:
        self.seconds += self.rnd.uniform(0.001, 0.8)
        s = int(self.seconds)
        return f"[2026-01-{2 + s // 86400 % 27:02d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{int(self.seconds * 1000) % 1000:03d}] "

    def line(self, text: str) -> None:
        self.out.write((self.ts() + text + "\n").encode("utf-8"))
        self.records += 1

    def raw(self, text: str) -> None:
        self.out.write(text.encode("utf-8"))

    def traceback(self, exception_line: str, frames: int) -> None:
        self.line("Traceback (most recent call last):")
        for i in range(frames):
            self.raw(
                f'  File "/home/user/ComfyUI/comfy/ldm/modules/diffusionmodules/openaimodel.py", line {100 + i}, in forward\n'
                f"    h = forward_timestep_embed(module, h, emb, context, transformer_options, time_context=time_context)\n"
                f"        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
            )
        self.raw(exception_line + "\n\n")

    def normal(self) -> None:
        r = self.rnd.random()
        rnd = self.rnd
        if r < 0.30:
            bar = "█" * rnd.randint(0, 10)
            self.line(
                f"{rnd.randint(0, 100)}%|{bar:<10}| {rnd.randint(0, 30)}/30 [00:{rnd.randint(10, 59)}<00:{rnd.randint(10, 59)},  {rnd.uniform(1, 9):.2f}it/s]"
            )
        elif r < 0.45:
            self.line(f"Requested to load {rnd.choice(MODELS)}")
        elif r < 0.60:
            self.line(
                f"loaded partially; {rnd.uniform(1000, 20000):.2f} MB usable, {rnd.uniform(1000, 20000):.2f} MB loaded, "
                f"{rnd.uniform(0, 9000):.2f} MB offloaded, {rnd.uniform(0, 900):.2f} MB buffer reserved, lowvram patches: {rnd.randint(0, 300)}"
            )
        elif r < 0.68:
            self.line(
                f"loaded completely; {rnd.uniform(1000, 20000):.2f} MB usable, {rnd.uniform(100, 9000):.2f} MB loaded, full load: True"
            )
        elif r < 0.76:
            self.line("got prompt")
        elif r < 0.84:
            self.line(f"Prompt executed in {rnd.uniform(0.1, 300):.2f} seconds")
        elif r < 0.90:
            self.line(
                f"[ComfyUI-Manager] default cache updated: https://raw.githubusercontent.com/ltdrdata/ComfyUI-Manager/main/{rnd.choice(['extension-node-map', 'model-list', 'alter-list'])}.json"
            )
        elif r < 0.95:
            self.line(
                f"   {rnd.uniform(0, 3):.1f} seconds: /home/user/ComfyUI/custom_nodes/{rnd.choice(PACKS)}"
            )
        elif r < 0.999:
            self.line(f"{rnd.randint(1, 9)} models unloaded.")
        else:  # a non-OOM failure, with its traceback
            self.line(
                "!!! Exception during processing !!! Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
            )
            self.traceback(
                "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
                rnd.randint(5, 20),
            )

    def oom(self) -> None:
        rnd = self.rnd
        self.oom_records += 1
        kind = rnd.random()
        if kind < 0.35:  # cudaMallocAsync, v0.8 with memory summary
            self.line("!!! Exception during processing !!! Allocation on device ")
            self.traceback("torch.OutOfMemoryError: Allocation on device ", rnd.randint(10, 25))
            self.line("Memory summary: |" + "=" * 75 + "|")
            for row in (
                "Allocated memory",
                "Active memory",
                "Requested memory",
                "GPU reserved memory",
                "Non-releasable memory",
            ):
                self.raw(
                    f"| {row:<21} |  {rnd.randint(1000, 24000):>5} MiB |  {rnd.randint(1000, 24000):>5} MiB |      0 B   |      0 B   |\n"
                )
            self.line("Got an OOM, unloading all loaded models.")
        elif kind < 0.65:  # native allocator, torch >= 2.1
            msg = (
                f"CUDA out of memory. Tried to allocate {rnd.uniform(0.1, 8):.2f} GiB. GPU 0 has a total capacity of 23.55 GiB of which "
                f"{rnd.uniform(0, 2):.2f} GiB is free. Including non-PyTorch memory, this process has {rnd.uniform(18, 23):.2f} GiB memory in use. "
                f"Of the allocated memory {rnd.uniform(15, 22):.2f} GiB is allocated by PyTorch, and {rnd.uniform(0, 900):.2f} MiB is reserved by PyTorch but unallocated."
            )
            self.line("!!! Exception during processing !!! " + msg)
            self.traceback("torch.OutOfMemoryError: " + msg, rnd.randint(10, 25))
            self.line("Got an OOM, unloading all loaded models.")
        elif kind < 0.85:  # a soft OOM: recovered
            self.line(
                "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding."
            )
        else:  # host RAM
            msg = f"[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate {rnd.randint(10**8, 10**11)} bytes."
            self.line("!!! Exception during processing !!! " + msg)
            self.traceback("RuntimeError: " + msg, rnd.randint(5, 15))

    def write(self, size: int) -> None:
        while self.out.tell() < size:
            if self.rnd.random() < self.oom_fraction:
                self.oom()
            else:
                self.normal()


def _rss_kib() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _diagnose_scan(path: Path, size: int, marks: list[tuple[int, int]] | None = None) -> int:
    """``diagnose``'s scan of ``path`` (open_log + scan_log); the number of findings.

    With ``marks``, records this process's RSS when the findings pass each quarter of the file,
    and at the end.
    """
    found = 0
    quarter = 1
    with open_log(str(path)) as stream:
        for finding in scan_log(stream):
            found += 1
            if (
                marks is not None
                and quarter < 4
                and finding.record.end_offset >= size * quarter // 4
            ):
                marks.append((finding.record.end_offset, _rss_kib()))
                quarter += 1
    if marks is not None:
        marks.append((size, _rss_kib()))
    return found


def _path_scan(path: Path, prefilter: str) -> int:
    with path.open("rb") as stream:
        return sum(1 for _ in scan_stream(stream, prefilter=prefilter))


def _marked_lines(path: Path, prefilter: str) -> int:
    """How many lines of ``path`` hold a needle: the lines a window opens around."""
    hits_of = PREFILTERS[prefilter]
    marked = 0
    rest = b""
    with path.open("rb") as raw:
        while True:
            data = raw.read(4 * 1024 * 1024)
            buf = bytearray(rest + data)
            end = len(buf) if not data else buf.rfind(b"\n") + 1
            starts = {buf.rfind(b"\n", 0, pos) for pos in hits_of(buf, end)}
            marked += len(starts)
            rest = bytes(buf[end:])
            if not data:
                return marked


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _spread(times: list[float], size: int) -> str:
    rates = sorted(size / t / 1e6 for t in times)
    return f"best {rates[-1]:.0f}, median {statistics.median(rates):.0f}, worst {rates[0]:.0f} MB/s"


def _floor(path: Path, hits_of: Callable[[bytearray, int], list[int]]) -> float:
    """Seconds to read ``path`` in the scanner's chunks, count its newlines and prefilter it."""
    chunk = bytearray(4 * 1024 * 1024)
    t0 = time.perf_counter()
    with path.open("rb", buffering=0) as raw:
        while got := raw.readinto(chunk):
            chunk.count(b"\n", 0, got)
            hits_of(chunk, got)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument(
        "--oom-fraction", type=float, default=0.001, help="share of records that are OOM records"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the generated log and print its path"
    )
    parser.add_argument(
        "--lines", action="store_true", help="also time the line-by-line path on the first 20 MB"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of diagnose's path and grep")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="oom-sentinel-bench-"))
    path = tmp / "comfyui.log"
    try:
        started = time.perf_counter()
        with path.open("wb") as out:
            writer = _LogWriter(out, args.oom_fraction, seed=20260102)
            writer.write(int(args.size_mb * 1024 * 1024))
        size = path.stat().st_size
        print(
            f"generated {size / 1e6:.1f} MB, {writer.records:,} records, {writer.oom_records:,} OOM records "
            f"({writer.oom_records / writer.records:.3%}) in {time.perf_counter() - started:.1f} s"
        )
        grep = shutil.which("grep")
        rss_before = _rss_kib()
        ours: list[float] = []
        theirs: list[float] = []
        grep_cpu: list[float] = []
        findings = 0
        count = b""
        marks: list[tuple[int, int]] = []
        for i in range(max(1, args.repeat)):  # interleaved: both tools see the same load
            t0 = time.perf_counter()
            findings = _diagnose_scan(path, size, marks if i == 0 else None)
            ours.append(time.perf_counter() - t0)
            if grep:
                t0, c0 = time.perf_counter(), _children_cpu()
                proc = subprocess.run(
                    [grep, "-E", "-c", GREP_PATTERN, str(path)], capture_output=True, check=False
                )
                theirs.append(time.perf_counter() - t0)
                grep_cpu.append(_children_cpu() - c0)
                count = proc.stdout.strip()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        mismatch = "" if findings == writer.oom_records else " -- MISMATCH"
        print(
            f"diagnose's path (open_log + scan_log; prefilter {DEFAULT_PREFILTER}, one process): "
            f"{size / min(ours) / 1e6:.0f} MB/s "
            f"({min(ours):.2f} s; {findings:,} events for {writer.oom_records:,} OOM records written{mismatch})"
        )
        print(f"  {len(ours)} runs: {_spread(ours, size)}")
        if grep:
            locale = os.environ.get("LC_ALL") or os.environ.get("LANG") or "unset"
            print(
                f"grep -E -c (equivalent pattern): {size / min(theirs) / 1e6:.0f} MB/s  "
                f"({min(theirs):.2f} s, {count.decode()} matching lines, locale {locale})"
            )
            print(f"  {len(theirs)} runs: {_spread(theirs, size)}")
            ratios = sorted(g / o for o, g in zip(ours, theirs, strict=True))
            print(
                f"ratio to grep: {min(theirs) / min(ours):.2f}x (best against best); per run "
                f"{ratios[0]:.2f}x .. {ratios[-1]:.2f}x, median {statistics.median(ratios):.2f}x"
            )
        else:
            print("grep not found: no ratio")

        quarters = ", ".join(f"{m / size:.0%}: {kib / 1024:.0f} MiB" for m, kib in marks)
        print(
            f"resident memory of diagnose's process: before {rss_before / 1024:.0f} MiB; {quarters}"
        )
        print(f"peak RSS of this process: {peak_kib / 1024:.0f} MiB (file: {size / 2**20:.0f} MiB)")

        print("other paths (best of 3):")
        one_process_cpu: dict[str, float] = {}
        for name in sorted(PREFILTERS):
            times = []
            cpu = []
            for _ in range(3):
                t0, c0 = time.perf_counter(), time.process_time()
                n = _path_scan(path, name)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            one_process_cpu[name] = min(cpu)
            print(
                f"  prefilter {name:<11}: {size / min(times) / 1e6:4.0f} MB/s"
                f"{'' if n == findings else ' -- MISMATCH'}"
            )
        if grep_cpu:
            # CPU seconds move far less than wall seconds with other jobs' load on a shared box
            best = min(grep_cpu)
            ratios = ", ".join(
                f"{name} {size / t / 1e6:.0f} MB/s ({best / t:.2f}x)"
                for name, t in sorted(one_process_cpu.items())
            )
            print(
                f"CPU time, one process, against grep's CPU time ({size / best / 1e6:.0f} MB/s): {ratios}"
            )
        with path.open("rb") as raw:
            data = raw.read(64 * 1024 * 1024)
        for name, hits_of in sorted(PREFILTERS.items()):
            buf = bytearray(data)
            t0 = time.perf_counter()
            hits_of(buf, len(buf))
            print(
                f"  prefilter {name} alone: {len(buf) / (time.perf_counter() - t0) / 1e6:.0f} MB/s"
            )

        # What no scan can skip: reading every byte, counting every newline (the findings'
        # line numbers) and the prefilter's pass. Its ratio to grep is the ceiling of any
        # scan that spends nothing at all on the records around the needles.
        floors = {}
        for name, hits_of in sorted(PREFILTERS.items()):
            floors[name] = min(_floor(path, hits_of) for _ in range(3))
        if theirs:
            ceiling = ", ".join(
                f"{name} {size / t / 1e6:.0f} MB/s ({min(theirs) / t:.2f}x grep)"
                for name, t in floors.items()
            )
            print(f"floor (read + count newlines + prefilter, no record work): {ceiling}")

        marked = _marked_lines(path, DEFAULT_PREFILTER)
        print(
            f"lines the prefilter marks: {marked:,}, {marked / max(1, writer.oom_records):.1f} per "
            "OOM record written (each opens or extends a window)"
        )

        if args.lines:
            limit = 20 * 1024 * 1024
            with path.open("rb") as raw:
                head = raw.read(limit)
            text_lines = head.decode("utf-8", "replace").splitlines()
            t0 = time.perf_counter()
            n = sum(1 for _ in iter_findings(text_lines))
            took = time.perf_counter() - t0
            print(
                f"iter_findings (line by line, the daemon's follower path) on 20 MB: {len(head) / took / 1e6:.0f} MB/s ({n} events)"
            )
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

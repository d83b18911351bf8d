"""How fast ``oom-sentinel diagnose`` reads a big ComfyUI log, next to grep, and in how much memory.

Generates a realistic ComfyUI-Manager log (default 200 MB: model loads, progress bars, prompt
timings, custom-node noise, non-OOM tracebacks, and 0.1 % of records OOM records of several
kinds with their tracebacks), scans it with ``classify.scan_stream`` (the path ``diagnose``
runs), runs ``grep -E -c`` with a pattern for the same OOM texts on the same file in the same
run, and prints MB/s, the ratio to grep, and resident memory at each quarter of the scan.

Targets (issue 2): ≥ 100 MB/s, ≥ 0.3 × grep, flat memory. Figures, not assertions: the test
suite never times anything.

    python benchmarks/classify_throughput.py [--size-mb 200] [--keep]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from oom_sentinel.daemon.classify import NEEDLES, iter_findings, scan_stream

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


class _Probe:
    """A binary file that records RSS each time a quarter of it has been read."""

    def __init__(self, stream: io.BufferedReader, size: int) -> None:
        self.stream = stream
        self.size = size
        self.marks: list[tuple[int, int]] = []
        self.next_mark = size // 4

    def _mark(self) -> None:
        while self.next_mark and self.stream.tell() >= self.next_mark:
            self.marks.append((self.next_mark, _rss_kib()))
            self.next_mark = self.next_mark + self.size // 4 if len(self.marks) < 4 else 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self._mark()
        return data

    def readinto(self, buffer: bytearray) -> int:
        got = self.stream.readinto(buffer)
        self._mark()
        return got


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
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs for both tools")
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

        rss_before = _rss_kib()
        best = float("inf")
        findings = 0
        marks: list[tuple[int, int]] = []
        for _ in range(max(1, args.repeat)):
            with path.open("rb") as raw:
                probe = _Probe(raw, size)
                t0 = time.perf_counter()
                found = sum(1 for _ in scan_stream(probe))  # type: ignore[arg-type]
                best = min(best, time.perf_counter() - t0)
                findings, marks = found, probe.marks
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ours = size / best / 1e6
        print(
            f"scan_stream (diagnose's path): {ours:.0f} MB/s  ({best:.2f} s; {findings:,} events for "
            f"{writer.oom_records:,} OOM records written{'' if findings == writer.oom_records else ' -- MISMATCH'})"
        )

        # the floor of this design: one bytes.find pass per needle, nothing else
        t0 = time.perf_counter()
        with path.open("rb") as raw:
            while chunk := raw.read(4 * 1024 * 1024):
                for needle in NEEDLES:
                    chunk.count(needle.encode())
        floor = size / (time.perf_counter() - t0) / 1e6
        print(f"needle prefilter alone ({len(NEEDLES)} bytes.find passes): {floor:.0f} MB/s")

        grep = shutil.which("grep")
        if grep:
            gbest = float("inf")
            count = b""
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                proc = subprocess.run(
                    [grep, "-E", "-c", GREP_PATTERN, str(path)], capture_output=True, check=False
                )
                gbest = min(gbest, time.perf_counter() - t0)
                count = proc.stdout.strip()
            theirs = size / gbest / 1e6
            locale = os.environ.get("LC_ALL") or os.environ.get("LANG") or "unset"
            print(
                f"grep -E -c (equivalent pattern): {theirs:.0f} MB/s  ({gbest:.2f} s, {count.decode()} matching lines, locale {locale})"
            )
            print(f"ratio to grep: {ours / theirs:.2f}x")
        else:
            print("grep not found: no ratio")

        quarters = ", ".join(f"{m / size:.0%}: {kib / 1024:.0f} MiB" for m, kib in marks)
        print(f"resident memory during the scan: before {rss_before / 1024:.0f} MiB; {quarters}")
        print(f"peak RSS of this process: {peak_kib / 1024:.0f} MiB (file: {size / 2**20:.0f} MiB)")

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

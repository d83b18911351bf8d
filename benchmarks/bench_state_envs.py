"""Per-state Python environments (bisect/state/envs.py) against a plain ``venv`` + ``pip install``.

The package set is real: this interpreter's own matplotlib, numpy, aiohttp, psutil and PyYAML
(and what they require), packed back into wheels (tests/wheels.py), plus ``sentinel-ballast``
in N versions, so N states differ by one package as a bisect's states do. ``--find-links DIR``
adds wheels of your own (e.g. a torch wheel) and ``--pin NAME==VER`` puts them in the set.
Everything is offline (``UV_OFFLINE``, ``pip --no-index``). Prints, for the same set:

* ``uv cold``   the first env, with an empty uv cache (unpacks every wheel into it)
* ``uv warm``   each further env (one package differs): hard links from the warm cache
* ``uv cached`` asking again for an env that exists (the bisect's second visit)
* ``pip``       ``python -m venv`` + ``pip install --no-index --find-links`` of the same set
* disk          N envs as the cache holds them (each inode once) against N full copies

Run: ``.venv/bin/python benchmarks/bench_state_envs.py [--states 5] [--find-links DIR --pin torch==2.13.0+cpu]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from wheels import ballast_source, repack_closure, write_wheel

from oom_sentinel.bisect.state.envs import EnvCache, disk_usage, lock_for

BASE = ("matplotlib", "aiohttp", "psutil", "PyYAML")


def _mib(n: int) -> str:
    return f"{n / 1024**2:,.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--states", type=int, default=5, help="envs to build (N)")
    ap.add_argument("--find-links", action="append", default=[], help="more wheel folders")
    ap.add_argument("--pin", action="append", default=[], help="NAME==VERSION to add to the set")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-envs-") as tmp:
        base = Path(tmp)
        wheels = base / "wheels"
        t = time.perf_counter()
        packages = repack_closure(BASE, wheels)
        for i in range(args.states):
            write_wheel(wheels, "sentinel-ballast", f"1.{i}", ballast_source(1.0 + i / 10, 1024**2))
        for pin in args.pin:
            name, _, version = pin.partition("==")
            packages[name.lower()] = version
        print(
            f"wheels: {len(packages) + 1} distributions packed in {time.perf_counter() - t:.1f} s"
        )
        for extra in args.find_links:  # one folder for uv and pip alike (hard links)
            for whl in Path(extra).glob("*.whl"):
                if not (wheels / whl.name).exists():
                    try:
                        os.link(whl, wheels / whl.name)
                    except OSError:  # another filesystem
                        shutil.copy2(whl, wheels / whl.name)
        links = [str(wheels)]
        os.environ.update(UV_OFFLINE="1", UV_NO_CONFIG="1", UV_FIND_LINKS=str(wheels))
        cache = EnvCache(base / "envs", sys.executable, max_bytes=1 << 50)
        locks = [lock_for({**packages, "sentinel-ballast": f"1.{i}"}) for i in range(args.states)]
        times = []
        for lock in locks:
            t = time.perf_counter()
            cache.python_for(lock)
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        cache.python_for(locks[0])
        cached = time.perf_counter() - t
        print(f"uv cold    {times[0]:7.2f} s  (first env, empty uv cache)")
        if len(times) > 1:
            print(f"uv warm    {statistics.median(times[1:]):7.2f} s  (median of {len(times) - 1})")
        print(f"uv cached  {cached * 1000:7.1f} ms")

        pip_times = []
        pip_envs = []
        for i, lock in enumerate(locks[: min(2, len(locks))]):
            venv = base / f"pip-{i}"
            req = base / f"req-{i}.txt"
            req.write_text("\n".join(ln for ln in lock.lines if not ln.startswith("-")) + "\n")
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index"]
            for link in links:
                cmd += ["--find-links", link]
            subprocess.run(
                [*cmd, "-r", str(req)],
                check=True,
                env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
            )
            pip_times.append(time.perf_counter() - t)
            pip_envs.append(venv)
        print(
            f"pip        {statistics.median(pip_times):7.2f} s  (python -m venv + pip install, median of {len(pip_times)})"
        )
        print(
            f"  → uv warm is {statistics.median(pip_times) / statistics.median(times[1:] or times):.0f}× faster than pip per state"
        )

        one_copy = disk_usage([pip_envs[0]])
        envs_only = disk_usage([cache.root / lk.digest() for lk in locks])
        with_cache = disk_usage([cache.root])
        n = len(locks)
        print(f"disk: {n} cached envs {_mib(envs_only)} (+ uv cache: {_mib(with_cache)} in all)")
        print(f"      {n} full copies  {_mib(one_copy * n)} ({_mib(one_copy)} each, pip)")
        print(f"  → {one_copy * n / max(with_cache, 1):.1f}× less disk with the cache counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())

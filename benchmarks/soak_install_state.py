"""Soak: many install-state captures in one process leave open fds, child processes and RSS flat.

GitPython keeps ``git cat-file`` processes, pipes and memory maps alive until a ``Repo`` is
closed (and reference cycles delay ``__del__``), so a daemon that captures on every change
and periodically would leak without care. This script builds a small install (ComfyUI-like
core plus a few git node packs, a registry pack, a folder and a file node), warms up, then
captures N times and prints fds, children and RSS before/after, with their ratios. For
contrast it runs the unclosed-Repo pattern the capture avoids and prints what that leaks.

    .venv/bin/python benchmarks/soak_install_state.py            # 10,000 captures
    .venv/bin/python benchmarks/soak_install_state.py -n 2000 --warmup 200

Figures compare within one run on one machine; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from install_builder import (  # noqa: E402
    Clock,
    build_core,
    clone_with_url,
    make_upstream,
)

from oom_sentinel.daemon.install.state import capture_install  # noqa: E402


def open_fds() -> int:
    """Open file descriptors of this process (Linux /proc; psutil elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return psutil.Process().num_fds() if hasattr(psutil.Process, "num_fds") else -1


def small_install(base: Path, git_nodes: int = 3) -> Path:
    """Core + ``git_nodes`` git packs + one registry pack, one folder, one file node."""
    clock = Clock()
    _up, root, _shas = build_core(base, clock)
    cn = root / "custom_nodes"
    cn.mkdir()
    for i in range(git_nodes):
        up = base / "upstream" / f"pack-{i}"
        make_upstream(up, f"pack-{i}", clock)
        clone_with_url(up, cn / f"pack-{i}", f"https://github.com/o/pack-{i}.git", clock)
    (cn / "reg").mkdir()
    (cn / "reg" / ".tracking").write_text("__init__.py\n")
    (cn / "reg" / "pyproject.toml").write_text('[project]\nname = "reg"\nversion = "1.0.0"\n')
    (cn / "folder").mkdir()
    (cn / "folder" / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "single.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    return root


def measure() -> tuple[int, int, int]:
    gc.collect()
    proc = psutil.Process()
    return open_fds(), len(proc.children(recursive=True)), proc.memory_info().rss


def soak(root: Path, count: int, warmup: int, report_every: int = 0) -> dict[str, float]:
    """Capture ``warmup`` times, then ``count`` times; return the figures."""
    for _ in range(warmup):
        capture_install(root)
    fds0, children0, rss0 = measure()
    rss_tenth = rss0
    start = time.perf_counter()
    for i in range(1, count + 1):
        capture_install(root)
        if i == max(count // 10, 1):
            rss_tenth = psutil.Process().memory_info().rss
        if report_every and i % report_every == 0:
            fds, children, rss = measure()
            print(f"  {i:>6} captures: fds={fds} children={children} rss={rss / 2**20:.1f} MiB")
    elapsed_s = time.perf_counter() - start
    fds1, children1, rss1 = measure()
    return {
        "count": count,
        "fds_before": fds0,
        "fds_after": fds1,
        "children_before": children0,
        "children_after": children1,
        "rss_before_bytes": rss0,
        "rss_after_bytes": rss1,
        "rss_ratio": rss1 / rss0,
        # the allocator settles over the first captures; a leak keeps growing after that
        "rss_ratio_after_first_tenth": rss1 / rss_tenth,
        "capture_ms": elapsed_s / count * 1000,
    }


def unclosed_repo_pattern(root: Path, count: int) -> tuple[int, int]:
    """What the capture avoids: ``Repo(...).head.commit`` on Repos that stay alive without
    ``close()`` (held by a cache, or by a reference cycle the collector has not reached).
    Returns the growth in (fds, children) after ``count`` of them, then closes them all."""
    import git

    fds0, children0, _ = measure()
    pack = next(p for p in (root / "custom_nodes").iterdir() if (p / ".git").is_dir())
    alive: list[git.Repo] = []
    try:
        for _ in range(count):
            repo = git.Repo(str(pack))
            _sha = repo.head.commit.hexsha  # starts a persistent `git cat-file` process
            alive.append(repo)
        fds1, children1, _ = measure()
    finally:
        for repo in alive:
            repo.close()
    return fds1 - fds0, children1 - children0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--count", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--git-nodes", type=int, default=3)
    args = parser.parse_args()
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory(prefix="oom-sentinel-soak-") as tmp:
        root = small_install(Path(tmp), args.git_nodes)
        print(
            f"soak: {args.count} captures of an install with {args.git_nodes} git node packs "
            f"after {args.warmup} warm-up captures ({git_version.strip()}, Python {sys.version.split()[0]})"
        )
        r = soak(root, args.count, args.warmup, report_every=max(args.count // 10, 1))
        print(f"open fds:        {r['fds_before']} -> {r['fds_after']}")
        print(f"child processes: {r['children_before']} -> {r['children_after']}")
        print(
            f"RSS:             {r['rss_before_bytes'] / 2**20:.1f} MiB -> "
            f"{r['rss_after_bytes'] / 2**20:.1f} MiB (ratio {r['rss_ratio']:.3f})"
        )
        print(
            f"RSS ratio from {args.count // 10} captures to the end: {r['rss_ratio_after_first_tenth']:.3f}"
        )
        print(f"per capture:     {r['capture_ms']:.1f} ms")
        dfds, dchildren = unclosed_repo_pattern(root, 50)
        print(
            f"contrast, 50 live unclosed Repo(...).head.commit: +{dfds} fds, +{dchildren} children"
        )


if __name__ == "__main__":
    main()

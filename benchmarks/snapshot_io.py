"""What writing and reading ``snapshot.json`` costs: the daemon builds one per incident (on the
incident path, where the memory it records is scarce), ``snapshots list`` and the restart
recovery read the newest hundreds, ``snapshots show`` and ``oom-bisect <id>`` read one fully.

Figures per snapshot, for a realistic one (the tracker's merged CUDA OOM, three GPU processes,
a process section, an install state with 40 custom nodes and a suspected regression with both
endpoint states and their diff):

* ``build``: ``build_snapshot_json`` (the document, redacted, JSON-ready);
* ``write``: ``write_snapshot`` (every file, fsynced, renamed into place);
* ``load``: ``load_snapshot`` with the full check (``show``, the bisect);
* ``list``: ``list_snapshots`` over ``--count`` directories, per snapshot (the quick check);
* ``bisect``: ``read_snapshot_start`` on a loaded snapshot (states, flags, budget, card).

    .venv/bin/python benchmarks/snapshot_io.py [--count 200] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import snapshot_samples as samples  # noqa: E402

from oom_sentinel.bisect.state.from_snapshot import read_snapshot_start  # noqa: E402
from oom_sentinel.daemon.incidents.snapshot import (  # noqa: E402
    build_snapshot_json,
    list_snapshots,
    load_snapshot,
    write_snapshot,
)
from oom_sentinel.daemon.install.state import CoreState, CustomNode, InstallState  # noqa: E402


def _state(core: str, bump: int) -> InstallState:
    nodes = tuple(
        CustomNode(f"pack_{i:02d}", "git", commit=f"{(i + bump) % 16:x}" * 40) for i in range(40)
    )
    return InstallState(CoreState(commit=core * 40), nodes=nodes, pip=("torch==2.5.1",) * 30)


def _content() -> samples.SnapshotContent:
    good, bad = _state("a", 0), _state("b", 1)
    regression = samples.suspected_regression(good, bad)
    sections = {
        "process": {
            "pid": 4242,
            "argv": ["/opt/ComfyUI/.venv/bin/python", "main.py", "--lowvram"],
            "interpreter": "/opt/ComfyUI/.venv/bin/python",
            "exit_code": None,
        },
        "install_state": bad.to_dict(),
        "regression": regression,
    }
    return replace(samples.content(), sections=sections)


def _per_call(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm caches (the schema, the validator)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200, help="snapshots to list")
    parser.add_argument("--repeat", type=int, default=2000, help="calls per in-memory figure")
    args = parser.parse_args()
    content = _content()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "snapshots"
        build = _per_call(
            lambda: build_snapshot_json(content, "20260102T101113Z_gpu_KSampler"), args.repeat
        )
        start = time.perf_counter()
        refs = [write_snapshot(root, content) for _ in range(args.count)]
        write = (time.perf_counter() - start) / args.count
        load = _per_call(lambda: load_snapshot(refs[0].path), args.repeat)
        snap = load_snapshot(refs[0].path)
        bisect = _per_call(lambda: read_snapshot_start(snap), args.repeat)
        start = time.perf_counter()
        listed, problems = list_snapshots(root)
        listing = (time.perf_counter() - start) / args.count
        assert len(listed) == args.count and not problems, problems
        size = (refs[0].path / "snapshot.json").stat().st_size
    print(f"snapshot.json: {size:,} bytes")
    for name, seconds in (
        ("build", build),
        ("write", write),
        ("load", load),
        ("list", listing),
        ("bisect", bisect),
    ):
        print(f"{name:>7}: {seconds * 1e6:9.1f} µs per snapshot")


if __name__ == "__main__":
    main()

"""What install-state history costs: a capture after a change (worker thread), and what the
main loop pays per recorded run (``state_id_for_run``) and per snapshot (``snapshot_parts``:
the regression check over 500 runs and a diff with commit ranges).

    .venv/bin/python benchmarks/install_history.py [--nodes 30] [--observations 5000]

Prints figures; compare them within one run (the machine's speed varies).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from standin_repos import build_core_repo, build_node_repo

from oom_sentinel.config.settings import InstallStateSettings
from oom_sentinel.daemon.install.history import (
    InstallStateTracker,
    record_capture,
    record_observation,
    state_for_run,
)
from oom_sentinel.daemon.install.state import capture_install
from oom_sentinel.daemon.store.db import Store
from oom_sentinel.daemon.store.runs import RunRecord, record_run


def ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    return f"median {statistics.median(samples) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--observations", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        core = build_core_repo(base / "up" / "ComfyUI", 20, bad_commit_index=None)
        install = base / "ComfyUI"
        subprocess.run(["git", "clone", "-q", str(core.path), str(install)], check=True)
        packs = []
        for i in range(args.nodes):
            pack = build_node_repo(base / "up" / f"pack-{i}", 10, seed=i)
            dest = install / "custom_nodes" / f"pack-{i}"
            subprocess.run(["git", "clone", "-q", str(pack.path), str(dest)], check=True)
            subprocess.run(["git", "-C", str(dest), "reset", "-q", "--hard", pack.commits[5]])
            packs.append((pack, dest))

        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            capture_install(install)
            times.append(time.perf_counter() - t0)
        print(f"git-only capture, {args.nodes} git packs: {ms(times)}")

        store = Store.open(base / "data")
        before = capture_install(install)
        record_capture(store, "main", before, at_s=1.0)
        # a long history: alternate between two states
        subprocess.run(["git", "-C", str(packs[0][1]), "pull", "-q", "--ff-only"], check=True)
        after = capture_install(install)
        for i in range(args.observations):
            record_observation(
                store, "main", after if i % 2 else before, at_s=10.0 + i, source="capture"
            )
        times = []
        for i in range(200):
            t0 = time.perf_counter()
            state_for_run(store, "main", started_s=10.0 + i * 7, process_start_s=5.0 + i * 7)
            times.append(time.perf_counter() - t0)
        print(f"state_for_run over {args.observations} observations: {ms(times)}")

        for i in range(500):
            run = RunRecord(
                "main", f"p{i}", "success", 1.0 + i, 2.0 + i, f"fp{i % 20}", "h", 1, 2, 3,
                None, None, None, None, 0, 3, 1, before.state_id, None, 3.0 + i,
            )  # fmt: skip
            record_run(store, run)
        record_capture(store, "main", after, at_s=1e9)
        tracker = InstallStateTracker(
            store, InstallStateSettings(probe_interpreter=False), use_observer=False
        )
        tracker.start()
        tracker.update([_Inst("main", str(install))])
        tracker.settle("main", 60, everything=True)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            parts = tracker.snapshot_parts(
                "main",
                prompt={"1": {"class_type": "X", "inputs": {}}},
                started_s=2e9,
                process_start_s=None,
            )
            times.append(time.perf_counter() - t0)
        tracker.close()
        assert parts is not None and parts.verdict is not None and parts.verdict.suspected
        print(f"snapshot_parts (500 runs, diff with a commit range): {ms(times)}")
        store.close()


class _Inst:
    def __init__(self, name: str, path: str) -> None:
        self.name, self.path, self.python, self.pid, self.process = name, path, None, None, None


if __name__ == "__main__":
    main()

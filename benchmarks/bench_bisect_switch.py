"""Per-step cost of moving the bisect workspace to the next state, against a fresh clone.

Builds a 2,000-commit core repo (about 400 files, like ComfyUI's tree) with two custom-node
repos, runs a real search (plan.py) for a culprit, and times for every step:

* ``switch``  Workspace.switch to the step's state (checkout + clean in shared clones)
* ``launch``  Workspace.launch: reading cli_args.py, filtering flags, picking a port
* ``clone``   what a naive harness does instead: a fresh local ``git clone`` + checkout

Prints medians and the ratio, plus measurements made vs ⌈log2 N⌉. Run:

    .venv/bin/python benchmarks/bench_bisect_switch.py [--commits 2000]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bisect_git import build_history, cli_args_text, git, node_history

from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.plan import Found, Plan, Test, next_step
from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.state.states import scan_install


def build(base: Path, n: int) -> Path:
    root = base / "ComfyUI"
    commits = []
    for i in range(n):
        changes: dict[str, str | None] = {
            f"comfy/mod_{i % 400:03d}.py": f"# revision {i}\n" + "x = 1\n" * 50,
            f"comfy_extras/extra_{(i * 7) % 400:03d}.py": f"# revision {i}\n" + "y = 2\n" * 80,
            "memory.txt": f"{i}\n",
            "comfy/cli_args.py": cli_args_text(reserve_vram=i > n // 3, database=i > n // 2),
        }
        if i == 0:
            changes["main.py"] = "print('main')\n"
            changes[".gitignore"] = "/custom_nodes/*\n"
            for k in range(400):
                changes[f"comfy/mod_{k:03d}.py"] = "x = 1\n" * 50
                changes[f"comfy_extras/extra_{k:03d}.py"] = "y = 2\n" * 80
        commits.append((f"change {i}", changes))
    build_history(root, commits)
    for name in ("node_a", "node_b"):
        build_history(root / "custom_nodes" / name, node_history(name, 100))
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--culprit", type=int, default=1337)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-switch-"))
    try:
        t0 = time.perf_counter()
        root = build(base, args.commits)
        print(
            f"built a {args.commits}-commit core + 2 node repos in {time.perf_counter() - t0:.1f} s"
        )
        install = scan_install(root)
        core = git(root, "rev-list", "--reverse", "HEAD").split()
        good = install.current_state().with_values({"comfyui": core[0]})
        bad = install.current_state()
        plan = Plan.build(good, bad, {"comfyui": core[1:]})
        t0 = time.perf_counter()
        ws = Workspace.create(base / "ws", install)
        create_s = time.perf_counter() - t0
        switch_s, launch_s, clone_s = [], [], []
        steps = 0
        while True:
            step = next_step(plan)
            if not isinstance(step, Test):
                break
            steps += 1
            t0 = time.perf_counter()
            ws.switch(step.state)
            switch_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ws.launch(["--lowvram", "--reserve-vram", "1", "--listen", "0.0.0.0"])
            launch_s.append(time.perf_counter() - t0)
            fresh = base / f"clone-{steps}"
            t0 = time.perf_counter()
            subprocess.run(
                ["git", "clone", "-q", "--no-checkout", str(root), str(fresh)], check=True
            )
            subprocess.run(
                ["git", "-C", str(fresh), "checkout", "-q", step.state.comfyui], check=True
            )
            clone_s.append(time.perf_counter() - t0)
            shutil.rmtree(fresh)
            verdict = Verdict.NEW if core.index(step.state.comfyui) >= args.culprit else Verdict.OLD
            plan = plan.observe(step.state, verdict)
        assert isinstance(next_step(plan), Found)
        n = args.commits - 1
        med_switch = statistics.median(switch_s)
        med_launch = statistics.median(launch_s)
        med_clone = statistics.median(clone_s)
        print(f"workspace creation (shared clone of the core): {create_s * 1000:.0f} ms")
        print(
            f"switch per step   median {med_switch * 1000:.0f} ms  (max {max(switch_s) * 1000:.0f} ms)"
        )
        print(f"launch spec       median {med_launch * 1000:.1f} ms")
        print(
            f"switch + launch   median {(med_switch + med_launch) * 1000:.0f} ms  (target <= 1000 ms)"
        )
        print(f"fresh clone+checkout per step  median {med_clone * 1000:.0f} ms")
        print(f"ratio fresh clone / switch: {med_clone / med_switch:.1f}x")
        print(
            f"measurements: {steps} (2 endpoints + {steps - 2} search) "
            f"vs ceil(log2 {n}) = {math.ceil(math.log2(n))}"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

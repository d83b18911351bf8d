"""The fast-prompt scenario (not a test module): N prompts of 5-25 ms through the stand-in, one
in four an OOM on the 8 GiB fake GPU, ``oom-sentinel run`` SIGKILLed at ``kill_at`` and started
again at ``back_at`` (the prompts between ran unwatched). Used by
tests/test_watch_fast_prompts.py (which asserts) and benchmarks/fast_prompts.py (which prints).
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon_harness import Daemon, load_snapshot_json, runs, snapshot_dirs, wait_for
from standin_proc import STANDIN_DIR, start_standin

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir
from oom_sentinel.daemon.store.runs import RunRecord

MIB = 1024 * 1024


def fast_prompt(i: int, rng: random.Random) -> tuple[dict[str, Any], bool]:
    """A 5-25 ms prompt; every fourth one asks the 8 GiB fake GPU for 64 GiB (an OOM)."""
    oom = i % 4 == 3
    if oom:
        node = {"class_type": "AllocateVRAM", "inputs": {"mib": 64 * 1024, "value": i}}
    else:
        seconds = round(rng.uniform(0.005, 0.025), 4)
        node = {"class_type": "Sleep", "inputs": {"seconds": seconds, "value": i}}
    return {"1": node, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}, oom


def _queue_empty(srv: FastServer) -> bool:
    q = srv.get_json("/queue")
    return not q["queue_running"] and not q["queue_pending"]


@dataclass
class FastServer:
    """A ComfyUI to send the prompts to (the stand-in, or a real one), and what it runs."""

    url: str
    get_json: Callable[[str], Any]
    #: posts one prompt, returns its id
    post: Callable[[dict[str, Any]], str]
    kill: Callable[[], None]
    #: prompt ``i``, and whether it runs out of memory
    make_prompt: Callable[[int, random.Random], tuple[dict[str, Any], bool]]
    env: dict[str, str] = field(default_factory=dict)


def standin_server(tmp: Path) -> FastServer:
    """The stand-in on the 8 GiB fake GPU, recognised by the daemon as ComfyUI."""
    gpu = FakeGpuDir(tmp / "gpu").create([FakeDevice(0, "NVIDIA RTX 4060", 8192 * MIB)])
    install = _install(tmp / "ComfyUI")
    srv = start_standin(tmp / "base", code_dir=install, base_directory=False, fake_gpu=gpu.root)

    def post(prompt: dict[str, Any]) -> str:
        return srv.post_prompt(prompt)

    return FastServer(
        srv.url, srv.get_json, post, srv.kill, fast_prompt, {"OOM_SENTINEL_FAKE_GPU": str(gpu.root)}
    )


def _install(path: Path) -> Path:
    """The stand-in as an install the daemon recognises as ComfyUI (so it knows its pid)."""
    path.mkdir(parents=True)
    for source in STANDIN_DIR.glob("*.py"):
        shutil.copy(source, path / source.name)
    (path / "comfyui_version.py").write_text('__version__ = "0.8.0"\n')
    return path


@dataclass
class Figures:
    prompts: int
    ooms: set[str]
    runs: list[RunRecord]
    lost: set[str]
    doubled: set[str]
    oom_rows: set[str]
    snapshots: int
    snapshot_prompts: Counter[str] = field(default_factory=Counter)
    no_incident_id: set[str] = field(default_factory=set)
    server_ms: tuple[int, int] = (0, 0)
    took_s: float = 0.0
    daemon_log: str = ""

    def line(self, kill_at: int, back_at: int) -> str:
        return (
            f"{self.prompts} prompts ({len(self.ooms)} OOMs), server-side "
            f"{self.server_ms[0]}-{self.server_ms[1]} ms each; daemon SIGKILLed after {kill_at}, "
            f"back after {back_at}; {len(self.runs)} run rows, {len(self.lost)} lost, "
            f"{len(self.doubled)} doubled; {len(self.oom_rows)} oom rows, {self.snapshots} "
            f"snapshots, {len(self.ooms - set(self.snapshot_prompts))} OOMs without an "
            f"incident, {len(self.no_incident_id)} oom rows without an incident id; "
            f"{self.took_s:.1f} s"
        )


def run_fast_prompts(
    tmp: Path,
    prompts: int = 600,
    kill_at: int = 200,
    back_at: int = 400,
    start_server: Callable[[Path], FastServer] = standin_server,
) -> Figures:
    srv = start_server(tmp / "server")
    daemon = Daemon(
        tmp,
        comfyui=[srv.url],
        config=(
            "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
            "[incidents]\nstorm_window_s = 0\n"
        ),
        env=srv.env,
    )
    rng = random.Random(11)
    posted: dict[str, bool] = {}  # prompt id -> an OOM
    t0 = time.monotonic()
    try:
        daemon.start()
        wait_for(lambda: "is up" in daemon.stderr(), 30, "the API")
        for i in range(prompts):
            if i == kill_at:
                daemon.stop(signal.SIGKILL)
            if i == back_at:
                wait_for(lambda: _queue_empty(srv), 120, "the unwatched prompts to run")
                daemon.start()
            prompt, oom = srv.make_prompt(i, rng)
            posted[srv.post(prompt)] = oom
        limit = 10 * prompts
        wait_for(lambda: _queue_empty(srv), 120, "every prompt to run")
        wait_for(
            lambda: len(runs(daemon.data_dir, limit=limit)) >= prompts,
            180,
            f"{prompts} run rows (have {len(runs(daemon.data_dir, limit=limit))})",
        )
        ooms = {pid for pid, oom in posted.items() if oom}
        wait_for(lambda: len(snapshot_dirs(daemon.data_dir)) >= len(ooms), 120, "the snapshots")
        time.sleep(1.0)  # an extra row or snapshot would show now (an absence: a wait)
        rows = runs(daemon.data_dir, limit=limit)
        took = time.monotonic() - t0
        durations = [
            h["status"]["messages"][-1][1]["timestamp"] - h["status"]["messages"][0][1]["timestamp"]
            for h in srv.get_json("/history").values()
        ]
        per_prompt: Counter[str] = Counter(r.prompt_id for r in rows)
        snapshot_prompts: Counter[str] = Counter()
        snaps = snapshot_dirs(daemon.data_dir)
        for snap in snaps:
            for obs in load_snapshot_json(snap)["observations"]:
                if obs["source"] == "api":
                    snapshot_prompts[obs["evidence"]["prompt_id"]] += 1
        assert daemon.stop() == 0
        return Figures(
            prompts=len(posted),
            ooms=ooms,
            runs=rows,
            lost=set(posted) - set(per_prompt),
            doubled={p for p, n in per_prompt.items() if n > 1},
            oom_rows={r.prompt_id for r in rows if r.outcome == "oom"},
            snapshots=len(snaps),
            snapshot_prompts=snapshot_prompts,
            no_incident_id={r.prompt_id for r in rows if r.outcome == "oom" and not r.incident_id},
            server_ms=(min(durations), max(durations)),
            took_s=took,
            daemon_log=daemon.all_stderr(),
        )
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        srv.kill()

"""``oom-bisect`` end to end: the real command, a user's install made of real git histories of
the stand-in ComfyUI (a 320-commit core and two custom-node packs in ``custom_nodes/``), a
fresh stand-in server per measurement, the fake GPU for "VRAM" and real RAM for the RAM case.

Every test asserts the answer, the number of measurements, and that the user's repos are
byte-for-byte what they were (HEAD, refs, index, status, stash, config), also after Ctrl-C.

    core:   0 ─ 1 ─ … ─ 200 (memory ×1.6) ─ … ─ 319 = HEAD        (per test: where it turns bad,
    PackA:  0 ─ … ─ 39 = HEAD    PackB: 0 ─ … ─ 39 = HEAD            which commits won't start)
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_json import json_answer
from proc_waits import wait_while_running
from standin_repos import (
    BuiltRepo,
    build_core_repo,
    build_node_repo,
    clone_node_into,
    repo_fingerprint,
)

from oom_sentinel.bisect.search.plan import Found, Plan, Test, next_step
from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.state.states import State
from oom_sentinel.daemon.comfy.interpreter import InterpreterFacts
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

pytestmark = pytest.mark.slow

GIB = 1024**3
MIB = 1024**2
CONTEXT_MIB = 312  # the stand-in's CUDA context on the fake GPU


def vram_workflow(mib: int = 1000, hold_s: float = 0.25) -> dict[str, Any]:
    return {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": mib}},
        "2": {"class_type": "Sleep", "inputs": {"seconds": hold_s, "value": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


def ram_workflow(mib: int = 200) -> dict[str, Any]:
    """Host RAM only (run with ``--flags --cpu``): the process peak is what is bisected."""
    return {
        "1": {"class_type": "AllocateRAM", "inputs": {"mib": mib}},
        "2": {"class_type": "Sleep", "inputs": {"seconds": 0.1, "value": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


@dataclass
class UserInstall:
    root: Path
    core: BuiltRepo
    nodes: dict[str, BuiltRepo]
    base: Path
    env: dict[str, str] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)

    def repos(self) -> list[Path]:
        return [self.root, *(self.root / "custom_nodes" / n for n in self.nodes)]

    def fingerprints(self) -> dict[str, Any]:
        return {str(p): repo_fingerprint(p) for p in self.repos()}

    def workflow(self, prompt: dict[str, Any], name: str = "wf.json") -> str:
        path = self.base / name
        path.write_text(json.dumps(prompt))
        return str(path)

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "oom_sentinel.bisect", *args]

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def run_args(self, *args: str) -> list[str]:
        """``run`` on this install with this interpreter, then ``args``."""
        return ["run", "--comfyui", str(self.root), "--python", sys.executable, *args]

    def core_span(self, workflow: str, good: int = 0, bad: int | None = None) -> list[str]:
        """``workflow`` bisected over the core alone, from its commit ``good`` to its commit
        ``bad`` (HEAD by default; the widest search by default)."""
        good_at = f"comfyui={self.core.commits[good]}"
        bad_at = "comfyui=HEAD" if bad is None else f"comfyui={self.core.commits[bad]}"
        return ["--workflow", workflow, "--good", good_at, "--bad", bad_at]

    def spawn(self, *args: str, stdout: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
        """``oom-bisect run ... args`` in the background, to be signalled mid-run: stdin closed,
        stderr piped (what it said before it died); reap it with proc_waits.reap."""
        return subprocess.Popen(
            self.cmd(*self.run_args(*args)),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )

    def bisect(self, *args: str, **kw: Any) -> tuple[int, dict[str, Any], str]:
        """``oom-bisect run ... --json``: (exit status, the final JSON object, stderr)."""
        proc = self.run(*self.run_args("--json", *args), **kw)
        return json_answer(proc)

    def measurements(self) -> list[dict[str, Any]]:
        (root,) = (self.base / "cache" / "bisect").glob("ComfyUI-*")
        path = root / "session" / "measurements.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def assert_untouched(self) -> None:
        assert self.fingerprints() == self.before, "oom-bisect changed the user's repos"
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info.get("cmdline") or [])
            assert str(self.base / "cache") not in cmd, f"ComfyUI left running: {cmd}"


def make_install(
    base: Path,
    *,
    fake_gpu: bool = True,
    core_kw: dict[str, Any] | None = None,
    node_kw: dict[str, dict[str, Any]] | None = None,
) -> UserInstall:
    core = build_core_repo(base / "ComfyUI", 320, **(core_kw or {"bad_commit_index": 200}))
    nodes = {}
    for i, name in enumerate(("PackA", "PackB")):
        kw = {"seed": 10 + i, "node_class": f"{name}Passthrough", **(node_kw or {}).get(name, {})}
        nodes[name] = build_node_repo(base / "src" / name, 40, **kw)
        clone_node_into(core.path, nodes[name])
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OOM_STANDIN_", "OOM_SENTINEL_"))
    }
    env["OOM_SENTINEL_CACHE_DIR"] = str(base / "cache")
    env["PYTHONUNBUFFERED"] = "1"
    if fake_gpu:
        FakeGpuDir(base / "gpu").create([FakeDevice(0, "Fake RTX 3060", 4 * GIB)])
        env["OOM_SENTINEL_FAKE_GPU"] = str(base / "gpu")
    inst = UserInstall(core.path, core, nodes, base, env)
    inst.before = inst.fingerprints()
    return inst


def log2(n: int) -> int:
    return math.ceil(math.log2(n))


def planned_measurements(
    good: State, bad: State, commits: list[str], is_bad: Callable[[State], bool]
) -> int:
    """How many states the search measures for one culprit in the core, without Ctrl-C."""
    plan = Plan.build(good, bad, {"comfyui": commits})
    n = 0
    while isinstance(step := next_step(plan), Test):
        n += 1
        plan = plan.observe(step.state, Verdict.NEW if is_bad(step.state) else Verdict.OLD)
    assert isinstance(step, Found)
    return n


def culprit(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["repo"], c["commit"]) for c in doc["culprits"]]


def say(case: str, doc: dict[str, Any], bound: int | None = None) -> None:
    """The figures a reader wants (shown with ``pytest -s``)."""
    limit = "" if bound is None else f" (bound {bound})"
    print(f"\n[e2e] {case}: {doc['result']}, {doc['measurements']} measurement(s){limit}")


# ---------------------------------------------------------------------------- the cases


def test_culprit_in_core(tmp_path: Path) -> None:
    inst = make_install(tmp_path)
    core = inst.core
    code, doc, err = inst.bisect(*inst.core_span(inst.workflow(vram_workflow())))
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert doc["culprits"][0]["subject"] == core.subjects[200]
    n = len(core.commits) - 1
    assert doc["measurements"] <= log2(n) + 3, doc["measurements"]
    good, bad = doc["steps"][0], doc["steps"][1]
    assert good["peak_vram_bytes"] == (CONTEXT_MIB + 1000) * MIB  # NVML's view: context + node
    assert bad["peak_vram_bytes"] >= (CONTEXT_MIB + 1000 * 1.1) * MIB
    report = json.loads(Path(doc["report"]["json"]).read_text())
    assert report["culprits"][0]["files"] == ["standin_tuning.json"]
    assert "<svg" in Path(doc["report"]["html"]).read_text()
    say("culprit_in_core", doc)
    inst.assert_untouched()


def test_culprit_in_a_custom_node(tmp_path: Path) -> None:
    inst = make_install(
        tmp_path,
        core_kw={"bad_commit_index": None},
        node_kw={"PackB": {"bad_commit_index": 23, "bad_scale": ("AllocateVRAM", 1.6)}},
    )
    pack = inst.nodes["PackB"]
    code, doc, err = inst.bisect(
        "--workflow",
        inst.workflow(vram_workflow()),
        "--good",
        f"node:PackB={pack.commits[0]}",
        "--bad",
        "node:PackB=HEAD",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("node:PackB", pack.commits[23])]
    assert doc["culprits"][0]["subject"] == "Cache AllocateVRAM intermediates for speed"
    assert doc["measurements"] <= log2(len(pack.commits) - 1) + 3
    say("culprit_in_a_custom_node", doc)
    inst.assert_untouched()


def test_a_node_that_breaks_only_with_the_new_core_names_both(tmp_path: Path) -> None:
    inst = make_install(
        tmp_path,
        core_kw={"bad_commit_index": None, "feature_from": {"pinned_cache": 150}},
        node_kw={
            "PackA": {
                "bad_commit_index": 20,
                "bad_scale": ("AllocateVRAM", 1.6),
                "requires_core_feature": "pinned_cache",
            }
        },
    )
    core, pack = inst.core, inst.nodes["PackA"]
    code, doc, err = inst.bisect(
        "--workflow",
        inst.workflow(vram_workflow()),
        "--good",
        f"comfyui={core.commits[100]} node:PackA={pack.commits[5]}",
        "--bad",
        "comfyui=HEAD node:PackA=HEAD",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    # neither change alone breaks it: the minimal set is both, each with its first bad commit
    assert sorted(culprit(doc)) == [
        ("comfyui", core.commits[150]),
        ("node:PackA", pack.commits[20]),
    ]
    minimize = [s for s in doc["steps"] if "repos are needed" in (s["comment"] or "")]
    assert len(minimize) == 2 and all(s["verdict"] == "good" for s in minimize)
    together = {c["repo"]: c["together"] for c in doc["culprits"]}
    assert together == {"comfyui": ["node:PackA"], "node:PackA": ["comfyui"]}
    assert doc["search"]["groups"] == [["comfyui", "node:PackA"]]
    # + one run to the end per culprit whose verdict run stopped early (for its own Δ)
    reruns = doc["search"]["culprit_reruns"]
    assert reruns == 2 and all(not c["delta"]["lower_bound"] for c in doc["culprits"])
    assert doc["measurements"] <= 2 + 2 + log2(319 - 100) + log2(39 - 5) + reruns
    assert doc["search"]["within_bound"]
    say("a_node_that_breaks_only_with_the_new_core_names_both", doc)
    inst.assert_untouched()


def test_commits_that_do_not_start_around_the_culprit_give_an_honest_list(tmp_path: Path) -> None:
    inst = make_install(tmp_path, core_kw={"bad_commit_index": 200, "untestable_range": (196, 204)})
    core = inst.core
    code, doc, err = inst.bisect(*inst.core_span(inst.workflow(vram_workflow())))
    assert (code, doc["result"]) == (5, "ambiguous"), err[-3000:]
    # the culprit (200) itself does not start: the first bad one could be any of 196..204
    assert [c["commit"] for c in doc["candidates"]] == list(core.commits[196:205])
    skipped = [s for s in doc["steps"] if s["kind"] == "skip"]
    assert skipped and all(
        s["reason"].startswith("won't start: exited with status 1") for s in skipped
    )
    assert "only skipped commits are left" in err
    say("commits_that_do_not_start_around_the_culprit_give_an_honest_list", doc)
    inst.assert_untouched()


def test_commits_that_do_not_start_away_from_the_culprit_are_skipped(tmp_path: Path) -> None:
    # the first probe (commit 160) falls in a broken range: skipped, and the answer stays exact
    inst = make_install(tmp_path, core_kw={"bad_commit_index": 200, "untestable_range": (158, 163)})
    core = inst.core
    code, doc, err = inst.bisect(*inst.core_span(inst.workflow(vram_workflow())))
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    skipped = [s for s in doc["steps"] if s["kind"] == "skip"]
    assert 1 <= len(skipped) <= 5
    assert doc["measurements"] <= log2(319) + 3 + len(skipped)
    say("commits_that_do_not_start_away_from_the_culprit_are_skipped", doc)
    inst.assert_untouched()


def test_memory_noise_with_repeat_takes_the_median(tmp_path: Path) -> None:
    # ±5 % noise on every allocation; threshold = good median × 1.10. A good state measures at
    # most (312 + 1050) / (312 + 950) = 1.079 × the good endpoint, a bad one at least
    # (312 + 1520) / (312 + 1050) = 1.345 ×: every verdict is certain, the peaks are not.
    inst = make_install(tmp_path, core_kw={"bad_commit_index": 200, "noise_fraction": 0.05})
    core = inst.core
    code, doc, err = inst.bisect(
        *inst.core_span(inst.workflow(vram_workflow()), 150, 260),
        "--repeat",
        "3",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    # two agreeing runs decide the median of three; the third is never needed here
    assert {s["runs"] for s in doc["steps"]} == {2}
    # plus the culprit's state once more, to the end, for its Δ
    assert doc["search"]["culprit_reruns"] == 1
    assert doc["measurements"] == 2 * len(doc["steps"]) + 1
    peaks: dict[str, set[int]] = {}
    for m in inst.measurements():
        if m["event"] == "done" and not m["stopped_early"]:
            peaks.setdefault(m["state"]["comfyui"], set()).add(m["peaks"]["vram_bytes"])
    assert any(len(v) > 1 for v in peaks.values()), "the noise did not show"
    say("memory_noise_with_repeat_takes_the_median", doc)
    inst.assert_untouched()


def test_repeat_auto_measures_the_noise_and_rechecks_the_culprit(tmp_path: Path) -> None:
    # the same ±5 % noise, --repeat auto: the good endpoint runs 3 times to measure the band;
    # a state is repeated only while its median is within the band of the threshold, and the
    # culprit and its parent are measured once more before the culprit is named
    inst = make_install(tmp_path, core_kw={"bad_commit_index": 200, "noise_fraction": 0.05})
    core = inst.core
    code, doc, err = inst.bisect(
        *inst.core_span(inst.workflow(vram_workflow()), 150, 260),
        "--repeat",
        "auto",
        "--max-repeat",
        "4",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert (doc["repeat"], doc["max_repeat"]) == ("auto", 4)
    steps = doc["steps"]
    assert steps[0]["confidence"]["repeats"] == 3  # the band's runs
    assert all(s["confidence"]["word"] in ("same", "different") for s in steps), steps
    assert all(1 <= s["confidence"]["repeats"] <= 4 for s in steps)
    rechecks = doc["rechecks"]
    parent = core.commits[core.commits.index(core.bad_commit) - 1]
    assert [(r["state"]["comfyui"], r["verdict"]) for r in rechecks] == [
        (parent, "old"),
        (core.bad_commit, "new"),
    ]
    # every run is accounted for: each verdict's repeats, plus the re-checks' fresh runs; the
    # culprit's re-check ran to the end, so no separate run for its Δ
    by_state = {s["state"]["comfyui"]: s["confidence"]["repeats"] for s in steps}
    fresh = sum(r["repeats"] - by_state[r["state"]["comfyui"]] for r in rechecks)
    assert fresh >= 2
    assert doc["search"]["culprit_reruns"] == 0
    assert doc["measurements"] == sum(by_state.values()) + fresh
    assert "re-checked before naming the culprit" in err
    repeated = sum(1 for s in steps[1:] if s["confidence"]["repeats"] > 1)
    say(
        f"repeat_auto ({len(steps)} states, {repeated} repeated within the band, "
        f"band {steps[1]['confidence']['margin_bytes']})",
        doc,
    )
    inst.assert_untouched()


def test_parallel_on_three_fake_gpus_takes_log4_rounds(tmp_path: Path) -> None:
    # the scripted fake GPU with three devices: by default one lane per GPU, each replay
    # with its own CUDA_VISIBLE_DEVICES and workspace, three replays at once per round
    inst = make_install(tmp_path)
    FakeGpuDir(tmp_path / "gpu").create([FakeDevice(i, f"Fake GPU {i}", 4 * GIB) for i in range(3)])
    core = inst.core
    good, bad = 150, 260
    code, doc, err = inst.bisect(
        *inst.core_span(inst.workflow(vram_workflow()), good, bad),
        timeout=600,
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert "parallel: 3 replays at once" in err
    par = doc["search"]["parallel"]
    m = bad - good
    assert par["width"] == 3
    assert par["round_bound"] == math.ceil(math.log(m, 4)) == 4  # one at a time: 7
    assert par["serial_bound"] == log2(m) == 7
    assert 1 <= par["rounds"] <= par["round_bound"]
    assert doc["search"]["within_bound"]
    lanes = {
        m["lane"] for m in inst.measurements() if m["event"] == "done" and m["phase"] == "bisect"
    }
    assert lanes == {0, 1, 2}
    # each lane's last replay ran on its own GPU (the stand-in prints the device it chose)
    (root,) = (inst.base / "cache" / "bisect").glob("ComfyUI-*")
    for lane, ws in enumerate(["workspace", "workspace-1", "workspace-2"]):
        console = (root / ws / "run" / "console.log").read_text(errors="replace")
        assert f"Device: cuda:0 Fake GPU {lane} " in console, console[-2000:]
    say(
        f"parallel_three_gpus ({par['rounds']} round(s), {par['measurements']} measurement(s) "
        f"in the range; bound ⌈log4 {m}⌉ = {par['round_bound']}, one at a time ⌈log2 {m}⌉ = "
        f"{par['serial_bound']})",
        doc,
    )
    inst.assert_untouched()


def test_a_bad_state_that_is_not_bad_is_not_reproduced(tmp_path: Path) -> None:
    inst = make_install(tmp_path, core_kw={"bad_commit_index": None})
    code, doc, err = inst.bisect(*inst.core_span(inst.workflow(vram_workflow())))
    assert (code, doc["result"], doc["measurements"]) == (4, "not-reproduced", 2), err[-3000:]
    assert "the bad state does not reproduce" in doc["message"]
    say("a_bad_state_that_is_not_bad_is_not_reproduced", doc)
    inst.assert_untouched()


def test_a_good_state_that_is_bad_is_an_error_that_says_which(tmp_path: Path) -> None:
    inst = make_install(tmp_path)
    code, doc, err = inst.bisect(*inst.core_span(inst.workflow(vram_workflow(mib=5000))))
    assert (code, doc["result"], doc["measurements"]) == (1, "error", 1), err[-3000:]
    assert "the good state is bad too" in doc["message"]
    assert doc["steps"][0]["outcome"] == "oom" and "CUDA out of memory" in doc["steps"][0]["reason"]
    say("a_good_state_that_is_bad_is_an_error_that_says_which", doc)
    inst.assert_untouched()


def test_a_ram_regression_is_found_from_the_process_peak(tmp_path: Path) -> None:
    inst = make_install(tmp_path, fake_gpu=False)
    core = inst.core
    code, doc, err = inst.bisect(
        *inst.core_span(inst.workflow(ram_workflow()), 150, 250),
        "--flags",
        "--cpu",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert doc["measurements"] <= log2(100) + 3
    good = doc["steps"][0]
    assert good["peak_vram_bytes"] is None and good["peak_ram_bytes"] > 200 * MIB
    say("a_ram_regression_is_found_from_the_process_peak", doc)
    inst.assert_untouched()


def test_ctrl_c_mid_bisect_then_resume_repeats_at_most_one_measurement(tmp_path: Path) -> None:
    inst = make_install(tmp_path)
    core = inst.core
    proc = inst.spawn(
        *inst.core_span(inst.workflow(vram_workflow(hold_s=0.4))), stdout=subprocess.PIPE
    )

    def at_step_5() -> bool:
        try:
            lines = inst.measurements()
        except (ValueError, FileNotFoundError):
            return False
        done = sum(m["event"] == "done" for m in lines)
        return done >= 4 and lines[-1]["event"] == "launch"  # a ComfyUI starts or replays now

    wait_while_running(proc, at_step_5, 120, "never reached step 5", interval_s=0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted; the session is kept" in err
    inst.assert_untouched()  # no ComfyUI left behind, the repos as they were

    status = json.loads(inst.run("status", "--comfyui", str(inst.root), "--json").stdout)
    assert status["result"] == "in-progress" and status["measurements"] >= 4

    code, doc, err = inst.bisect()  # `oom-bisect run` again: resumes
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert "resuming the bisect" in err
    good = State.of(core.commits[0], {n: b.head for n, b in inst.nodes.items()})
    bad = good.with_values({"comfyui": core.head})
    planned = planned_measurements(
        good, bad, list(core.commits[1:]), lambda s: core.index_of(s.comfyui) >= 200
    )
    launches = sum(m["event"] == "launch" for m in inst.measurements())
    planned += 1  # the culprit's run to the end, for its Δ
    assert doc["measurements"] == planned
    assert planned <= launches <= planned + 1
    say(f"ctrl_c_then_resume (launches {launches}, planned {planned})", doc)
    inst.assert_untouched()


def test_a_crash_snapshot_bisects_and_gets_the_report_attached(tmp_path: Path) -> None:
    from snapshot_samples import HOST, incident, suspected_regression

    from oom_sentinel.daemon.incidents.snapshot import (
        InstanceInfo,
        SnapshotContent,
        snapshots_dir,
        write_snapshot,
    )
    from oom_sentinel.daemon.install.state import CoreState, CustomNode, InstallState

    inst = make_install(tmp_path)
    core, nodes = inst.core, inst.nodes

    def ist(core_index: int) -> InstallState:
        # as the daemon records a real install: the core's tracked single-file node is listed
        packs = (
            *(CustomNode(n, "git", commit=b.head) for n, b in nodes.items()),
            CustomNode("websocket_image_save.py", "file", content_hash="x"),
        )
        return InstallState(
            CoreState(commit=core.commits[core_index]),
            nodes=packs,
            interpreter=InterpreterFacts(executable=sys.executable),
        )

    data_dir = tmp_path / "data"
    ref = write_snapshot(
        snapshots_dir(data_dir),
        SnapshotContent(
            incident=incident(),
            instance=InstanceInfo("main", str(inst.root)),
            host=HOST,
            created_s=1767348672.25,
            prompt=vram_workflow(),
            sections={
                "regression": suspected_regression(ist(180), ist(319)),
                "install_state": ist(319).to_dict(),
                "process": {"argv": [sys.executable, "main.py", "--reserve-vram", "1"]},
            },
        ),
    )
    before = sorted(p.name for p in ref.path.iterdir())
    proc = inst.run(ref.id[:15], "--data-dir", str(data_dir), "--json")
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["result"]) == (0, "found"), proc.stderr[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert doc["measurements"] <= log2(319 - 180) + 3
    assert doc["attached_to"] == str(ref.path / "bisect")
    assert sorted(p.name for p in ref.path.iterdir()) == sorted([*before, "bisect"])
    attached = json.loads((ref.path / "bisect" / "report.json").read_text())
    assert attached["source"] == f"snapshot {ref.id}" and attached["flags"] == [
        "--reserve-vram",
        "1",
    ]
    # the answer is told first where the question came from
    daemon_cli = [sys.executable, "-m", "oom_sentinel.daemon", "snapshots"]
    show = subprocess.run(
        [*daemon_cli, "show", ref.id, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        check=False,
        env=inst.env,
    )
    assert show.returncode == 0, show.stderr
    story = show.stdout
    first = story.index("oom-bisect found the change that made it run out of memory:")
    assert first < story.index(f"ComfyUI {core.bad_commit[:10]}") < story.index("What failed")
    assert f"`oom-bisect {ref.id}`" not in story
    say("a_crash_snapshot_bisects_and_gets_the_report_attached", doc)
    inst.assert_untouched()


UI_WORKFLOW = {
    "last_node_id": 3,
    "last_link_id": 2,
    "version": 0.4,
    "nodes": [
        {
            "id": 1,
            "type": "AllocateVRAM",
            "mode": 0,
            "inputs": [{"name": "value", "type": "*", "link": None}],
            "outputs": [{"name": "MEMORY", "type": "MEMORY", "links": [1]}],
            "widgets_values": [1000, 1, 0],
        },
        {
            "id": 2,
            "type": "Sleep",
            "mode": 0,
            "inputs": [{"name": "value", "type": "*", "link": 1}],
            "outputs": [{"name": "*", "type": "*", "links": [2]}],
            "widgets_values": [0.25],
        },
        {
            "id": 4,
            "type": "Fail",
            "mode": 4,  # muted in the editor: not part of the replay
            "inputs": [],
            "outputs": [],
            "widgets_values": ["should never run", "ValueError"],
        },
        {
            "id": 3,
            "type": "PreviewAny",
            "mode": 0,
            "inputs": [{"name": "source", "type": "*", "link": 2}],
            "outputs": [],
            "widgets_values": [],
        },
    ],
    "links": [[1, 1, 0, 2, 0, "MEMORY"], [2, 2, 0, 3, 0, "*"]],
}


def test_a_ui_workflow_is_converted_through_the_copys_object_info(tmp_path: Path) -> None:
    inst = make_install(tmp_path)
    core = inst.core
    code, doc, err = inst.bisect(
        *inst.core_span(inst.workflow(UI_WORKFLOW, "ui.json"), 190, 210),
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    assert "converting the UI workflow" in err
    assert doc["measurements"] <= log2(20) + 3
    (root,) = (tmp_path / "cache" / "bisect").glob("ComfyUI-*")
    prompt = json.loads((root / "session" / "prompt.json").read_text())
    assert {n["class_type"] for n in prompt.values()} == {"AllocateVRAM", "Sleep", "PreviewAny"}
    say("a_ui_workflow_is_converted", doc)
    inst.assert_untouched()

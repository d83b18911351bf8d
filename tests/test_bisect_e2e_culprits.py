"""``oom-bisect run`` end to end on what a real "Update all" does (issue 10, items 1-3): the core
and node packs move at once and more than one change raises memory. Real git histories of the
stand-in ComfyUI and two node packs, a fresh stand-in server per measurement, the fake GPU.

Each test asserts every culprit with its own Δ, the measurement count against the printed
bound, and that the user's repos are untouched (helpers from test_bisect_e2e.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_bisect_e2e import CONTEXT_MIB, MIB, culprit, make_install, say, vram_workflow

pytestmark = pytest.mark.slow


def _states_printed_before_the_first_step(err: str) -> str:
    head = err.split("step 1", 1)[0]
    assert "step 1" in err, err[-2000:]
    return head


def test_two_independent_culprits_in_core_and_a_node_are_both_named(tmp_path: Path) -> None:
    inst = make_install(
        tmp_path,
        core_kw={"bad_commit_index": 200},
        node_kw={"PackB": {"bad_commit_index": 23, "bad_scale": ("AllocateVRAM", 1.6)}},
    )
    core, pack = inst.core, inst.nodes["PackB"]
    code, doc, err = inst.bisect(
        "--workflow",
        inst.workflow(vram_workflow()),
        # repeated options merge into one state (they used to keep only the last one)
        "--good",
        f"comfyui={core.commits[150]}",
        "--good",
        f"node:PackB={pack.commits[0]}",
        "--bad",
        "comfyui=HEAD",
        "--bad",
        "node:PackB=HEAD",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit), ("node:PackB", pack.commits[23])]
    by_repo = {c["repo"]: c for c in doc["culprits"]}
    for repo in ("comfyui", "node:PackB"):
        d = by_repo[repo]["delta"]
        assert by_repo[repo]["together"] == []
        assert d["pool"] == "vram" and d["parent_bytes"] == (CONTEXT_MIB + 1000) * MIB
        # the culprit's own state run to the end once more: its real cost, not "≥ threshold"
        assert d["delta_bytes"] == 600 * MIB and not d["lower_bound"]  # 1000 MiB × 1.6
    sr = doc["search"]
    assert sr["groups"] == [["comfyui"], ["node:PackB"]]
    assert sr["culprit_reruns"] == 2 and sr["within_bound"]
    assert doc["measurements"] == sr["measured_states"] + 2 <= sr["bound"]
    assert sr["bound"] == sr["repo_level_steps"] + (8 + 2) + (6 + 2)  # ⌈log2 169⌉, ⌈log2 39⌉
    assert f"bound {sr['repo_level_steps']} repo-level step(s)" in err
    head = _states_printed_before_the_first_step(err)
    assert re.search(rf"ComfyUI\s+{core.commits[150]} → {core.commits[150]}  \*", head)
    assert re.search(rf"custom_nodes/PackB\s+{pack.commits[0]} → {pack.commits[0]}  \*", head)
    assert re.search(rf"ComfyUI\s+HEAD → {core.head}  \*", head)
    assert re.search(rf"custom_nodes/PackA\s+as installed → {inst.nodes['PackA'].head}\n", head)
    assert "+600.00 MiB VRAM in ComfyUI's state (1.28 GiB → 1.87 GiB)" in err
    assert "+600.00 MiB VRAM in custom_nodes/PackB's state (1.28 GiB → 1.87 GiB)" in err
    # per-node peaks: the node that allocates is the first whose peak rose, by 600 MiB
    for repo in ("comfyui", "node:PackB"):
        first = by_repo[repo]["nodes"][0]
        assert (first["node_id"], first["class_type"], first["pool"]) == (
            "1",
            "AllocateVRAM",
            "vram",
        )
        assert first["after_bytes"] - first["before_bytes"] == 600 * MIB
        # Sleep and PreviewAny show the same rise, but only carry node 1's output: not named
        assert len(by_repo[repo]["nodes"]) == 1
        assert by_repo[repo]["nodes_text"].startswith("AllocateVRAM #1: 1.28 GiB → 1.87 GiB VRAM")
    assert "nodes: AllocateVRAM #1: 1.28 GiB → 1.87 GiB VRAM" in err
    partial = 0
    for st in doc["steps"]:
        types = [n["class_type"] for n in st["node_peaks"]]
        if st["kind"] == "old":  # ran to the end
            assert types == ["AllocateVRAM", "Sleep", "PreviewAny"], st
        else:  # stopped at the threshold: the node then running is there, marked partial
            assert types[0] == "AllocateVRAM", st
            partial += st["node_peaks"][-1]["partial"]
    assert partial > 0
    page = Path(doc["report"]["html"]).read_text()
    assert page.count("<svg class='nodes'") == 2 and "AllocateVRAM #1" in page
    say("two_independent_culprits_core_and_node", doc, sr["bound"])
    inst.assert_untouched()


def test_two_culprits_in_two_node_packs_while_the_core_moved_harmlessly(tmp_path: Path) -> None:
    inst = make_install(
        tmp_path,
        core_kw={"bad_commit_index": None},
        node_kw={
            "PackA": {"bad_commit_index": 11, "bad_scale": ("AllocateVRAM", 1.5)},
            "PackB": {"bad_commit_index": 30, "bad_scale": ("AllocateVRAM", 1.4)},
        },
    )
    core, a, b = inst.core, inst.nodes["PackA"], inst.nodes["PackB"]
    code, doc, err = inst.bisect(
        "--workflow",
        inst.workflow(vram_workflow()),
        "--good",
        f"comfyui={core.commits[250]} node:PackA={a.commits[2]} node:PackB={b.commits[2]}",
        "--bad",
        "comfyui=HEAD node:PackA=HEAD node:PackB=HEAD",
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert sorted(culprit(doc)) == [("node:PackA", a.commits[11]), ("node:PackB", b.commits[30])]
    deltas = {c["repo"]: c["delta"]["delta_bytes"] for c in doc["culprits"]}
    assert deltas == {"node:PackA": 500 * MIB, "node:PackB": 400 * MIB}
    assert all(c["together"] == [] for c in doc["culprits"])
    sr = doc["search"]
    assert sr["within_bound"] and doc["measurements"] <= sr["bound"]
    # the core was never bisected: no measured state has it anywhere but its two endpoints
    core_values = {s["state"]["comfyui"] for s in doc["steps"]}
    assert core_values <= {core.commits[250], core.head}
    say("two_culprits_in_two_node_packs", doc, sr["bound"])
    inst.assert_untouched()


def test_same_memory_in_good_and_bad_across_two_repos_is_not_reproduced(tmp_path: Path) -> None:
    inst = make_install(tmp_path, core_kw={"bad_commit_index": None})
    core, a = inst.core, inst.nodes["PackA"]
    code, doc, err = inst.bisect(
        "--workflow",
        inst.workflow(vram_workflow()),
        "--good",
        f"comfyui={core.commits[0]} node:PackA={a.commits[0]}",
        "--bad",
        "comfyui=HEAD node:PackA=HEAD",
    )
    assert (code, doc["result"], doc["measurements"]) == (4, "not-reproduced", 2), err[-3000:]
    assert doc["culprits"] == []
    assert doc["steps"][0]["peak_vram_bytes"] == doc["steps"][1]["peak_vram_bytes"]
    say("same_memory_is_not_reproduced", doc)
    inst.assert_untouched()


def test_a_repo_given_twice_with_different_refs_is_a_usage_error(tmp_path: Path) -> None:
    inst = make_install(tmp_path)
    core = inst.core
    wf = inst.workflow(vram_workflow())
    common = ["--workflow", wf, "--bad", "comfyui=HEAD"]
    for good, needle in (
        (
            ["--good", f"comfyui={core.commits[0]}", "--good", f"core={core.commits[5]}"],
            "ComfyUI is given twice with different refs",
        ),
        (["--good", "node:NoSuchPack=absent"], "custom_nodes/NoSuchPack: no such custom node"),
        (["--good", "nodes:PackA=HEAD"], "the repo must be 'comfyui', 'node:NAME' or 'pkg:NAME'"),
    ):
        proc = inst.run(
            "run", "--comfyui", str(inst.root), "--python", sys.executable, *good, *common
        )
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "cache").rglob("session.json"))
    inst.assert_untouched()


def test_no_gpu_for_the_replay_stops_with_the_fix_and_caches_nothing(tmp_path: Path) -> None:
    # no fake GPU and no flags: the stand-in dies as torch does ("Found no NVIDIA driver");
    # its interpreter has no torch, so the probe cannot tell and --cpu is not guessed
    inst = make_install(tmp_path, fake_gpu=False)
    core = inst.core
    # --cpu: real host RAM, kept small
    args = inst.core_span(inst.workflow(vram_workflow(mib=150, hold_s=0.05)), 150, 250)
    code, doc, err = inst.bisect(*args)
    assert (code, doc["result"]) == (1, "error"), err[-3000:]
    assert "Found no NVIDIA driver on your system" in doc["message"]
    assert "--flags '--cpu'" in doc["message"] and "\n" not in doc["message"]
    assert not list((tmp_path / "cache" / "bisect" / "outcomes").rglob("*.json"))
    (root,) = (tmp_path / "cache" / "bisect").glob("ComfyUI-*")
    log = (root / "session" / "log").read_text()
    assert all(line.startswith("#") for line in log.splitlines()), log
    # the fix works: reset, then --cpu (the stand-in then holds its "VRAM" in host RAM)
    assert inst.run("reset", "--comfyui", str(inst.root)).returncode == 0
    code, doc, err = inst.bisect(*args, "--flags", "--cpu")
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert culprit(doc) == [("comfyui", core.bad_commit)]
    report = json.loads(Path(doc["report"]["json"]).read_text())
    assert report["flags"] == ["--cpu"]
    say("no_gpu_then_cpu", doc)
    inst.assert_untouched()

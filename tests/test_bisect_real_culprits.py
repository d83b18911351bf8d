"""Every culprit on a real ComfyUI (issue 10, items 1-4): a copy of the real checkout gets a
small history of our own on top (docs commits and one that makes ``ImageScaleBy`` keep four
copies of its output), a tiny node pack of our own whose revision 5 preloads 400 MiB, and
``oom-bisect run`` with repeated ``--good``/``--bad`` and no ``--flags`` on a machine whose torch
sees no GPU must add ``--cpu`` itself, name both commits, each with its real Δ, within the
printed bound. Skips without ``OOM_SENTINEL_REAL_COMFYUI`` (the checkout, never modified: it is
cloned into tmp) and ``OOM_SENTINEL_REAL_COMFYUI_PYTHON`` (its interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# a bisect of 12 real ComfyUI starts takes 5-6 min on a loaded 2-core box
pytestmark = [pytest.mark.real_comfyui, pytest.mark.slow, pytest.mark.timeout(1800)]

MIB = 1024 * 1024
ENV = {
    "GIT_AUTHOR_NAME": "Tester",
    "GIT_AUTHOR_EMAIL": "tester@example.org",
    "GIT_COMMITTER_NAME": "Tester",
    "GIT_COMMITTER_EMAIL": "tester@example.org",
    "GIT_CONFIG_NOSYSTEM": "1",
}
KEEP = '        ImageScaleBy._keep = [s.clone() for _ in range(4)]  # "cache" for faster re-runs\n'
WORKFLOW = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 1024, "height": 1024, "batch_size": 4, "color": 0},
    },
    "2": {
        "class_type": "ImageScaleBy",
        "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact", "scale_by": 2.0},
    },
    "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
}
PACK = '''"""MemPack: a tiny node pack for the oom-bisect test (revision {i})."""
{preload}

class MemPackPassthrough:
    CATEGORY = "utils"
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"image": ("IMAGE",)}}}}

    def run(self, image):
        return (image,)


NODE_CLASS_MAPPINGS = {{"MemPackPassthrough": MemPackPassthrough}}
'''
PRELOAD = "import torch\n_PRELOAD = torch.ones(400 * 2**20 // 4)  # a lookup table, 400 MiB\n"


def by_repo_nodes(doc: dict, repo: str) -> list[dict]:
    return next(c["nodes"] for c in doc["culprits"] if c["repo"] == repo)


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | ENV
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def commit_all(repo: Path, subject: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD").strip()


def copy_of_real_comfyui(real: Path, dest: Path) -> str:
    """A clone of the real checkout whose root commit is its HEAD's tree (minus any blob the
    clone lacks: a fork mirror may miss one); returns that root's id."""
    subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(real), str(dest)],
        check=True,
        capture_output=True,
    )
    git(dest, "read-tree", "HEAD")
    entries = [line.split("\t", 1) for line in git(dest, "ls-files", "-s").splitlines()]
    shas = "\n".join(meta.split()[1] for meta, _ in entries) + "\n"
    checks = git(dest, "cat-file", "--batch-check", stdin=shas).splitlines()
    for (_, path), check in zip(entries, checks, strict=True):
        if check.endswith("missing"):
            git(dest, "rm", "-q", "--cached", path)
    git(dest, "checkout-index", "-a", "-f")
    tree = git(dest, "write-tree").strip()
    head = git(dest, "rev-parse", "--short", "HEAD").strip()
    root = git(dest, "commit-tree", tree, "-m", f"ComfyUI at {head} (test base)").strip()
    git(dest, "update-ref", "refs/heads/journey", root)
    git(dest, "symbolic-ref", "HEAD", "refs/heads/journey")
    return root


@pytest.mark.parametrize("repeat", [None, "auto"], ids=["once", "repeat-auto"])
def test_core_and_node_pack_regressions_on_a_real_comfyui(
    tmp_path: Path, repeat: str | None
) -> None:
    real = os.environ.get("OOM_SENTINEL_REAL_COMFYUI")
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON")
    if not real or not python:
        pytest.skip("set OOM_SENTINEL_REAL_COMFYUI and OOM_SENTINEL_REAL_COMFYUI_PYTHON")
    core = tmp_path / "ComfyUI"
    base = copy_of_real_comfyui(Path(real), core)
    for i in (1, 2):
        with open(core / "README.md", "a") as fh:
            fh.write(f"\nnote {i}\n")
        commit_all(core, f"Docs: note {i}")
    nodes = (core / "nodes.py").read_text()
    anchor = "        s = s.movedim(1,-1)\n        return (s,)\n\nclass ImageInvert:"
    assert anchor in nodes, "ImageScaleBy.upscale is not where v0.8.0 has it"
    (core / "nodes.py").write_text(
        nodes.replace(anchor, anchor.replace("        return", KEEP + "        return"))
    )
    core_bad = commit_all(core, "ImageScaleBy: keep upscaled copies for faster re-runs")
    for i in range(3, 8):
        with open(core / "README.md", "a") as fh:
            fh.write(f"\nnote {i}\n")
        commit_all(core, f"Docs: note {i}")
    pack = tmp_path / "src" / "MemPack"
    pack.mkdir(parents=True)
    git(pack, "init", "-q", "-b", "main")
    pack_commits = []
    for i in range(8):
        (pack / "__init__.py").write_text(PACK.format(i=i, preload=PRELOAD if i >= 5 else ""))
        (pack / "notes.txt").write_text(f"rev {i}\n")
        pack_commits.append(commit_all(pack, f"MemPack revision {i}"))
    subprocess.run(
        ["git", "clone", "-q", str(pack), str(core / "custom_nodes" / "MemPack")], check=True
    )
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(WORKFLOW))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOM_SENTINEL_")}
    env["OOM_SENTINEL_CACHE_DIR"] = str(tmp_path / "cache")
    started = time.monotonic()
    argv = [sys.executable, "-m", "oom_sentinel.bisect", "run", "--comfyui", str(core)]
    argv += ["--python", python, "--workflow", str(wf), "--json"]
    argv += ["--good", f"comfyui={base}", "--good", "node:MemPack=HEAD~7"]
    argv += ["--bad", "comfyui=HEAD", "--bad", "node:MemPack=HEAD"]
    if repeat is not None:
        argv += ["--repeat", repeat]
    proc = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    took = time.monotonic() - started
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["result"]) == (0, "found"), proc.stderr[-4000:]
    assert "replaying with --cpu" in proc.stderr  # no flags given: ComfyUI's torch was asked
    assert [(c["repo"], c["commit"]) for c in doc["culprits"]] == [
        ("comfyui", core_bad),
        ("node:MemPack", pack_commits[5]),
    ]
    deltas = {c["repo"]: c["delta"] for c in doc["culprits"]}
    assert all(d["pool"] == "ram" and not d["lower_bound"] for d in deltas.values())
    # four copies of a 4×2048²×3 float32 image, and the 400 MiB table
    assert 0.8 * 768 * MIB < deltas["comfyui"]["delta_bytes"] < 1.25 * 768 * MIB
    assert 0.8 * 400 * MIB < deltas["node:MemPack"]["delta_bytes"] < 1.25 * 400 * MIB
    sr = doc["search"]
    extra = ""
    if repeat is None:
        assert sr["within_bound"] and doc["measurements"] <= sr["bound"]
    else:
        # the band from three runs of the good endpoint, a re-check of both culprits and
        # their parents; every verdict of a real ComfyUI clear of the band in one run or more
        steps = doc["steps"]
        assert steps[0]["confidence"]["repeats"] == 3
        assert all(st["confidence"]["word"] in ("same", "different") for st in steps)
        assert len(doc["rechecks"]) == 4  # each culprit and its parent
        band = steps[1]["confidence"]["margin_bytes"]
        repeats = sum(st["confidence"]["repeats"] for st in steps)
        extra = f" [repeat auto: band {band}, {repeats} run(s) behind {len(steps)} verdicts]"
    # per-node peaks (the bootstrap's wrapped execution.execute): the core culprit's memory
    # comes from ImageScaleBy (PreviewImage after it only carries the copies; EmptyImage,
    # before it, did not move); the pack's import-time table shows from the first node on
    first = {c["repo"]: c["nodes"][0] for c in doc["culprits"]}
    assert all(n["pool"] == "ram" for c in doc["culprits"] for n in c["nodes"])
    rise = {r: (n["after_bytes"] - n["before_bytes"]) / MIB for r, n in first.items()}
    assert first["comfyui"]["class_type"] == "ImageScaleBy", doc["culprits"]
    assert first["node:MemPack"]["class_type"] == "EmptyImage", doc["culprits"]
    assert 0.8 * 768 < rise["comfyui"] < 1.25 * 768, rise
    assert 0.8 * 400 < rise["node:MemPack"] < 1.25 * 400, rise
    assert "EmptyImage" not in {n["class_type"] for n in by_repo_nodes(doc, "comfyui")}
    texts = {c["repo"]: c["nodes_text"] for c in doc["culprits"]}
    assert "ImageScaleBy #2: " in texts["comfyui"] and " → " in texts["comfyui"]
    order = ["EmptyImage", "ImageScaleBy", "PreviewImage"]
    for st in doc["steps"]:
        types = [n["class_type"] for n in st["node_peaks"]]
        # a run stopped at the threshold has the nodes up to the one then running
        assert types == order[: len(types)] and (st["kind"] != "old" or types == order), st
    assert any(st["node_peaks"] for st in doc["steps"])
    print(
        f"\n[real]{extra} {took:.0f} s, {doc['measurements']} measurement(s) "
        f"(bound {sr['bound']}); "
        + "; ".join(f"{r} +{d['delta_bytes'] / MIB:.0f} MiB" for r, d in deltas.items())
        + "".join(f"\n[real] {r} nodes: {t}" for r, t in texts.items())
    )

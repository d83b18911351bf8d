"""``oom-bisect run`` with Python packages as a dimension (issue 14, items 2 and 4), end to end.

The install is the stand-in ComfyUI with its node packs plus ``BallastPack``, a plain-folder
node that imports ``sentinel_ballast`` and scales the VRAM node by its ``SCALE``. The states
are ComfyUI-Manager snapshots whose ``pips`` differ (ballast 1.0 → 2.0 is +60 %). Each state
runs in its own venv that the real uv builds offline from wheels made in the test; the user's
interpreter (this one) has no ballast at all, so a run in it could not pass for a package
state.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from test_bisect_e2e import CONTEXT_MIB, MIB, UserInstall, make_install, say, vram_workflow
from wheels import STANDIN_RUNTIME, ballast_source, repack_closure, write_wheel

pytestmark = pytest.mark.slow

BALLAST_PACK = '''"""BallastPack: a node pack that requires sentinel-ballast (generated for tests)."""
import sentinel_ballast
import standin_api

standin_api.scale_memory("AllocateVRAM", sentinel_ballast.SCALE)


class BallastPassthrough:
    CATEGORY = "utils"
    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("*", {})}}

    def run(self, value):
        return (value,)


NODE_CLASS_MAPPINGS = {"BallastPassthrough": BallastPassthrough}
'''


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("wheels")
    runtime = repack_closure(STANDIN_RUNTIME, d)
    write_wheel(d, "sentinel-ballast", "1.0", ballast_source(1.0))
    write_wheel(d, "sentinel-ballast", "2.0", ballast_source(1.6))
    return d, runtime


def _install(tmp_path: Path, wheels: Path, **kw: Any) -> UserInstall:
    inst = make_install(tmp_path, **kw)
    pack = inst.root / "custom_nodes" / "BallastPack"
    pack.mkdir()
    (pack / "__init__.py").write_text(BALLAST_PACK)
    (pack / "requirements.txt").write_text("sentinel-ballast\n")
    inst.env.update(UV_FIND_LINKS=str(wheels), UV_OFFLINE="1", UV_NO_CONFIG="1")
    inst.before = inst.fingerprints()  # with BallastPack in place
    return inst


def _manager_snapshot(
    inst: UserInstall, name: str, pips: dict[str, str], nodes: dict[str, str] | None = None
) -> str:
    """A ComfyUI-Manager snapshot: the core at HEAD, the git packs at ``nodes`` (default HEAD)
    and ``pips`` as its package set."""
    heads = {n: r.head for n, r in inst.nodes.items()}
    heads.update(nodes or {})
    data = {
        "comfyui": inst.core.head,
        "git_custom_nodes": {
            str(inst.nodes[n].path): {"hash": sha, "disabled": False} for n, sha in heads.items()
        },
        "file_custom_nodes": [],
        "pips": {f"{k}=={v}": "" for k, v in pips.items()},
    }
    path = inst.base / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def _workflow(inst: UserInstall) -> str:
    wf = vram_workflow()
    wf["4"] = {"class_type": "BallastPassthrough", "inputs": {"value": ["2", 0]}}
    wf["3"]["inputs"]["source"] = ["4", 0]
    return inst.workflow(wf)


def test_the_culprit_is_a_package_version_with_its_delta(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    wheels, runtime = wheelhouse
    inst = _install(tmp_path, wheels, core_kw={"bad_commit_index": None})
    good = _manager_snapshot(inst, "good", {**runtime, "sentinel-ballast": "1.0"})
    bad = _manager_snapshot(inst, "bad", {**runtime, "sentinel-ballast": "2.0"})
    code, doc, err = inst.bisect("--workflow", _workflow(inst), "--good", good, "--bad", bad)
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    (c,) = doc["culprits"]
    assert (c["repo"], c["commit"], c["previous"]) == ("pkg:sentinel-ballast", "2.0", "1.0")
    assert c["subject"] == "package sentinel-ballast 1.0 → 2.0"
    d = c["delta"]
    assert d["parent_bytes"] == (CONTEXT_MIB + 1000) * MIB and d["delta_bytes"] == 600 * MIB
    assert "package sentinel-ballast" in err and "packages: built the env" in err
    # two envs (one per ballast version), each used by the runs of its state
    envs = sorted(
        p for p in (inst.base / "cache" / "bisect" / "envs").iterdir() if p.name[0] != "u"
    )
    assert len(envs) == 2
    # the user's interpreter has no ballast: a run in it would have lost BallastPack
    assert importlib.util.find_spec("sentinel_ballast") is None
    say("package_culprit", doc, doc["search"]["bound"])
    inst.assert_untouched()


def test_a_package_and_a_node_commit_are_both_culprits(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    wheels, runtime = wheelhouse
    inst = _install(
        tmp_path,
        wheels,
        core_kw={"bad_commit_index": None},
        node_kw={"PackB": {"bad_commit_index": 23, "bad_scale": ("AllocateVRAM", 1.4)}},
    )
    pack = inst.nodes["PackB"]
    good = _manager_snapshot(
        inst, "good", {**runtime, "sentinel-ballast": "1.0"}, {"PackB": pack.commits[0]}
    )
    bad = _manager_snapshot(inst, "bad", {**runtime, "sentinel-ballast": "2.0"})
    code, doc, err = inst.bisect("--workflow", _workflow(inst), "--good", good, "--bad", bad)
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    got = sorted((c["repo"], c["commit"]) for c in doc["culprits"])
    assert got == [("node:PackB", pack.commits[23]), ("pkg:sentinel-ballast", "2.0")]
    deltas = {c["repo"]: c["delta"]["delta_bytes"] for c in doc["culprits"]}
    assert deltas == {"node:PackB": 400 * MIB, "pkg:sentinel-ballast": 600 * MIB}
    assert doc["search"]["within_bound"]
    say("package_and_commit_culprits", doc, doc["search"]["bound"])
    inst.assert_untouched()


def test_a_state_whose_packages_cannot_be_installed_is_a_skip_with_uvs_reason(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    wheels, runtime = wheelhouse
    inst = _install(tmp_path, wheels, core_kw={"bad_commit_index": None})
    good = _manager_snapshot(inst, "good", {**runtime, "sentinel-ballast": "1.0"})
    bad = _manager_snapshot(inst, "bad", {**runtime, "sentinel-ballast": "3.0"})  # no such wheel
    code, doc, err = inst.bisect("--workflow", _workflow(inst), "--good", good, "--bad", bad)
    assert doc["result"] == "error" and code != 0, err[-3000:]
    assert "bad state cannot be tested" in doc["message"]
    assert "sentinel-ballast==3.0" in err  # uv's own reason, on the skip's line
    (skip,) = [s for s in doc["steps"] if s["kind"] == "skip"]
    assert skip["state"]["pkg:sentinel-ballast"] == "3.0"
    # nothing was run on a substitute: no ComfyUI started for the bad state
    (done,) = [
        m
        for m in inst.measurements()
        if m["event"] == "done" and m["state"].get("packages", {}).get("sentinel-ballast") == "3.0"
    ]
    assert done["exit_code"] is None and done["console_tail"] == []
    assert json.dumps(done["outcome"]).count("packages: the state's packages cannot be installed")
    inst.assert_untouched()

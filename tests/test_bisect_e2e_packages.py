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
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from standin_repos import repo_fingerprint
from test_bisect_e2e import CONTEXT_MIB, MIB, UserInstall, make_install, say, vram_workflow
from wheels import ballast_source, ballast_wheelhouse, write_wheel

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
    return d, ballast_wheelhouse(d)


def _install(tmp_path: Path, wheels: Path, ballast_pack: bool = True, **kw: Any) -> UserInstall:
    inst = make_install(tmp_path, **kw)
    if ballast_pack:
        pack = inst.root / "custom_nodes" / "BallastPack"
        pack.mkdir()
        (pack / "__init__.py").write_text(BALLAST_PACK)
        (pack / "requirements.txt").write_text("sentinel-ballast\n")
    inst.env.update(UV_FIND_LINKS=str(wheels), UV_OFFLINE="1", UV_NO_CONFIG="1")
    inst.before = inst.fingerprints()  # with BallastPack in place
    return inst


def _manager_snapshot(
    inst: UserInstall,
    name: str,
    pips: dict[str, str],
    nodes: dict[str, str] | None = None,
    urls: dict[str, str] | None = None,
) -> str:
    """A ComfyUI-Manager snapshot: the core at HEAD, the git packs at ``nodes`` (default HEAD)
    and ``pips`` as its package set; ``urls`` names packs that are not in ``inst.nodes``."""
    heads = {n: r.head for n, r in inst.nodes.items()}
    heads.update(nodes or {})
    where = {n: str(r.path) for n, r in inst.nodes.items()} | (urls or {})
    data = {
        "comfyui": inst.core.head,
        "git_custom_nodes": {
            where[n]: {"hash": sha, "disabled": False} for n, sha in heads.items()
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
    # the same command again resumes the session (its package sets compare equal) and
    # measures nothing new; a state given as tokens is filled with the interpreter's set
    again, doc2, err2 = inst.bisect("--workflow", _workflow(inst), "--good", good, "--bad", bad)
    assert (again, doc2["result"], doc2["measurements"]) == (0, "found", doc["measurements"]), err2
    other, _, err3 = inst.bisect("--good", "comfyui=HEAD", "--bad", bad)
    assert other == 1 and "another good state is in progress" in err3
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
    # what uv can install depends on the indexes this machine reaches, not on the state: the
    # skip is not cached, so once the wheel can be found a new bisect measures the state
    more = tmp_path / "more-wheels"
    shutil.copytree(wheels, more)
    write_wheel(more, "sentinel-ballast", "3.0", ballast_source(1.6))
    inst.env["UV_FIND_LINKS"] = str(more)
    assert inst.run("reset", "--comfyui", str(inst.root)).returncode == 0
    code, doc, err = inst.bisect("--workflow", _workflow(inst), "--good", good, "--bad", bad)
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    assert [(c["repo"], c["commit"]) for c in doc["culprits"]] == [("pkg:sentinel-ballast", "3.0")]
    inst.assert_untouched()


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _requirements_pack(src: Path, n: int, bump_at: int) -> list[str]:
    """A git node pack that scales the VRAM node by sentinel_ballast.SCALE at every commit and
    whose commit ``bump_at`` bumps requirements.txt to ``sentinel-ballast==2.0``."""
    src.mkdir(parents=True)
    _git(src, "init", "-q", "-b", "main")
    init = BALLAST_PACK.replace("BallastPassthrough", "ReqPassthrough")
    shas = []
    for i in range(n):
        (src / "__init__.py").write_text(init + f"\nREVISION = {i}\n")
        req = "sentinel-ballast==2.0\n" if i >= bump_at else "sentinel-ballast\n"
        (src / "requirements.txt").write_text(req)
        _git(src, "add", "-A")
        subject = "Require sentinel-ballast 2.0" if i == bump_at else f"Tidy up {i}"
        _git(
            src,
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "commit",
            "-q",
            "-m",
            subject,
        )
        shas.append(_git(src, "rev-parse", "HEAD"))
    return shas


def test_a_commit_that_bumps_a_requirement_gets_its_requirements_installed(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    wheels, runtime = wheelhouse
    inst = _install(tmp_path, wheels, ballast_pack=False, core_kw={"bad_commit_index": None})
    src = inst.base / "src" / "ReqPack"
    shas = _requirements_pack(src, 12, bump_at=7)
    dest = inst.root / "custom_nodes" / "ReqPack"
    _git(inst.root, "clone", "-q", str(src), str(dest))
    inst.before = inst.fingerprints() | {str(dest): repo_fingerprint(dest)}
    url = {"ReqPack": str(src)}
    good = _manager_snapshot(
        inst, "good", {**runtime, "sentinel-ballast": "1.0"}, {"ReqPack": shas[0]}, url
    )
    bad = _manager_snapshot(
        inst, "bad", {**runtime, "sentinel-ballast": "2.0"}, {"ReqPack": shas[-1]}, url
    )
    code, doc, err = inst.bisect(
        "--workflow", inst.workflow(vram_workflow()), "--good", good, "--bad", bad
    )
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    by_repo = {c["repo"]: c for c in doc["culprits"]}
    # the pack's commit alone (on the good package set) raises memory, through the
    # requirement it bumps; and the package moved on its own raises it too
    assert by_repo["node:ReqPack"]["commit"] == shas[7]
    assert by_repo["node:ReqPack"]["subject"] == "Require sentinel-ballast 2.0"
    assert by_repo["node:ReqPack"]["delta"]["delta_bytes"] == 600 * MIB
    assert by_repo["pkg:sentinel-ballast"]["commit"] == "2.0"
    # commits before the bump measured good on ballast 1.0: their requirements were already
    # met, so they ran in the good set's env; the ones after got an env with 2.0 installed
    bisected = [st for st in doc["steps"] if st["state"].get("node:ReqPack") in shas[1:-1]]
    assert bisected, doc["steps"]
    for st in bisected:
        bad_commit = shas.index(st["state"]["node:ReqPack"]) >= 7
        assert (st["kind"] == "new") == bad_commit, st
    fingerprint = {str(p): repo_fingerprint(p) for p in [*inst.repos(), dest]}
    assert fingerprint == inst.before
    say("commit_bumps_requirement", doc, doc["search"]["bound"])


def test_a_package_and_the_package_pinned_to_it_move_together(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    """ballast-helper 1.0 pins sentinel-ballast < 2 and 2.0 pins >= 2: a mix of one package
    from each endpoint breaks a pin, so it is refused (a skip), and the culprit set is the pair."""
    wheels, runtime = wheelhouse
    more = tmp_path / "wheels"
    shutil.copytree(wheels, more)
    write_wheel(
        more, "ballast-helper", "1.0", {"ballast_helper/__init__.py": ""}, ["sentinel-ballast<2"]
    )
    write_wheel(
        more, "ballast-helper", "2.0", {"ballast_helper/__init__.py": ""}, ["sentinel-ballast>=2"]
    )
    inst = _install(tmp_path, more, core_kw={"bad_commit_index": None})
    good = _manager_snapshot(
        inst, "good", {**runtime, "sentinel-ballast": "1.0", "ballast-helper": "1.0"}
    )
    bad = _manager_snapshot(
        inst, "bad", {**runtime, "sentinel-ballast": "2.0", "ballast-helper": "2.0"}
    )
    code, doc, err = inst.bisect("--workflow", _workflow(inst), "--good", good, "--bad", bad)
    assert (code, doc["result"]) == (0, "found"), err[-3000:]
    got = sorted((c["repo"], c["commit"], tuple(c["together"])) for c in doc["culprits"])
    assert got == [
        ("pkg:ballast-helper", "2.0", ("pkg:sentinel-ballast",)),
        ("pkg:sentinel-ballast", "2.0", ("pkg:ballast-helper",)),
    ]
    assert doc["search"]["groups"] == [["pkg:ballast-helper", "pkg:sentinel-ballast"]]
    assert "this mix of packages breaks a requirement" in err
    say("pinned_packages_move_together", doc, doc["search"]["bound"])
    inst.assert_untouched()


def test_a_side_without_a_package_set_runs_the_interpreters_own_and_resumes(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    """The bad snapshot records no pips: it is the interpreter's own set (this one, which has
    no ballast, so BallastPack scales nothing), run in the interpreter itself, not in a copy."""
    wheels, runtime = wheelhouse
    inst = _install(tmp_path, wheels, core_kw={"bad_commit_index": None})
    good = _manager_snapshot(inst, "good", {**runtime, "sentinel-ballast": "1.0"})
    bad = _manager_snapshot(inst, "bad", {})
    wf = inst.workflow(vram_workflow())
    code, doc, err = inst.bisect("--workflow", wf, "--good", good, "--bad", bad)
    assert (code, doc["result"]) == (4, "not-reproduced"), err[-3000:]
    assert "packages: built the env" in err  # the good state's, once
    envs = [p for p in (inst.base / "cache" / "bisect" / "envs").iterdir() if p.name[0] != "u"]
    assert len(envs) == 1
    again, doc2, err2 = inst.bisect("--workflow", wf, "--good", good, "--bad", bad)
    assert (again, doc2["result"]) == (4, "not-reproduced"), err2[-2000:]
    assert doc2["measurements"] == doc["measurements"]
    inst.assert_untouched()

"""STATE input that cannot lie (issue 10, item 2): repeated ``--good``/``--bad`` merge into one
state, a repo named twice with different refs or an unknown node is a usage error naming it,
and the chosen states are printed in full. The end-to-end run is in
test_bisect_e2e_culprits.py; here nothing is measured."""

from __future__ import annotations

import shlex

import pytest
from bisect_git import make_install

from oom_sentinel.bisect.cli.main import check_named_repos, merge_state_option, state_lines
from oom_sentinel.bisect.state.states import resolve_state, scan_install
from oom_sentinel.daemon.core.errors import EXIT_CONFIG, BadRef


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory):
    return make_install(tmp_path_factory.mktemp("states"), dirty=False)


def test_repeated_options_merge_into_one_state(inst) -> None:
    merged = merge_state_option(
        "--good", ["comfyui=v-first", "node:node_a=HEAD~2", "'node:node_b=HEAD~1'"]
    )
    assert merged is not None
    assert shlex.split(merged) == ["comfyui=v-first", "node:node_a=HEAD~2", "node:node_b=HEAD~1"]
    install = scan_install(inst.root)
    state = resolve_state(merged, install)
    assert state.comfyui == inst.core[0]  # the core is held where the user said, not at HEAD
    assert state.node("node_a") == inst.nodes["node_a"][-3]
    assert state.node("node_b") == inst.nodes["node_b"][-2]
    # the same pair twice, or an alias of the core, is the same thing said twice
    assert merge_state_option("--bad", ["comfyui=HEAD", "core=HEAD"]) == "comfyui=HEAD"
    assert merge_state_option("--bad", []) is None
    assert merge_state_option("--good", ["before-last-update"]) == "before-last-update"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["comfyui=v-first", "comfyui=v-mid"],
            "--good: ComfyUI is given twice with different refs",
        ),
        (
            ["node:node_a=HEAD", "node:node_a=HEAD~1"],
            "--good: custom_nodes/node_a is given twice with different refs ('HEAD' and 'HEAD~1')",
        ),
        (
            ["pack=HEAD"],
            "--good: 'pack=HEAD': the repo must be 'comfyui', 'node:NAME' or 'pkg:NAME'",
        ),
    ],
    ids=["core-twice", "node-twice", "not-a-repo"],
)
def test_a_contradiction_is_a_usage_error_naming_the_repo(values: list[str], message: str) -> None:
    with pytest.raises(BadRef) as exc:
        merge_state_option("--good", values)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.exit_code == EXIT_CONFIG


def test_an_unknown_node_is_a_usage_error_even_as_absent(inst) -> None:
    install = scan_install(inst.root)
    for arg in ("node:nope=absent", "comfyui=HEAD node:nope=HEAD"):
        with pytest.raises(BadRef, match=r"--bad: custom_nodes/nope: no such custom node"):
            check_named_repos("--bad", arg, install)
    check_named_repos("--bad", "comfyui=HEAD node:node_a=HEAD", install)  # known: fine


def test_the_states_are_printed_in_full(inst) -> None:
    install = scan_install(inst.root)
    good_arg = "comfyui=v-first node:node_a=HEAD~2"
    good = resolve_state(good_arg, install)
    bad = resolve_state("comfyui=HEAD", install)
    lines = state_lines("good", "--good", good_arg, good, good, bad)
    assert lines[0] == "good state (--good):"
    body = "\n".join(lines[1:])
    assert f"v-first → {inst.core[0]}  *" in body
    assert f"HEAD~2 → {inst.nodes['node_a'][-3]}  *" in body
    assert f"as installed → {inst.nodes['node_b'][-1]}" in body
    # every repo of either state, each once
    repos = ["ComfyUI", *(f"custom_nodes/{n}" for n, _ in sorted(good.nodes))]
    assert [line.split()[0] for line in lines[1:]] == repos
    snap = state_lines("bad", "--bad", "@bad", bad, good, bad, "snapshot 2026X")
    assert snap[0] == "bad state (snapshot 2026X):" and "from snapshot 2026X →" in snap[1]

"""Install states and STATE arguments (states.py), resolved against real git repos."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from bisect_git import (
    BASE_TS,
    build_history,
    git,
    make_install,
    node_history,
    untouched_install,
)

from oom_sentinel.bisect.state.states import (
    ABSENT,
    DISABLED,
    INSTALLED,
    State,
    before_last_update,
    check_value,
    differing_repos,
    parse_state_tokens,
    resolve_state,
    scan_install,
    split_state_arg,
    state_at_reflog,
)
from oom_sentinel.daemon.core.errors import BadRef, InputError
from oom_sentinel.daemon.install.reflog import ReflogEntry, history_from_entries
from oom_sentinel.daemon.install.state import url_key

H = "a" * 40
H2 = "b" * 40


# ---------------------------------------------------------------------- the State record


def test_absent_nodes_are_omitted_so_both_spellings_compare_equal() -> None:
    assert State.of(H, {"x": ABSENT}) == State.of(H)
    assert State.of(H, {"x": H2}).node("y") == ABSENT
    assert hash(State.of(H, {"b": H2, "a": DISABLED})) == hash(
        State.of(H, {"a": DISABLED, "b": H2})
    )


@pytest.mark.parametrize("name", ["..", "a/b", "a\\b", "", "x\ny"], ids=repr)
def test_node_names_are_single_path_components(name: str) -> None:
    with pytest.raises(ValueError, match="is not a custom node name"):
        State.of(H, {name: H2})


def test_with_values_switches_repos_and_json_round_trips() -> None:
    s = State.of(H, {"x": H2, "loose": INSTALLED})
    t = s.with_values({"comfyui": H2, "node:x": ABSENT, "node:new": "version:1.2.3"})
    assert t == State.of(H2, {"loose": INSTALLED, "new": "version:1.2.3"})
    assert State.from_json(json.loads(json.dumps(t.to_json()))) == t


def test_tokens_quote_odd_node_names_and_parse_back() -> None:
    s = State.of(H, {"my node's pack": H2})
    words = split_state_arg(" ".join(s.tokens()))
    assert parse_state_tokens(words) == {"comfyui": H, "node:my node's pack": H2}


@pytest.mark.parametrize(
    ("value", "repo"),
    [
        ("absent", "comfyui"),
        ("HEAD", "comfyui"),
        ("abc", "node:x"),
        ("version:", "node:x"),
        ("A" * 40, "comfyui"),
    ],
    ids=["core-absent", "symbolic", "short", "empty-version", "upper-hex"],
)
def test_invalid_state_values_are_rejected(value: str, repo: str) -> None:
    with pytest.raises(ValueError, match="is not a state value"):
        check_value(value, repo)


def test_differing_repos_lists_the_core_first_then_nodes_by_name() -> None:
    g = State.of(H, {"zeta": H, "alpha": H, "same": H})
    b = State.of(H2, {"zeta": H2, "same": H, "beta": DISABLED})
    assert differing_repos(g, b) == ["comfyui", "node:alpha", "node:beta", "node:zeta"]


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["comfyui"], "is not REPO=REF"),
        (["comfyui="], "is not REPO=REF"),
        (["foo=bar"], "must be 'comfyui', 'node:NAME' or 'pkg:NAME'"),
        (["node:=x"], "must be 'comfyui', 'node:NAME' or 'pkg:NAME'"),
        (["comfyui=a", "comfyui=b"], "given twice"),
        (["node:../../etc=absent"], "is not a custom node name"),
        (["node:a/b=HEAD"], "is not a custom node name"),
        (["node:..=HEAD"], "is not a custom node name"),
    ],
    ids=[
        "no-equals",
        "no-ref",
        "unknown-repo",
        "empty-node",
        "twice",
        "traversal",
        "slash",
        "dotdot",
    ],
)
def test_malformed_state_words(words: list[str], message: str) -> None:
    with pytest.raises(BadRef, match=message):
        parse_state_tokens(words)


# ---------------------------------------------------------------------- a real install


inst = untouched_install("states", "resolving states")


def test_scan_finds_every_kind_of_node(inst) -> None:
    install = scan_install(inst.root)
    assert install.head == inst.core[-1]
    kinds = {n.name: (n.kind, n.disabled, n.value()) for n in install.nodes}
    assert kinds == {
        "node_a": ("git", False, inst.nodes["node_a"][-1]),
        "node_b": ("git", False, inst.nodes["node_b"][-1]),
        "old_pack": ("git", True, DISABLED),
        "loose_pack": ("dir", False, INSTALLED),
        "single.py": ("file", False, INSTALLED),
    }  # the tracked websocket_image_save.py is part of the core, not a node


def test_scan_understands_manager_disabled_folder_and_registry_packs(tmp_path: Path) -> None:
    root = tmp_path / "ComfyUI"
    build_history(root, [("init", {"main.py": "", "custom_nodes/keep.txt": ""})])
    cn = root / "custom_nodes"
    (cn / ".disabled" / "reg-pack@1_2_3").mkdir(parents=True)
    (cn / "cnr-pack").mkdir()
    (cn / "cnr-pack" / ".tracking").write_text("")
    (cn / "cnr-pack" / "pyproject.toml").write_text('[project]\nname="x"\nversion = "2.0.1"\n')
    (cn / "both").mkdir()
    (cn / "both.disabled").mkdir()
    (cn / "__pycache__").mkdir()
    (cn / "notes.txt").write_text("not a node")
    (cn / "off.py.disabled").write_text("")
    nodes = {n.name: n.value() for n in scan_install(root).nodes}
    assert nodes == {
        "reg-pack": DISABLED,
        "cnr-pack": "version:2.0.1",
        "both": INSTALLED,
        "off.py": DISABLED,
    }


def test_scan_refuses_a_folder_that_is_not_comfyui(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a ComfyUI install"):
        scan_install(tmp_path)


def test_explicit_refs_resolve_and_unnamed_repos_keep_their_current_value(inst) -> None:
    install = scan_install(inst.root)
    s = resolve_state("comfyui=v-mid node:node_a=HEAD~3", install)
    assert s.comfyui == inst.core[15]
    assert s.node("node_a") == inst.nodes["node_a"][-4]
    assert s.node("node_b") == inst.nodes["node_b"][-1]
    assert s.node("old_pack") == DISABLED and s.node("single.py") == INSTALLED


def test_words_for_absent_disabled_and_copies(inst) -> None:
    install = scan_install(inst.root)
    s = resolve_state(
        [
            "comfyui=v-first",
            "node:node_b=absent",
            "node:node_a=disabled",
            "node:loose_pack=installed",
        ],
        install,
    )
    assert s.comfyui == inst.core[0]
    assert s.node("node_b") == ABSENT and s.node("node_a") == DISABLED
    assert s.node("loose_pack") == INSTALLED
    assert resolve_state("node:never_installed=absent", install) == install.current_state()


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("node:node_a=v9", "custom_nodes/node_a: 'v9' is not a commit"),
        ("comfyui=v9", "ComfyUI ({root}): 'v9' is not a commit"),
        ("comfyui=--output=/tmp/x", "ComfyUI ({root}): '--output=/tmp/x' is not a commit"),
        ("node:nosuch=HEAD", "custom_nodes/nosuch: no such custom node in {root}/custom_nodes"),
        ("node:loose_pack=abc123", "custom_nodes/loose_pack: 'abc123' is not available"),
        ("yesterday", "'yesterday' is not a state"),
        ("", "empty state"),
        ("comfyui='unclosed", "cannot parse state"),
    ],
    ids=[
        "node-junk",
        "core-junk",
        "option-injection",
        "unknown-node",
        "non-git-ref",
        "word",
        "empty",
        "quote",
    ],
)
def test_junk_refs_give_one_line_naming_repo_and_ref(inst, arg: str, message: str) -> None:
    install = scan_install(inst.root)
    with pytest.raises(BadRef) as err:
        resolve_state(arg, install)
    assert str(err.value).startswith(message.format(root=inst.root))
    assert "\n" not in str(err.value)


def test_unknown_words_go_to_the_snapshot_resolver(inst) -> None:
    install = scan_install(inst.root)
    wanted = State.of(inst.core[2])
    seen: list[str] = []

    def resolver(word: str) -> State:
        seen.append(word)
        if word != "2026-01-02_gpu_KSampler":
            raise BadRef(f"no snapshot {word!r}")
        return wanted

    assert resolve_state("2026-01-02_gpu_KSampler", install, snapshot_resolver=resolver) == wanted
    with pytest.raises(BadRef, match="no snapshot 'other'"):
        resolve_state("other", install, snapshot_resolver=resolver)
    assert seen == ["2026-01-02_gpu_KSampler", "other"]


# ---------------------------------------------------------------------- Manager snapshots


@pytest.mark.parametrize(
    "forms",
    [
        [
            "https://github.com/Someone/Node-A.git",
            "https://github.com/someone/node-a",
            "git@github.com:Someone/Node-A.git",
            "ssh://git@github.com/Someone/Node-A",
            "https://github.com/Someone/Node-A/",
            "https://user:tok@GitHub.com/Someone/Node-A",
        ],
        [
            "git@gitlab.com:Group/Sub/Repo.git",
            "https://gitlab.com/group/sub/repo",
            "ssh://git@gitlab.com:2222/Group/Sub/Repo.git/",
            "http://GitLab.com/Group/Sub/Repo",
        ],
    ],
    ids=["github", "gitlab"],
)
def test_remote_urls_compare_as_one_repository(forms: list[str]) -> None:
    assert len({url_key(u) for u in forms}) == 1
    assert url_key("https://gitlab.com/group/other") != url_key(forms[0])


def _manager_snapshot(inst) -> dict:
    return {
        "comfyui": inst.core[5],
        "git_custom_nodes": {
            "git@github.com:someone/node-a.git": {
                "hash": inst.nodes["node_a"][4] + "\n",
                "disabled": False,
            },
            "https://github.com/other/node_b": {"hash": "unknown", "disabled": False},
        },
        "cnr_custom_nodes": {},
        "file_custom_nodes": [{"filename": "single.py", "disabled": True}],
        "pips": {"torch==2.5.1": ""},
    }


def test_manager_snapshot_json_becomes_a_state(inst, tmp_path: Path) -> None:
    path = tmp_path / "2026-01-02_10-11-12_snapshot.json"
    path.write_text(json.dumps(_manager_snapshot(inst), indent=4))
    s = resolve_state(str(path), scan_install(inst.root))
    assert s.comfyui == inst.core[5]
    assert s.node("node_a") == inst.nodes["node_a"][4]  # newline quirk stripped, ssh URL matched
    assert s.node("node_b") == inst.nodes["node_b"][-1]  # "unknown": what is installed
    assert s.node("old_pack") == ABSENT  # a git node the snapshot doesn't list
    assert s.node("single.py") == DISABLED
    assert s.node("loose_pack") == INSTALLED


def test_manager_snapshot_yaml_is_wrapped_in_custom_nodes(inst, tmp_path: Path) -> None:
    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump({"custom_nodes": _manager_snapshot(inst)}))
    s = resolve_state(str(path), scan_install(inst.root))
    assert s.comfyui == inst.core[5] and s.node("node_a") == inst.nodes["node_a"][4]


def test_manager_snapshot_naming_an_uninstalled_node_is_a_bad_ref(inst, tmp_path: Path) -> None:
    data = _manager_snapshot(inst)
    data["git_custom_nodes"]["https://github.com/nobody/gone"] = {"hash": H, "disabled": False}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        BadRef, match=r"s\.json: custom node https://github.com/nobody/gone is not installed"
    ):
        resolve_state(str(path), scan_install(inst.root))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"workflow": {}}', "not a ComfyUI-Manager snapshot"),
        ('{"comfyui": "zz", "git_custom_nodes": {}}', "comfyui: not a commit hash"),
        ('{"git_custom_nodes": []}', "git_custom_nodes: expected an object"),
    ],
    ids=["syntax", "foreign", "bad-core-hash", "bad-shape"],
)
def test_broken_manager_snapshots_are_input_errors(
    inst, tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "broken.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        resolve_state(str(path), scan_install(inst.root))


def test_a_custom_nodes_only_manager_snapshot_keeps_the_core(inst, tmp_path: Path) -> None:
    data = _manager_snapshot(inst)
    data["comfyui"] = None
    path = tmp_path / "nodes-only.json"
    path.write_text(json.dumps(data))
    s = resolve_state(str(path), scan_install(inst.root))
    assert s.comfyui == inst.core[-1] and s.node("node_a") == inst.nodes["node_a"][4]


def test_an_abbreviated_manager_hash_resolves_in_the_node_repo(inst, tmp_path: Path) -> None:
    data = _manager_snapshot(inst)
    data["comfyui"] = inst.core[2][:10]
    short = inst.nodes["node_a"][1][:9]
    data["git_custom_nodes"]["git@github.com:someone/node-a.git"]["hash"] = short
    path = tmp_path / "short.json"
    path.write_text(json.dumps(data))
    s = resolve_state(str(path), scan_install(inst.root))
    assert s.comfyui == inst.core[2] and s.node("node_a") == inst.nodes["node_a"][1]


# ---------------------------------------------------------------------- reflog states


def _fake_install(tmp_path: Path):
    from oom_sentinel.bisect.state.states import Install, NodeInstall

    nodes = tuple(
        NodeInstall(n, tmp_path / n, "git", False, head=h)
        for n, h in (("a", "1" * 40), ("b", "2" * 40), ("c", "3" * 40))
    )
    return Install(tmp_path, "9" * 40, nodes)


def _log(*moves: tuple[str | None, str, int, str]) -> list[ReflogEntry]:
    return [ReflogEntry(o, n, "U", "u@x", t, "+0000", m) for o, n, t, m in moves]


def test_head_at_n_is_the_whole_install_at_that_moment(tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    core = _log(
        (None, "7" * 40, 100, "clone: from x"),
        ("7" * 40, "8" * 40, 200, "pull: Fast-forward"),
        ("8" * 40, "9" * 40, 300, "pull: Fast-forward"),
    )
    nodes = {
        "node:a": history_from_entries(
            "a", _log((None, "5" * 40, 150, "clone: from y"), ("5" * 40, "1" * 40, 250, "pull"))
        ),
        "node:b": history_from_entries("b", _log((None, "2" * 40, 260, "clone: from z"))),
        "node:c": history_from_entries("c", []),
    }
    s = state_at_reflog(install, core, nodes, 1)
    assert (s.comfyui, s.node("a"), s.node("b"), s.node("c")) == (
        "8" * 40,
        "5" * 40,
        ABSENT,
        "3" * 40,
    )
    assert state_at_reflog(install, core, nodes, 0) == install.current_state().with_values(
        {"node:a": "1" * 40}
    )
    with pytest.raises(BadRef, match=r"HEAD@\{3\}: the reflog has only 3 entries"):
        state_at_reflog(install, core, nodes, 3)


def test_before_last_update_without_any_update_is_a_bad_ref(tmp_path: Path) -> None:
    with pytest.raises(BadRef, match="before-last-update: no pull"):
        before_last_update(_fake_install(tmp_path), [])


@pytest.fixture
def updated_install(tmp_path: Path):
    """A real install updated twice, with reflogs written by git itself:

    T0        core reset to c3, node_a to a2, node_b to b1        (install)
    T1        core merge c7, node_b merge b7                      (an old update)
    T2        core merge c9                                       (an update)
    T2+300    node_c cloned                                       (an install, not an update)
    T2+600    node_a merge a11                                    (the last update)
    T2+900    node_b: a local commit                              (not an update)
    """
    inst = make_install(tmp_path, core_commits=10, dirty=False)
    core, a, b = inst.core, inst.nodes["node_a"], inst.nodes["node_b"]
    t0, t1, t2 = BASE_TS + 10_000, BASE_TS + 900_000, BASE_TS + 1_800_000
    git(inst.root, "reset", "-q", "--hard", core[3], ts=t0)
    git(inst.custom_nodes / "node_a", "reset", "-q", "--hard", a[2], ts=t0)
    git(inst.custom_nodes / "node_b", "reset", "-q", "--hard", b[1], ts=t0)
    git(inst.root, "merge", "-q", "--ff-only", core[7], ts=t1)
    git(inst.custom_nodes / "node_b", "merge", "-q", "--ff-only", b[7], ts=t1)
    git(inst.root, "merge", "-q", "--ff-only", core[9], ts=t2)
    src = tmp_path / "node_c_src"
    c = build_history(src, node_history("node_c", 4))
    git(inst.custom_nodes, "clone", "-q", str(src), "node_c", ts=t2 + 300)
    git(inst.custom_nodes / "node_a", "merge", "-q", "--ff-only", a[11], ts=t2 + 600)
    (inst.custom_nodes / "node_b" / "local.txt").write_text("x")
    git(inst.custom_nodes / "node_b", "add", "local.txt")
    git(inst.custom_nodes / "node_b", "commit", "-q", "-m", "local", ts=t2 + 900)
    return inst, c


def test_before_last_update_from_real_reflogs(updated_install) -> None:
    inst, c = updated_install
    install = scan_install(inst.root)
    s = resolve_state("before-last-update", install)
    # the last update is T2+600 (a clone splits updates); before it: after node_c's clone
    assert s.comfyui == inst.core[9]
    assert s.node("node_a") == inst.nodes["node_a"][2]
    assert s.node("node_b") == inst.nodes["node_b"][7]  # the install as it was then
    assert s.node("node_c") == c[-1]
    # exactly what `oom-sentinel states history` calls the state before the last update
    from oom_sentinel.bisect.state.states import state_from_install_state
    from oom_sentinel.daemon.install.reflog import import_install_history, last_update

    found = last_update(import_install_history(inst.root))
    assert found is not None
    assert install.own(state_from_install_state(found[0].state, "history")) == s
    # the daemon lists the core's tracked websocket_image_save.py as a file; a state does not
    assert "websocket_image_save.py" in found[0].state.node_table()
    assert s.node("websocket_image_save.py") == ABSENT


def test_before_last_update_right_after_the_install_and_a_same_day_pull(tmp_path: Path) -> None:
    """Cloned, a pack installed, and the core pulled 20 minutes later: the bisect's
    before-last-update is the install as cloned (it used to fail: "ComfyUI was cloned then")."""
    inst = make_install(tmp_path, core_commits=6, dirty=False)
    upstream = tmp_path / "upstream_core"
    git(tmp_path, "clone", "-q", str(inst.root), str(upstream), ts=BASE_TS)
    user = tmp_path / "user" / "ComfyUI"
    git(tmp_path, "clone", "-q", str(upstream), str(user), ts=BASE_TS + 100)
    git(user, "reset", "-q", "--hard", inst.core[3], ts=BASE_TS + 110)
    pack = tmp_path / "upstream_pack"
    commits = build_history(pack, node_history("late_pack", 3))
    git(user / "custom_nodes", "clone", "-q", str(pack), "late_pack", ts=BASE_TS + 200)
    git(user, "pull", "-q", "--ff-only", ts=BASE_TS + 1300)
    install = scan_install(user)
    s = resolve_state("before-last-update", install)
    assert s.comfyui == inst.core[3]  # before the pull, after the install's own reset
    assert s.node("late_pack") == commits[-1]
    assert install.head == inst.core[-1]


def test_head_at_1_from_real_reflogs(updated_install) -> None:
    inst, c = updated_install
    install = scan_install(inst.root)
    s = resolve_state("HEAD@{1}", install)  # core's entry at T1
    assert s.comfyui == inst.core[7]
    assert s.node("node_a") == inst.nodes["node_a"][2]
    assert s.node("node_b") == inst.nodes["node_b"][7]
    assert s.node("node_c") == ABSENT
    # a reflog position is also a plain REF for one repo
    assert resolve_state("comfyui=HEAD@{2}", install).comfyui == inst.core[3]
    assert resolve_state("node:node_c=HEAD", install).node("node_c") == c[-1]


def test_resolving_a_state_of_a_worktree_free_copy_needs_no_write_access(
    inst, tmp_path: Path
) -> None:
    """Resolution only reads: it works on a read-only copy of the install."""
    copy = tmp_path / "ro" / "ComfyUI"
    shutil.copytree(inst.root, copy, symlinks=True)
    for p in [copy, *copy.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~0o222)
    try:
        s = resolve_state("comfyui=v-mid node:node_a=HEAD~1", scan_install(copy))
        assert s.comfyui == inst.core[15]
    finally:
        for p in [copy, *copy.rglob("*")]:
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | 0o200)


# ---------------------------------------------------------------------- git plumbing


def test_candidates_follow_first_parents_so_a_merged_branch_is_one_step(tmp_path: Path) -> None:
    """
    c0 - c1 - c2 - M - c4        master (first parents)
           \\      /
            b1 - b2              topic, merged at M
    """
    from oom_sentinel.bisect.state.gitrepo import commit_info, first_parent_range, is_ancestor

    repo = tmp_path / "r"
    c0, c1 = build_history(repo, [("c0", {"f": "0"}), ("c1", {"f": "1"})])
    git(repo, "checkout", "-q", "-b", "topic")
    b1, b2 = build_history(repo, [("b1", {"b": "1"}), ("b2", {"b": "2"})], branch="topic")
    git(repo, "checkout", "-q", "master")
    (c2,) = build_history(repo, [("c2", {"f": "2"})])
    git(repo, "merge", "-q", "--no-ff", "-m", "M merge topic", "topic")
    m = git(repo, "rev-parse", "HEAD").strip()
    (c4,) = build_history(repo, [("c4 last", {"g": "4"})])
    assert first_parent_range(repo, c0, c4, "r") == (c1, c2, m, c4)
    assert b1 not in first_parent_range(repo, c0, c4, "r")
    assert first_parent_range(repo, c4, c0, "r") == ()  # a downgrade: one step
    assert is_ancestor(repo, c0, c4) and not is_ancestor(repo, c4, c0)
    info = commit_info(repo, m, "r")
    assert info.sha == m and info.subject == "M merge topic"
    assert info.author == "Test Author <author@example.com>"
    assert info.files == ("b",)  # the first-parent diff of the merge
    assert commit_info(repo, c4, "r").files == ("g",) and info.date.startswith("20")
    assert b2 in git(repo, "rev-list", "topic")


def test_a_missing_manager_snapshot_file_is_named(inst, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"gone\.json: no such manager snapshot file"):
        resolve_state(str(tmp_path / "gone.json"), scan_install(inst.root))

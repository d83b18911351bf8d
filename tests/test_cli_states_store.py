"""``oom-sentinel states list | show ID | diff A B`` on the states the daemon recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from install_builder import Install, build_install, commit_files, git

from oom_sentinel.daemon.cli.main import main
from oom_sentinel.daemon.core.errors import EXIT_INPUT
from oom_sentinel.daemon.install.history import record_capture, record_observation
from oom_sentinel.daemon.install.state import InstallState, capture_install
from oom_sentinel.daemon.store.db import Store


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Install, InstallState, InstallState]:
    """A data dir holding two captures of one install: before and after an update that pulled
    ComfyUI-Foo two commits, disabled plain-folder, added a single-file node and moved torch."""
    base = tmp_path_factory.mktemp("cli-store")
    inst = build_install(base)
    before = capture_install(inst.root).with_environment(
        ("torch==2.5.1+cu124", "numpy==1.26.4", "einops==0.8.0"), None
    )
    up = inst.upstreams["ComfyUI-Foo"]
    for i in (4, 5):
        inst.shas["ComfyUI-Foo"].append(
            commit_files(up, {"nodes.py": f"V = {i}\n"}, f"ComfyUI-Foo {i}", inst.clock.tick())
        )
    git(inst.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only", at=inst.clock.tick())
    os.rename(inst.custom_nodes / "plain-folder", inst.custom_nodes / "plain-folder.disabled")
    (inst.custom_nodes / "new_node.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    after = capture_install(inst.root).with_environment(
        ("torch==2.6.0+cu124", "numpy==1.26.4"), None
    )
    data = base / "data"
    with Store.open(data) as store:
        record_observation(store, "main", before, at_s=900.0, source="reflog")
        # a capture of the same state after a daemon restart (record_capture would skip it)
        record_observation(store, "main", before, at_s=1000.0, source="capture")
        assert record_capture(store, "main", after, at_s=2000.0)
    return data, inst, before, after


def test_list_shows_every_state_newest_first_and_which_is_current(
    recorded: tuple[Path, Install, InstallState, InstallState],
) -> None:
    data, _inst, before, after = recorded
    result = run("states", "list", "--data-dir", str(data), "--json")
    assert result.exit_code == 0, result.output
    states = json.loads(result.output)["states"]
    assert [s["state_id"] for s in states] == [after.state_id, before.state_id]
    assert states[0]["current_for"] == ["main"] and states[1]["current_for"] == []
    assert states[1]["observed_by"] == ["capture", "reflog"]
    assert states[0]["last_observed"] == "1970-01-01T00:33:20.000Z"
    assert states[0]["comfyui"] == after.comfyui.commit and states[0]["pip"] is True
    text = run("states", "list", "--data-dir", str(data)).output
    first, second = text.splitlines()[1:3]
    assert first.startswith(after.state_id) and first.endswith("current (main)")
    assert second.startswith(before.state_id)
    assert run("states", "list", "--data-dir", str(data), "--instance", "nope").output.startswith(
        "no install states recorded"
    )


def test_show_by_id_prefix_prints_the_state_and_when_it_was_seen(
    recorded: tuple[Path, Install, InstallState, InstallState],
) -> None:
    data, _inst, before, _after = recorded
    result = run("states", "show", before.state_id[:6], "--data-dir", str(data), "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["state_id"] == before.state_id and shown["comfyui"] == before.comfyui.commit
    assert shown["nodes"]["ComfyUI-Foo"]["commit"] == before.node("ComfyUI-Foo").commit  # type: ignore[union-attr]
    assert InstallState.from_dict(shown["state"]) == before
    assert [(o["source"], o["at_s"]) for o in shown["observations"]] == [
        ("reflog", 900.0),
        ("capture", 1000.0),
    ]
    text = run("states", "show", before.state_id, "--data-dir", str(data)).output
    assert f"state {before.state_id}" in text and "observed: main from" in text
    # it offers the way to run that state beside the install, and that command takes the id
    assert f"oom-bisect checkout {before.state_id} --into DIR" in text


def test_diff_by_ids_gives_ranges_node_changes_and_pip(
    recorded: tuple[Path, Install, InstallState, InstallState],
) -> None:
    data, inst, before, after = recorded
    result = run(
        "states", "diff", before.state_id, after.state_id[:8], "--data-dir", str(data), "--json"
    )
    assert result.exit_code == 0, result.output
    diff = json.loads(result.output)
    (foo,) = diff["repos"]
    assert foo["repo"] == "ComfyUI-Foo"
    assert foo["range"]["ahead"] == 2 and foo["range"]["behind"] == 0
    assert (foo["range"]["first_subject"], foo["range"]["last_subject"]) == (
        "ComfyUI-Foo 4",
        "ComfyUI-Foo 5",
    )
    changes = {(n["name"], n["change"]) for n in diff["nodes"]}
    assert changes == {("plain-folder", "disabled"), ("new_node.py", "added")}
    pip = {p["name"]: (p["old"], p["new"], p["gpu_stack"]) for p in diff["pip"]}
    assert pip == {
        "torch": ("2.5.1+cu124", "2.6.0+cu124", True),
        "einops": ("0.8.0", None, False),
    }
    text = run("states", "diff", before.state_id, after.state_id, "--data-dir", str(data)).output
    assert (
        "custom_nodes/ComfyUI-Foo: " in text
        and '2 new commits: "ComfyUI-Foo 4" ... "ComfyUI-Foo 5"' in text
    )
    assert "custom_nodes/plain-folder: disabled" in text
    assert "pip torch: 2.5.1+cu124 -> 2.6.0+cu124  [GPU stack]" in text
    # an id against the install on disk, captured now
    live = run(
        "states",
        "diff",
        after.state_id,
        str(inst.root),
        "--no-python",
        "--data-dir",
        str(data),
        "--json",
    )
    assert live.exit_code == 0, live.output
    assert json.loads(live.output)["repos"] == [] and json.loads(live.output)["nodes"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("states", "show", "ffffffff"), "no install state 'ffffffff'"),
        (("states", "diff", "ffffffff", "eeeeeeee"), "no install state 'ffffffff'"),
        (("states", "show", "nope.json"), "nope.json: no such file"),
    ],
    ids=["unknown-id", "unknown-ids-in-diff", "missing-file"],
)
def test_unknown_states_are_one_line_and_exit_3(
    recorded: tuple[Path, Install, InstallState, InstallState], args: tuple[str, ...], message: str
) -> None:
    data = recorded[0]
    result = run(*args, "--data-dir", str(data))
    assert result.exit_code == EXIT_INPUT
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


def test_an_id_without_a_store_says_which_data_dir_has_none(tmp_path: Path) -> None:
    result = run("states", "show", "abcdef12", "--data-dir", str(tmp_path / "empty"))
    assert result.exit_code == EXIT_INPUT
    assert (
        "no oom-sentinel store here" in result.stderr and str(tmp_path / "empty") in result.stderr
    )
    listing = run("states", "list", "--data-dir", str(tmp_path / "empty"), "--json")
    assert listing.exit_code == 0 and json.loads(listing.output) == {"states": []}
    assert not (tmp_path / "empty").exists()  # looking creates nothing

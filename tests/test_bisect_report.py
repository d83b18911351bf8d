"""The report (report.py): the culprit with what git knows about it, every tested state and
run, a terminal table, report.json and a self-contained report.html with a chart — and the
copy attached to a crash snapshot, which never rewrites the snapshot's own files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from bisect_git import make_install
from bisect_oracle import Oracle
from rich.console import Console

from oom_sentinel.bisect.search.plan import Culprit, Error, Found
from oom_sentinel.bisect.session.files import BisectPaths, begin
from oom_sentinel.bisect.session.report import (
    attach_to_snapshot,
    build_report,
    culprit_details,
    github_commit_url,
    render_html,
    render_terminal,
    result_of,
    write_reports,
)
from oom_sentinel.bisect.session.runner import Runner
from oom_sentinel.bisect.state.states import scan_install
from oom_sentinel.daemon.incidents.bisect_results import latest_report

PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}}}
NODE_BAD = 7


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory):
    return make_install(tmp_path_factory.mktemp("report"), dirty=False)


@pytest.fixture(scope="module")
def finished(inst, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Oracle]:
    """A node_a bisect run to its end (node_a's remote is on GitHub)."""
    home = tmp_path_factory.mktemp("cache") / "bisect"
    paths = BisectPaths.for_install(inst.root, home=home)
    sess = begin(
        paths,
        scan_install(inst.root),
        f"node:node_a={inst.nodes['node_a'][0]}",
        "node:node_a=HEAD",
        prompt=PROMPT,
    )
    oracle = Oracle(
        bad=lambda s: inst.nodes["node_a"].index(s.node("node_a")) >= NODE_BAD, oom=True
    )
    step = Runner(sess, oracle, PROMPT).run()
    return sess, step, oracle


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("https://github.com/Comfy-Org/ComfyUI.git", "https://github.com/Comfy-Org/ComfyUI"),
        ("git@github.com:ltdrdata/ComfyUI-Manager", "https://github.com/ltdrdata/ComfyUI-Manager"),
        ("ssh://git@github.com/a/b.git", "https://github.com/a/b"),
        ("https://user:token@github.com/a/b/", "https://github.com/a/b"),
        ("https://gitlab.com/a/b.git", None),
        ("/srv/mirror/ComfyUI", None),
    ],
    ids=["https", "scp-ssh", "ssh-url", "credentials-dropped", "gitlab", "local-path"],
)
def test_github_links_come_from_the_remote(url: str, want: str | None) -> None:
    got = github_commit_url([url], "abc123")
    assert got == (None if want is None else want + "/commit/abc123")


def test_the_culprit_carries_subject_author_date_files_and_link(inst, finished) -> None:
    sess, step, _ = finished
    sha = inst.nodes["node_a"][NODE_BAD]
    assert step == Found((Culprit("node:node_a", sha, inst.nodes["node_a"][NODE_BAD - 1]),))
    report = build_report(sess, step)
    assert report["result"] == "found" and result_of(step) == "found"
    (c,) = report["culprits"]
    assert c["label"] == "custom_nodes/node_a" and c["commit"] == sha
    assert c["subject"] == f"node_a change {NODE_BAD}"
    assert c["author"] == "Test Author <author@example.com>" and c["date"].startswith("2023-")
    assert sorted(c["files"]) == ["__init__.py", "version.txt"]
    assert c["url"] == f"https://github.com/Someone/Node-A/commit/{sha}"


def test_every_tested_state_and_every_run_is_in_the_report(finished) -> None:
    sess, step, oracle = finished
    report = build_report(sess, step)
    assert report["measurements"] == report["launches"] == len(oracle.calls)
    assert len(report["steps"]) == len(sess.records())
    first, second = report["steps"][:2]
    assert (first["verdict"], first["outcome"], first["peak_vram_bytes"]) == (
        "good",
        "ok",
        1000 * 1024 * 1024,
    )
    assert (second["verdict"], second["outcome"]) == ("bad", "oom")
    assert "CUDA out of memory" in second["reason"]
    assert report["threshold"]["vram_bytes"] == int(1000 * 1024 * 1024 * 1.1)
    assert report["runs"][0]["timings"]["ready_s"] == 0.3
    json.dumps(report)  # JSON-ready as it is


def test_the_terminal_table_names_the_culprit(finished) -> None:
    sess, step, _ = finished
    console = Console(record=True, width=140)
    render_terminal(build_report(sess, step), console)
    text = console.export_text()
    assert "first bad commit" in text and "node_a change 7" in text
    assert "Tested states" in text and "OOM" not in text.split("Tested states")[0]


def test_report_html_is_one_self_contained_page_with_a_chart(finished) -> None:
    sess, step, _ = finished
    page = render_html(build_report(sess, step))
    assert page.startswith("<!doctype html>") and "<svg" in page
    assert "Peak memory per tested state" in page  # the chart's title, drawn by matplotlib
    assert "https://github.com/Someone/Node-A/commit/" in page
    # nothing to fetch: no scripts, stylesheets or images from elsewhere
    for needle in ("<script", "<link", "<img", " src=", "url(http", "@import"):
        assert needle not in page


def test_html_escapes_what_comes_from_repos(finished) -> None:
    sess, step, _ = finished
    report = build_report(sess, step)
    report["culprits"][0]["subject"] = "<script>alert(1)</script> & more"
    page = render_html(report)
    assert (
        "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    )


def test_a_value_that_is_not_a_commit_is_described(inst) -> None:
    c = culprit_details(Culprit("node:new_pack", "installed", "absent"), {})
    assert c["subject"] == "custom_nodes/new_pack was installed (installed)"
    assert culprit_details(Culprit("node:x", "absent", "abc"), {})["subject"].endswith("removed")


def test_an_endpoint_error_is_reported_with_its_message(inst, tmp_path) -> None:
    paths = BisectPaths.for_install(inst.root, home=tmp_path / "bisect")
    sess = begin(paths, scan_install(inst.root), "comfyui=v-first", "comfyui=HEAD", prompt=PROMPT)
    step = Runner(sess, Oracle(bad=lambda s: False), PROMPT).run()
    assert isinstance(step, Error)
    report = build_report(sess, step)
    assert report["result"] == "not-reproduced" and "does not reproduce" in report["message"]
    assert report["measurements"] == 2 and report["culprits"] == []
    assert "not-reproduced" in render_html(report)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_reports_attach_to_a_snapshot_without_touching_its_files(finished, tmp_path) -> None:
    sess, step, _ = finished
    snap = tmp_path / "20260102T101112Z_gpu_KSampler"
    snap.mkdir(mode=0o700)
    (snap / "snapshot.json").write_text('{"schema_version": 1}\n')
    (snap / "prompt.json").write_text("{}\n")
    before = _tree(snap)
    written = write_reports(build_report(sess, step), tmp_path / "out", snapshot_dir=snap)
    assert written.attached_to == snap / "bisect"
    again = write_reports(build_report(sess, step), tmp_path / "out", snapshot_dir=snap)
    assert again.attached_to == snap / "bisect-2"
    after = _tree(snap)
    assert {k: v for k, v in after.items() if "/" not in k} == before
    assert sorted(p.name for p in snap.iterdir()) == [
        "bisect",
        "bisect-2",
        "prompt.json",
        "snapshot.json",
    ]
    assert json.loads((snap / "bisect" / "report.json").read_text())["result"] == "found"
    # written as built (through its model), and the daemon reads it back through the same one
    built = json.loads(json.dumps(build_report(sess, step)))
    on_disk = json.loads(written.json_path.read_text())
    assert on_disk | {"generated": None} == built | {"generated": None}
    answer = latest_report(snap)
    assert answer is not None and answer.folder == "bisect-2" and answer.finished
    assert [c.label for c in answer.culprits] == [
        c["label"] for c in build_report(sess, step)["culprits"]
    ]
    assert (snap / "bisect" / "report.html").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.json"]


def test_a_failed_attachment_leaves_nothing_behind(tmp_path, monkeypatch) -> None:
    snap = tmp_path / "snap"
    snap.mkdir()
    import oom_sentinel.bisect.session.report as rep

    def boom(path: Path, data: bytes, mode: int = 0o600) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rep, "write_bytes_atomic", boom)
    with pytest.raises(OSError):
        attach_to_snapshot(snap, {"report.json": b"{}"})
    assert list(snap.iterdir()) == []

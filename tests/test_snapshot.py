"""Snapshot directories: atomic, private, never rewritten, schema-valid, readable back."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest
import snapshot_samples as samples

from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.incidents.snapshot import (
    SCHEMA_PATH,
    SnapshotNotFound,
    SnapshotWriteError,
    clean_leftovers,
    collect_host_facts,
    export_snapshot,
    find_snapshot,
    iso_utc,
    list_snapshots,
    load_snapshot,
    validate_snapshot_json,
    write_snapshot,
)
from oom_sentinel.daemon.install.state import CoreState, InstallState

TESTS = Path(__file__).resolve().parent


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_snapshot_is_complete_private_and_named_for_time_pool_and_node(tmp_path: Path) -> None:
    ref = write_snapshot(tmp_path / "snapshots", samples.content())
    assert ref.id == "20260102T101113Z_gpu_KSampler"
    assert ref.path == tmp_path / "snapshots" / ref.id
    assert sorted(os.listdir(ref.path)) == [
        "log.txt",
        "prompt.json",
        "snapshot.json",
        "timeline.csv",
        "workflow.json",
    ]
    assert stat.S_IMODE(ref.path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "snapshots").stat().st_mode) == 0o700
    for name in os.listdir(ref.path):
        assert stat.S_IMODE((ref.path / name).stat().st_mode) == 0o600, name
    assert os.listdir(tmp_path / "snapshots") == [ref.id]  # no temp dir left behind
    assert (ref.path / "log.txt").read_text() == samples.LOG_TEXT
    assert (ref.path / "timeline.csv").read_text() == samples.TIMELINE_CSV
    assert json.loads((ref.path / "prompt.json").read_text()) == samples.PROMPT
    assert json.loads((ref.path / "workflow.json").read_text()) == samples.WORKFLOW


def test_snapshot_json_holds_the_merged_incident(tmp_path: Path) -> None:
    ref = write_snapshot(tmp_path, samples.content())
    data = json.loads((ref.path / "snapshot.json").read_text())
    assert data["schema_version"] == 1
    assert data["id"] == ref.id
    assert data["created"] == "2026-01-02T10:11:13.250Z"
    assert data["instance"] == {
        "name": "main",
        "path": "/opt/ComfyUI",
        "url": "http://127.0.0.1:8188",
    }
    event = data["event"]
    assert (event["pool"], event["backend"], event["node_type"], event["requested_bytes"]) == (
        "gpu",
        "cuda",
        "KSampler",
        2 * samples.GIB,
    )
    assert [o["source"] for o in data["observations"]] == ["log", "api"]
    assert data["observations"][1]["evidence"] == {"prompt_id": "p-1"}
    assert data["sources"] == ["api", "log"]
    assert data["incident"]["count"] == 1
    assert data["advice"][0] == {"key": "other-gpu-processes", "text": samples.ADVICE[0].text}
    gpu_procs = data["memory"]["gpu_processes"]
    assert [(p["pid"], p["watched"]) for p in gpu_procs] == [
        (4242, True),
        (999, False),
        (31337, False),
    ]
    assert gpu_procs[2]["used_bytes"] is None  # unknown stays unknown, never 0
    assert data["memory"]["host"]["ram_total_bytes"] == 64 * samples.GIB
    assert data["host"]["hostname"] == "render-box"
    assert data["process"]["pid"] == 4242
    assert data["files"] == {
        "log": "log.txt",
        "timeline": "timeline.csv",
        "prompt": "prompt.json",
        "workflow": "workflow.json",
    }
    assert data["summary"].startswith("GPU out of memory in KSampler (node 3) on main")


def test_snapshot_json_validates_against_the_shipped_schema(tmp_path: Path) -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for content in (
        samples.content(),
        samples.content(memory=None, with_prompt=False, sections={}, advice=()),
        samples.content(node_type=None),
    ):
        ref = write_snapshot(tmp_path, content)
        data = json.loads((ref.path / "snapshot.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(data)
        assert validate_snapshot_json(data) is None


def test_optional_sections_are_objects_and_unknown_ones_refused(tmp_path: Path) -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    ref = write_snapshot(tmp_path, samples.content())
    data = json.loads((ref.path / "snapshot.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    state = InstallState(CoreState(commit="abc1234")).to_dict()
    validator.validate({**data, "install_state": state})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**data, "install_state": "not an object"})
    with pytest.raises(jsonschema.ValidationError):  # defined now: a state, not any object
        validator.validate({**data, "install_state": {"comfyui": {"commit": "abc"}}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**data, "surprise": {}})
    with pytest.raises(ValueError, match="unknown snapshot sections"):
        write_snapshot(tmp_path, samples.content(sections={"surprise": {}}))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


@pytest.mark.parametrize(
    ("node_type", "expected"),
    [
        (None, "20260102T101113Z_gpu_log"),
        ("VAEDecodeTiled", "20260102T101113Z_gpu_VAEDecodeTiled"),
        ("My Node/../../etc", "20260102T101113Z_gpu_My-Node-..-..-etc"),
        ("节点 ✨", "20260102T101113Z_gpu_unknown"),
        ("x" * 200, "20260102T101113Z_gpu_" + "x" * 48),
    ],
    ids=["no-node-uses-source", "plain", "path-chars", "non-ascii", "long"],
)
def test_directory_name_is_sanitised(tmp_path: Path, node_type: str | None, expected: str) -> None:
    ref = write_snapshot(tmp_path, samples.content(node_type=node_type))
    assert ref.id == expected
    assert ref.path.parent == tmp_path


def test_a_second_snapshot_in_the_same_second_gets_a_suffix_and_the_first_is_untouched(
    tmp_path: Path,
) -> None:
    first = write_snapshot(tmp_path, samples.content())
    before = tree_digest(first.path)
    second = write_snapshot(tmp_path, samples.content())
    third = write_snapshot(tmp_path, samples.content())
    assert (second.id, third.id) == (f"{first.id}_2", f"{first.id}_3")
    assert tree_digest(first.path) == before
    assert json.loads((second.path / "snapshot.json").read_text())["id"] == second.id


def test_a_snapshots_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "snapshots"
    blocker.write_text("in the way")
    with pytest.raises(SnapshotWriteError) as info:
        write_snapshot(blocker, samples.content())
    assert "\n" not in str(info.value) and "cannot write the snapshot" in str(info.value)


CRASHING_WRITER = """
import os, sys
sys.path.insert(0, sys.argv[2])
import snapshot_samples
from oom_sentinel.daemon.incidents import snapshot
snapshot.fsync_dir = lambda path: os.kill(os.getpid(), 9)  # die just before the rename
snapshot.write_snapshot(sys.argv[1], snapshot_samples.content())
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_writer_killed_mid_write_leaves_no_snapshot_and_start_cleans_up(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(tmp_path), str(TESTS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr
    leftovers = os.listdir(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-20260102T101113Z_gpu_KSampler-")
    assert list_snapshots(tmp_path) == ([], [])
    (tmp_path / ".trash-old-1234").mkdir()
    (tmp_path / ".trash-old-1234" / "log.txt").write_text("x")
    (tmp_path / "notes").mkdir()  # not ours: untouched
    removed = clean_leftovers(tmp_path)
    assert removed == sorted([leftovers[0], ".trash-old-1234"])
    assert os.listdir(tmp_path) == ["notes"]


# --- reading back -------------------------------------------------------------------------------


def test_load_snapshot_reads_what_was_written(tmp_path: Path) -> None:
    ref = write_snapshot(tmp_path, samples.content())
    snap = load_snapshot(ref.path)
    assert (snap.id, snap.path, snap.instance_name) == (ref.id, ref.path, "main")
    assert snap.list_entry() == {
        "id": ref.id,
        "created": "2026-01-02T10:11:13.250Z",
        "instance": "main",
        "pool": "gpu",
        "backend": "cuda",
        "node_type": "KSampler",
        "exception_type": "torch.OutOfMemoryError",
        "summary": snap.summary,
        "count": 1,
        "path": str(ref.path),
    }


def _corrupt(kind: str, path: Path) -> None:
    doc = path / "snapshot.json"
    data = json.loads(doc.read_text())
    if kind == "missing":
        doc.unlink()
    elif kind == "truncated":
        doc.write_text(doc.read_text()[:100])
    elif kind == "binary":
        doc.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "foreign":
        doc.write_text(json.dumps({"name": "some other tool", "version": 3}))
    elif kind == "newer":
        doc.write_text(json.dumps({**data, "schema_version": 99}))
    elif kind == "bad-pool":
        data["event"]["pool"] = "vram"
        doc.write_text(json.dumps(data))
    elif kind == "missing-key":
        del data["host"]
        doc.write_text(json.dumps(data))
    elif kind == "string-count":
        data["incident"]["count"] = "1"
        doc.write_text(json.dumps(data))
    elif kind == "bad-time":
        data["observations"][1]["at"] = "yesterday"
        doc.write_text(json.dumps(data))
    elif kind == "unknown-field":
        data["memory"]["gpus"][0]["vram"] = 1
        doc.write_text(json.dumps(data))
    elif kind == "bad-state":
        data["regression"] = {"suspected": "yes"}
        doc.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "not an oom-sentinel snapshot (no snapshot.json)"),
        ("truncated", "not valid JSON (line"),
        ("binary", "not UTF-8 text"),
        ("foreign", "not an oom-sentinel snapshot (no schema_version)"),
        ("newer", "schema_version 99 was written by a newer oom-sentinel"),
        ("bad-pool", "event.pool: input should be 'gpu', 'gpu-fragmentation',"),
        ("missing-key", "snapshot.json: host: field required"),
        ("string-count", 'incident.count: input should be a valid integer (got "1")'),
        ("bad-time", "observations[1].at: string should match pattern"),
        ("unknown-field", "memory.gpus[0].vram: unknown field"),
        ("bad-state", 'regression.suspected: input should be a valid boolean (got "yes")'),
    ],
    ids=lambda v: v if len(v) < 20 else None,
)
def test_a_foreign_or_corrupt_snapshot_is_a_one_line_input_error(
    tmp_path: Path, kind: str, message: str
) -> None:
    ref = write_snapshot(tmp_path, samples.content())
    _corrupt(kind, ref.path)
    with pytest.raises(InputError) as info:
        load_snapshot(ref.path)
    text = str(info.value)
    assert text.startswith(str(ref.path))
    assert message in text
    assert "\n" not in text


def test_list_is_newest_first_and_reports_unreadable_ones(tmp_path: Path) -> None:
    old = write_snapshot(tmp_path, samples.content(at=samples.T0 - 86400))
    new = write_snapshot(tmp_path, samples.content())
    broken = write_snapshot(tmp_path, samples.content(at=samples.T0 - 3600))
    (broken.path / "snapshot.json").write_text("{")
    (tmp_path / "unrelated").mkdir()
    snaps, problems = list_snapshots(tmp_path)
    assert [s.id for s in snaps] == [new.id, old.id]
    assert len(problems) == 1 and broken.id in problems[0]
    assert list_snapshots(tmp_path / "nothing-yet") == ([], [])


def test_find_snapshot_by_id_prefix_or_path(tmp_path: Path) -> None:
    a = write_snapshot(tmp_path, samples.content())
    b = write_snapshot(tmp_path, samples.content(node_type="VAEDecode"))
    c = write_snapshot(tmp_path, samples.content(at=samples.T0 + 86400))
    assert find_snapshot(tmp_path, a.id) == a.path
    assert find_snapshot(tmp_path, "20260102T101113Z_gpu_V") == b.path
    assert find_snapshot(tmp_path, "20260103") == c.path
    assert find_snapshot(tmp_path, str(a.path)) == a.path
    with pytest.raises(SnapshotNotFound, match=r"'20260102' matches 2 snapshots"):
        find_snapshot(tmp_path, "20260102")
    with pytest.raises(SnapshotNotFound, match="no snapshot 'nope'"):
        find_snapshot(tmp_path, "nope")
    with pytest.raises(SnapshotNotFound):
        find_snapshot(tmp_path, "")


def test_export_is_a_private_zip_of_every_file_redacted_again(tmp_path: Path) -> None:
    ref = write_snapshot(tmp_path / "snaps", samples.content())
    # a secret that slipped past an older redactor must not leave the machine
    log = ref.path / "log.txt"
    log.write_text(log.read_text() + "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345\n")
    out = tmp_path / "out" / "bug.zip"
    assert export_snapshot(load_snapshot(ref.path), out) == out
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert os.listdir(out.parent) == ["bug.zip"]
    with zipfile.ZipFile(out) as zf:
        names = sorted(zf.namelist())
        assert names == sorted(
            f"{ref.id}/{n}"
            for n in ("snapshot.json", "log.txt", "timeline.csv", "prompt.json", "workflow.json")
        )
        assert "hf_AbCdEf" not in zf.read(f"{ref.id}/log.txt").decode()
        exported = json.loads(zf.read(f"{ref.id}/snapshot.json"))
    assert exported == json.loads((ref.path / "snapshot.json").read_text())
    assert validate_snapshot_json(exported) is None


def test_host_facts_describe_this_machine() -> None:
    import platform

    facts = collect_host_facts()
    assert facts.python == platform.python_version()
    assert facts.os == platform.system()
    assert facts.cpu_count == os.cpu_count()
    assert facts.version == "0.1.0"


def test_iso_utc_has_milliseconds_and_z() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(samples.T0) == "2026-01-02T10:11:12.250Z"


def test_snapshot_content_is_not_mutated_by_writing(tmp_path: Path) -> None:
    content = samples.content(prompt={"1": {"class_type": "X", "inputs": {"api_key": "k-123456"}}})
    ref = write_snapshot(tmp_path, content)
    assert content.prompt == {"1": {"class_type": "X", "inputs": {"api_key": "k-123456"}}}
    written = json.loads((ref.path / "prompt.json").read_text())
    assert written == {"1": {"class_type": "X", "inputs": {"api_key": "[REDACTED]"}}}

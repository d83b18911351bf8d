"""The typed ``snapshot.json`` (daemon/incidents/snapshot_model.py): the shipped schema is the models',
snapshots written before the models load unchanged, a bad field is one line naming the file
and the field, and a section that does not match is left out rather than losing the incident.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import snapshot_samples as samples
from click.testing import CliRunner

from oom_sentinel.bisect.cli.main import main
from oom_sentinel.bisect.state.from_snapshot import read_snapshot_start, snapshot_state
from oom_sentinel.bisect.state.states import State
from oom_sentinel.daemon.core.errors import EXIT_INPUT, InputError
from oom_sentinel.daemon.incidents.snapshot import (
    build_snapshot_json,
    list_snapshots,
    load_snapshot,
    snapshot_records,
    snapshots_dir,
    write_snapshot,
)
from oom_sentinel.daemon.incidents.snapshot_model import SCHEMA_FILE, schema_text

FIXTURES = Path(__file__).parent / "snapshots_v1"
V1_ID = "20260102T101113Z_gpu_KSampler"
GIB = 1024**3


def _copy_v1(tmp_path: Path) -> Path:
    target = tmp_path / "snapshots" / V1_ID
    shutil.copytree(FIXTURES / V1_ID, target)
    return target


def _edit(path: Path, change: Any) -> None:
    doc = path / "snapshot.json"
    data = json.loads(doc.read_text())
    change(data)
    doc.write_text(json.dumps(data))


def test_the_shipped_schema_is_generated_from_the_models() -> None:
    assert SCHEMA_FILE.read_text("utf-8") == schema_text(), (
        "daemon/incidents/snapshot.schema.json is stale: run .venv/bin/python scripts/snapshot_schema.py"
    )


def test_the_shipped_schema_accepts_what_is_written_and_refuses_what_the_models_refuse(
    tmp_path: Path,
) -> None:
    schema = json.loads(SCHEMA_FILE.read_text("utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    ref = write_snapshot(tmp_path, samples.full_content())
    data = json.loads((ref.path / "snapshot.json").read_text())
    assert list(validator.iter_errors(data)) == []
    for bad in (
        {**data, "event": {**data["event"], "pool": "vram"}},
        {**data, "incident": {**data["incident"], "count": "1"}},
        {**data, "surprise": 1},
        {k: v for k, v in data.items() if k != "host"},
        {**data, "regression": {**data["regression"], "suspected": "yes"}},
    ):
        assert list(validator.iter_errors(bad)), bad
        with pytest.raises(InputError):
            _load_dict(tmp_path, bad)


def _load_dict(tmp_path: Path, data: dict[str, Any]) -> None:
    path = tmp_path / "loose" / V1_ID
    path.mkdir(parents=True, exist_ok=True)
    (path / "snapshot.json").write_text(json.dumps(data))
    load_snapshot(path)


def test_a_snapshot_written_before_the_models_reads_and_is_written_the_same(
    tmp_path: Path,
) -> None:
    """``tests/snapshots_v1/`` was written by the dict-building writer this module replaced:
    the models read it without change, and the new writer makes the same document of the
    same content."""
    path = _copy_v1(tmp_path)
    on_disk = json.loads((path / "snapshot.json").read_text())
    snap = load_snapshot(path)
    assert snap.doc.model_dump(mode="json", exclude_unset=True) == on_disk
    assert build_snapshot_json(samples.full_content(), V1_ID) == on_disk
    start = read_snapshot_start(snap)
    torch = {"torch": "2.5.1"}
    assert start.good == State.of("a" * 40, {"pack": "1" * 40, "reg": "version:1.0.0"}, torch)
    assert start.bad == State.of("b" * 40, {"pack": "2" * 40, "reg": "version:1.1.0"}, torch)
    assert start.flags == ("--lowvram",) and start.pool == "vram"
    assert start.python == "/opt/ComfyUI/.venv/bin/python"
    assert start.comfyui == Path("/opt/ComfyUI") and start.vram_cap_bytes == 24 * GIB
    assert start.prompt == samples.PROMPT
    assert snapshot_state(snap, "crash") == start.bad
    assert [r.record_id for r in snapshot_records(snap)] == ["log:1"]


def test_an_older_snapshot_without_the_later_fields_loads_with_defaults(tmp_path: Path) -> None:
    path = _copy_v1(tmp_path)

    def strip(data: dict[str, Any]) -> None:
        del data["incident"]["records"]
        for gpu in data["memory"]["gpus"]:
            del gpu["uuid"], gpu["reserved_bytes"]
        for proc in data["memory"]["gpu_processes"]:
            del proc["watched"]
        for tree in data["memory"]["process_trees"]:
            del tree["peak_rss_bytes"]
        del data["memory"]["host"]["commit_limit_bytes"], data["memory"]["host"]["committed_bytes"]
        for key in ("reserved_bytes", "process_used_bytes", "other_process_named", "count"):
            del data["event"][key]
        for key in ("observed_at", "observed_source", "attribution"):
            del data["install_state"][key]
        for key in ("process", "kernel", "system_stats", "internal_logs"):
            del data[key]

    _edit(path, strip)
    doc = load_snapshot(path).doc
    assert doc.incident.records == [] and snapshot_records(load_snapshot(path)) == []
    assert [p.watched for p in doc.memory.gpu_processes] == [False, False, False]  # type: ignore[union-attr]
    assert doc.memory.gpus[0].reserved_bytes is None  # type: ignore[union-attr]
    assert doc.event.count == 1 and doc.event.other_process_named is False
    assert doc.install_state is not None and doc.install_state.attribution is None
    assert doc.process is None and doc.dropped_sections == {}
    assert read_snapshot_start(load_snapshot(path)).flags is None  # no process: no flags


def test_a_section_that_does_not_match_is_left_out_and_named_not_the_incident_lost(
    tmp_path: Path,
) -> None:
    content = samples.content(
        sections={
            "process": {"pid": 4242, "argv": ["python", "main.py", "--lowvram"]},
            "regression": {"suspected": "yes"},
        }
    )
    ref = write_snapshot(tmp_path, content)
    doc = load_snapshot(ref.path).doc
    assert doc.regression is None and doc.process is not None
    assert doc.dropped_sections == {
        "regression": 'regression.suspected: input should be a valid boolean (got "yes")'
    }
    # the incident itself is all there
    assert sorted(doc.sources) == ["api", "log"] and len(doc.observations) == 2
    assert doc.event.node_type == "KSampler" and doc.memory is not None


def test_a_listing_reads_an_odd_value_as_unknown_and_a_full_read_names_it(tmp_path: Path) -> None:
    ref = write_snapshot(tmp_path, samples.content())
    _edit(ref.path, lambda d: d["event"].update(pool=5, node_type=["x"]))
    (snap,), problems = list_snapshots(tmp_path)
    assert problems == [] and snap.id == ref.id
    assert (snap.list_entry()["pool"], snap.list_entry()["node_type"]) == (None, None)
    with pytest.raises(InputError) as info:
        snap.doc  # noqa: B018 -- the full document is read on first use
    assert str(info.value) == (
        f"{ref.path / 'snapshot.json'}: event.pool: input should be 'gpu', 'gpu-fragmentation', "
        "'ram', 'swap-pagefile', 'unified-mps' or 'killed-by-os' (got 5)"
    )


def test_oom_bisect_on_a_bad_snapshot_is_one_line_naming_the_file_and_the_field(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    path = _copy_v1(tmp_path / "x")
    target = snapshots_dir(data_dir) / V1_ID
    shutil.copytree(path, target)
    _edit(target, lambda d: d["regression"]["last_good_state"].update(nodes="pack"))
    res = CliRunner().invoke(main, [V1_ID, "--data-dir", str(data_dir)])
    assert res.exit_code == EXIT_INPUT, res.output
    (line,) = res.output.strip().splitlines()
    assert str(target / "snapshot.json") in line
    assert "regression.last_good_state.nodes: input should be a valid list" in line
    assert "Traceback" not in res.output


def test_the_models_name_every_field_of_the_records_they_carry() -> None:
    """The snapshot's models restate three dataclasses' fields (the classifier's event, the
    processes it names, the host facts): a field added to the record and not to its model would
    be written by ``to_json`` and then refused, or dropped, by the reader. One list, checked."""
    from dataclasses import fields

    from oom_sentinel.daemon.classify.events import OomEvent, OtherProcess
    from oom_sentinel.daemon.incidents.snapshot import HostFacts
    from oom_sentinel.daemon.incidents.snapshot_model import (
        EventModel,
        HostSection,
        OtherProcessEntry,
    )

    for record, model in (
        (OomEvent, EventModel),
        (OtherProcess, OtherProcessEntry),
        (HostFacts, HostSection),
    ):
        assert {f.name for f in fields(record)} == set(model.model_fields), model.__name__

"""`oom-sentinel snapshots list|show|export`, run as a real subprocess on snapshots the writer
made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import snapshot_samples as samples

from oom_sentinel.daemon.classify.events import Pool
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef, snapshots_dir, write_snapshot
from oom_sentinel.daemon.store.db import DB_NAME, IncidentRow, Store


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    full_env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "OOM_SENTINEL_CONFIG")}
    full_env["TZ"] = "UTC"
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "snapshots", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=full_env,
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def write(data_dir: Path, **kw: object) -> SnapshotRef:
    return write_snapshot(snapshots_dir(data_dir), samples.content(**kw))  # type: ignore[arg-type]


def test_list_json_has_the_documented_fields_newest_first(data_dir: Path) -> None:
    gpu = write(data_dir)
    ram = write(data_dir, at=samples.T0 + 60, pool=Pool.RAM, node_type=None)
    proc = run("list", "--json", "--data-dir", str(data_dir))
    assert proc.returncode == 0, proc.stderr
    entries = json.loads(proc.stdout)
    assert [e["id"] for e in entries] == [ram.id, gpu.id]
    first = entries[1]
    assert {"id", "created", "pool", "backend", "node_type", "path"} <= set(first)
    assert (first["pool"], first["backend"], first["node_type"]) == ("gpu", "cuda", "KSampler")
    assert first["created"] == "2026-01-02T10:11:13.250Z"
    assert first["path"] == str(gpu.path)
    assert entries[0]["node_type"] is None and entries[0]["pool"] == "ram"


def test_list_json_takes_the_storm_count_from_the_store(data_dir: Path) -> None:
    content = samples.content()
    ref = write_snapshot(snapshots_dir(data_dir), content)
    with Store.open(data_dir) as store:
        row = IncidentRow.from_incident(content.incident, ref.id)
        store.save_incident(replace(row, count=17, last_seen_s=row.last_seen_s + 120))
    (entry,) = json.loads(run("list", "--json", "--data-dir", str(data_dir)).stdout)
    assert entry["count"] == 17
    assert entry["last_seen"] == "2026-01-02T10:13:12.270Z"  # the API record + 120 s
    story = run("show", ref.id, "--data-dir", str(data_dir)).stdout
    assert "It happened 17 times, the last at 10:13:12" in story


def test_list_table_shows_time_instance_pool_node_and_summary(data_dir: Path) -> None:
    ref = write(data_dir)
    proc = run("list", "--data-dir", str(data_dir))
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[:2]
    assert header.split() == ["Time", "ID", "Instance", "Pool", "Node", "×", "Summary"]
    assert row.split()[:7] == ["2026-01-02", "10:11:13", ref.id, "main", "gpu", "KSampler", "1"]
    assert "GPU out of memory in KSampler (node 3) on main: tried to allocate 2.00 GiB" in row


def test_list_in_a_narrow_terminal_keeps_every_field(data_dir: Path) -> None:
    ref = write(data_dir)
    proc = run("list", "--data-dir", str(data_dir), env={"COLUMNS": "60"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"2026-01-02 10:11:13  {ref.id}  [main gpu KSampler]"
    assert lines[1].startswith("    GPU out of memory in KSampler")
    assert all(len(line) <= 60 for line in lines[1:])


def test_list_with_nothing_recorded_says_so(data_dir: Path) -> None:
    proc = run("list", "--data-dir", str(data_dir))
    assert (proc.returncode, proc.stdout) == (0, f"No snapshots in {data_dir / 'snapshots'}.\n")
    proc = run("list", "--json", "--data-dir", str(data_dir))
    assert (proc.returncode, json.loads(proc.stdout)) == (0, [])
    assert not data_dir.exists()  # reading never creates the data dir


def test_list_warns_about_a_broken_snapshot_and_lists_the_rest(data_dir: Path) -> None:
    good = write(data_dir)
    bad = write(data_dir, at=samples.T0 + 60)
    (bad.path / "snapshot.json").write_text("{not json")
    proc = run("list", "--json", "--data-dir", str(data_dir))
    assert proc.returncode == 0
    assert [e["id"] for e in json.loads(proc.stdout)] == [good.id]
    assert proc.stderr.startswith(f"oom-sentinel: warning: {bad.path / 'snapshot.json'}: ")
    assert len(proc.stderr.splitlines()) == 1


def test_list_survives_an_unreadable_store_with_a_warning(data_dir: Path) -> None:
    ref = write(data_dir)
    (data_dir / DB_NAME).write_text("not a database at all\n" * 10)
    proc = run("list", "--json", "--data-dir", str(data_dir))
    assert proc.returncode == 0
    assert [e["id"] for e in json.loads(proc.stdout)] == [ref.id]
    assert "not an SQLite database" in proc.stderr and "storm counts not shown" in proc.stderr


def test_show_tells_the_story_with_advice_last(data_dir: Path) -> None:
    ref = write(data_dir)
    proc = run("show", ref.id[:20], "--data-dir", str(data_dir))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    sections = [
        "What failed",
        "Which memory ran out",
        "Memory at the time",
        "What else held the GPU",
        "Timeline",
        "Log (last lines of log.txt)",
        f"Files in {ref.path}",
        "What to try",
    ]
    positions = [out.index(f"\n{s}") for s in sections]
    assert positions == sorted(positions)
    assert out.startswith("GPU out of memory in KSampler (node 3) on main")
    assert f"Snapshot {ref.id}, taken 2026-01-02 10:11:13 UTC" in out
    assert "KSampler (node 3) raised torch.OutOfMemoryError on cuda device 0." in out
    assert "It asked for 2.00 GiB; 512.00 MiB of 24.00 GiB was free." in out
    assert "PyTorch had 20.00 GiB allocated and 1.00 GiB reserved but unallocated." in out
    assert "GPU 0 NVIDIA GeForce RTX 4090: 23.50 GiB used of 24.00 GiB, 512.00 MiB free" in out
    assert "RAM: 39.00 GiB available of 64.00 GiB; swap: 0 B used of 8.00 GiB" in out
    assert "pid 999 blender (blender -b scene.blend): 3.00 GiB on GPU 0" in out
    assert "pid 4242" not in out.split("What else held the GPU")[1].split("Timeline")[0]
    assert "gpu0_used_bytes: 18.00 GiB → 23.50 GiB (peak 23.50 GiB at 10:11:12)" in out
    assert "ram_available_bytes: 40.00 GiB → 39.00 GiB (lowest 39.00 GiB at 10:11:11)" in out
    assert f"oom-bisect {ref.id}" in out
    tail = out.split("\nWhat to try\n")[1].splitlines()
    assert tail == [f"  {i}. {a.text}" for i, a in enumerate(samples.ADVICE, 1)]


def test_show_of_a_kill_without_memory_sample_still_reads(data_dir: Path) -> None:
    ref = write(data_dir, pool=Pool.KILLED_BY_OS, node_type=None, memory=None, advice=())
    out = run("show", ref.id, "--data-dir", str(data_dir)).stdout
    assert "the operating system killed it to free memory" in out
    assert "No memory sample was taken." in out
    assert "No specific advice was recorded" in out


def test_show_json_prints_snapshot_json(data_dir: Path) -> None:
    ref = write(data_dir)
    proc = run("show", ref.id, "--json", "--data-dir", str(data_dir))
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == json.loads((ref.path / "snapshot.json").read_text())


@pytest.mark.parametrize(
    ("command", "ref", "code", "message"),
    [
        ("show", "nope", 1, "no snapshot 'nope' in "),
        ("export", "nope", 1, "no snapshot 'nope' in "),
        ("show", "2026", 1, "'2026' matches 2 snapshots in "),
        ("show", "20260102T101113Z_gpu_KSampler", 3, "snapshot.json: not valid JSON"),
    ],
    ids=["show-unknown", "export-unknown", "show-ambiguous", "show-corrupt"],
)
def test_bad_ids_are_one_line_errors(
    data_dir: Path, command: str, ref: str, code: int, message: str
) -> None:
    write(data_dir, at=samples.T0 + 60, node_type="Other")
    good = write(data_dir)
    if code == 3:
        (good.path / "snapshot.json").write_text("{")
    proc = run(command, ref, "--data-dir", str(data_dir))
    assert proc.returncode == code
    assert proc.stdout == ""
    assert proc.stderr.startswith("oom-sentinel: error: ")
    assert message in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_export_writes_a_zip_for_a_bug_report(data_dir: Path, tmp_path: Path) -> None:
    ref = write(data_dir)
    out = tmp_path / "report" / "bug.zip"
    proc = run("export", ref.id[:16], "-o", str(out), "--data-dir", str(data_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"Wrote {out} (snapshot {ref.id}).\n"
    with zipfile.ZipFile(out) as zf:
        assert f"{ref.id}/snapshot.json" in zf.namelist()
        assert f"{ref.id}/prompt.json" in zf.namelist()
    # default: ./<id>.zip in the working directory; --json says where
    proc = run("export", ref.id, "--json", "--data-dir", str(data_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"id": ref.id, "path": str(tmp_path / f"{ref.id}.zip")}
    assert zipfile.is_zipfile(tmp_path / f"{ref.id}.zip")


def test_data_dir_defaults_to_the_configured_one(tmp_path: Path, data_dir: Path) -> None:
    ref = write(data_dir)
    config = tmp_path / "config.toml"
    config.write_text(f"data_dir = {json.dumps(str(data_dir))}\n")
    proc = run("list", "--json", "--config", str(config))
    assert [e["id"] for e in json.loads(proc.stdout)] == [ref.id]
    proc = run("show", ref.id, "--json", env={"OOM_SENTINEL_CONFIG": str(config)})
    assert json.loads(proc.stdout)["id"] == ref.id

"""Gathering the doctor's facts: the torch probe in a real interpreter, ComfyUI's
``/system_stats`` from a real HTTP server, incidents from real snapshot directories, which
ComfyUI is meant, and sources that hang or fail becoming "unknown".

The CUDA path of the torch probe cannot run here (no GPU), so it runs against a stand-in
``torch`` package of our own on ``PYTHONPATH`` that answers like a CUDA build: the probe script
itself executes for real, every branch of it. The real CPU build of torch is covered too."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from torch_venv import TORCH_VERSION

from oom_sentinel.config.settings import InstanceSettings, Settings
from oom_sentinel.daemon.classify.events import Pool
from oom_sentinel.daemon.comfy.discovery import DiscoveredInstance, describe_install
from oom_sentinel.daemon.comfy.processes import ComfyProcess, comfy_process_from
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.doctor.collect import (
    TORCH_PROBE_MARKER,
    DoctorOptions,
    _in_thread,
    collect_facts,
    fetch_system_stats,
    parse_system_stats,
    parse_torch_probe,
    probe_torch,
    read_incidents,
    resolve_target,
)
from oom_sentinel.daemon.incidents.regression import RegressionVerdict
from oom_sentinel.daemon.incidents.snapshot import InstanceInfo, snapshots_dir, write_snapshot

GIB = 1024**3

# -- parsing the probe's output ---------------------------------------------------------------


def _line(**payload: Any) -> str:
    return TORCH_PROBE_MARKER + json.dumps(payload)


def test_the_last_probe_line_wins_and_names_the_stage() -> None:
    stdout = "\n".join(
        [
            "banner from a sitecustomize",
            _line(stage="import", torch_version=None),
            _line(
                stage="done",
                torch_version="2.7.1+cu128",
                cuda_version="12.8",
                cuda_available=True,
                device_count=1,
                devices=[
                    {"index": 0, "name": "NVIDIA RTX 4090", "total_bytes": 24 * GIB, "uuid": "abc"}
                ],
                mem_free_bytes=20 * GIB,
                mem_total_bytes=24 * GIB,
                errors={"xpu": "AttributeError: x"},
                warnings=["CUDA initialization: slow"],
            ),
        ]
    )
    probe, stage = parse_torch_probe(stdout, "/venv/bin/python")
    assert stage == "done"
    assert probe is not None
    assert (probe.executable, probe.torch_version, probe.cuda_available) == (
        "/venv/bin/python",
        "2.7.1+cu128",
        True,
    )
    assert probe.devices[0].name == "NVIDIA RTX 4090" and probe.devices[0].index == 0
    assert probe.mem_free_bytes == 20 * GIB
    assert probe.error("xpu") == "AttributeError: x"
    assert probe.warnings == ("CUDA initialization: slow",)


@pytest.mark.parametrize(
    "stdout",
    ["", "no marker at all", TORCH_PROBE_MARKER + "{not json", TORCH_PROBE_MARKER + "[1, 2]"],
    ids=["empty", "no-marker", "garbled", "not-an-object"],
)
def test_no_usable_probe_line_is_none(stdout: str) -> None:
    assert parse_torch_probe(stdout, "py") == (None, None)


def test_wrongly_typed_fields_read_as_unknown() -> None:
    probe, _ = parse_torch_probe(
        _line(
            stage="done", cuda_available="yes", device_count=True, mem_free_bytes="1", devices="x"
        ),
        "py",
    )
    assert probe is not None
    assert (probe.cuda_available, probe.device_count, probe.mem_free_bytes, probe.devices) == (
        None,
        None,
        None,
        (),
    )


# -- the probe in real interpreters ----------------------------------------------------------------


def test_interpreter_without_torch_reports_the_import_error(python_exe: str) -> None:
    probe, why = probe_torch(python_exe, visible=None, timeout_s=60)
    assert why is None and probe is not None
    assert probe.import_error is not None and "No module named 'torch'" in probe.import_error
    assert probe.torch_version is None
    assert "torch" not in sys.modules


@pytest.mark.slow
def test_cpu_torch_is_a_cpu_only_build_seen_with_comfyuis_device_selection(
    torch_python: Path,
) -> None:
    probe, why = probe_torch(torch_python, visible="1", timeout_s=120)
    assert why is None and probe is not None
    assert probe.torch_version is not None and probe.torch_version.startswith(TORCH_VERSION)
    assert probe.cpu_only_build
    assert (probe.cuda_version, probe.cuda_built, probe.cuda_available) == (None, False, False)
    assert probe.cuda_visible_devices == "1"
    assert probe.mps_available is False
    assert probe.import_error is None and probe.errors == ()


FAKE_CUDA_TORCH = '''\
"""A stand-in for a CUDA build of torch (tests only): answers like torch 2.7.1+cu128."""
import os, warnings
from types import SimpleNamespace
__version__ = "2.7.1+cu128"
version = SimpleNamespace(cuda="12.8", hip=None)
MODE = os.environ.get("FAKE_TORCH_MODE", "ok")
if MODE == "crash-import":
    os._exit(139)
def _props(i):
    return SimpleNamespace(name="Fake RTX %d" % i, total_memory=(24 - 12 * i) * 2**30,
                           uuid="0000000%d-aaaa" % i, major=8, minor=9 - 3 * i)
class _Cuda:
    def is_available(self):
        if MODE == "hang-cuda":
            import time
            time.sleep(600)
        if MODE == "old-driver":
            warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old "
                          "(found version 11040).")
            return False
        return True
    def device_count(self):
        return 0 if MODE == "old-driver" else 2
    def current_device(self):
        return 0
    def get_device_properties(self, i):
        return _props(i)
    def mem_get_info(self):
        if MODE == "no-mem-info":
            raise RuntimeError("CUDA error: out of memory")
        return (20 * 2**30, 24 * 2**30)
    def memory_allocated(self):
        return 0
    def memory_reserved(self):
        return 0
    def memory_summary(self, abbreviated=False):
        return "|===|\\n|  PyTorch CUDA memory summary, device ID 0  |\\n| Allocated memory | 0 B |\\n"
cuda = _Cuda()
backends = SimpleNamespace(cuda=SimpleNamespace(is_built=lambda: True),
                           mps=SimpleNamespace(is_built=lambda: False, is_available=lambda: False))
'''


@pytest.fixture
def fake_cuda_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "fake-site"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(FAKE_CUDA_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


def test_cuda_build_path_reports_devices_free_memory_and_summary(
    fake_cuda_torch: Path, python_exe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("FAKE_TORCH_MODE", "ok")
    probe, why = probe_torch(python_exe, visible=None, timeout_s=60)
    assert why is None and probe is not None
    assert (probe.torch_version, probe.cuda_version, probe.cuda_built) == (
        "2.7.1+cu128",
        "12.8",
        True,
    )
    assert (probe.cuda_available, probe.device_count, probe.current_device) == (True, 2, 0)
    assert [(d.name, d.total_bytes, d.uuid, d.capability) for d in probe.devices] == [
        ("Fake RTX 0", 24 * GIB, "00000000-aaaa", "8.9"),
        ("Fake RTX 1", 12 * GIB, "00000001-aaaa", "8.6"),
    ]
    assert (probe.mem_free_bytes, probe.mem_total_bytes) == (20 * GIB, 24 * GIB)
    assert (probe.allocated_bytes, probe.reserved_bytes) == (0, 0)
    assert "PyTorch CUDA memory summary, device ID 0" in "\n".join(probe.summary_header)
    # ComfyUI runs with every GPU visible: the doctor's own CUDA_VISIBLE_DEVICES is removed
    assert probe.cuda_visible_devices is None
    assert not probe.cpu_only_build


def test_torch_warnings_about_the_driver_are_kept(
    fake_cuda_torch: Path, python_exe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TORCH_MODE", "old-driver")
    probe, _ = probe_torch(python_exe, visible="0", timeout_s=60)
    assert probe is not None and probe.cuda_available is False
    assert any("driver on your system is too old" in w for w in probe.warnings)
    assert probe.cuda_visible_devices == "0"


def test_a_failing_step_is_recorded_and_the_rest_still_runs(
    fake_cuda_torch: Path, python_exe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TORCH_MODE", "no-mem-info")
    probe, _ = probe_torch(python_exe, visible=None, timeout_s=60)
    assert probe is not None
    assert probe.error("mem_get_info") == "RuntimeError: CUDA error: out of memory"
    assert probe.mem_free_bytes is None
    assert probe.summary_header  # the step after it ran
    assert probe.mps_available is False


def test_a_hang_inside_cuda_keeps_what_was_learnt(
    fake_cuda_torch: Path, python_exe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TORCH_MODE", "hang-cuda")
    # generous: the interpreter must reach the CUDA step before the timeout even on a busy box
    probe, why = probe_torch(python_exe, visible=None, timeout_s=5)
    assert why is None and probe is not None
    assert probe.torch_version == "2.7.1+cu128"
    assert (
        probe.error("cuda") == "the probe did not finish within 5 s and was killed during this step"
    )
    assert probe.cuda_available is None


def test_an_interpreter_dying_in_import_torch_is_an_import_error(
    fake_cuda_torch: Path, python_exe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TORCH_MODE", "crash-import")
    probe, _ = probe_torch(python_exe, visible=None, timeout_s=60)
    assert probe is not None
    assert probe.import_error == "`import torch` exited with status 139"


@pytest.mark.skipif(os.name == "nt", reason="POSIX shell stand-in")
def test_an_interpreter_that_prints_nothing_is_unknown_with_its_stderr(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    broken.chmod(0o755)
    probe, why = probe_torch(broken, visible=None, timeout_s=30)
    assert probe is None
    assert (
        why
        == f"{broken}: the torch probe exited with status 1 (Fatal Python error: init_fs_encoding)"
    )


# -- /system_stats from a real server ----------------------------------------------------------------

SYSTEM_STATS = {
    "system": {
        "os": "linux",
        "ram_total": 64 * GIB,
        "ram_free": 40 * GIB,
        "comfyui_version": "0.8.0",
        "python_version": "3.12.3 (main)",
        "pytorch_version": "2.9.1+cu130",
        "embedded_python": False,
        "argv": ["main.py", "--port", "8188", "--lowvram"],
    },
    "devices": [
        {
            "name": "cuda:0 NVIDIA GeForce RTX 4090 : cudaMallocAsync",
            "type": "cuda",
            "index": 0,
            "vram_total": 24 * GIB,
            "vram_free": 22 * GIB,
            "torch_vram_total": 0,
            "torch_vram_free": 0,
        }
    ],
}


@pytest.fixture
def stats_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/system_stats":
                self.send_error(404)
                return
            body = json.dumps(SYSTEM_STATS).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_system_stats_are_read_from_a_running_comfyui(stats_server: str) -> None:
    stats = fetch_system_stats(stats_server + "/")
    assert stats.url == stats_server
    assert stats.argv == ("main.py", "--port", "8188", "--lowvram")
    assert (stats.comfyui_version, stats.pytorch_version) == ("0.8.0", "2.9.1+cu130")
    assert stats.device_name == "cuda:0 NVIDIA GeForce RTX 4090 : cudaMallocAsync"
    assert (stats.vram_total_bytes, stats.vram_free_bytes) == (24 * GIB, 22 * GIB)


def test_system_stats_of_an_old_comfyui_lack_argv() -> None:
    stats = parse_system_stats(
        {"system": {"os": "linux"}, "devices": [{"name": "cpu", "type": "cpu", "index": None}]}, "u"
    )
    assert (stats.argv, stats.pytorch_version, stats.device_type, stats.device_index) == (
        None,
        None,
        "cpu",
        None,
    )
    assert parse_system_stats("garbage", "u").device_name is None


def test_unreachable_system_stats_raise_os_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(OSError):
        fetch_system_stats(f"http://127.0.0.1:{port}", timeout_s=5)


# -- incidents ----------------------------------------------------------------------------------


def _snapshot(data: Path, at: float, path: str, name: str = "main", **kw: Any) -> str:
    content = samples.content(at=at, instance=name, **kw)
    content = replace(content, instance=InstanceInfo(name, path, "http://127.0.0.1:8188"))
    return write_snapshot(snapshots_dir(data), content).id


def test_incidents_are_the_targets_newest_first(tmp_path: Path) -> None:
    data = tmp_path / "data"
    mine = [_snapshot(data, samples.T0 + 60 * i, "/opt/ComfyUI") for i in range(7)]
    other = _snapshot(data, samples.T0 + 1000, "/srv/Other")
    ram = _snapshot(data, samples.T0 + 2000, "/opt/ComfyUI/", pool=Pool.RAM, node_type=None)
    regression = _snapshot(
        data,
        samples.T0 + 3000,
        "/opt/ComfyUI",
        sections={"regression": RegressionVerdict(True, "the install changed").to_section()},
    )
    (snapshots_dir(data) / "20260101T000000.000Z_gpu_broken").mkdir()  # unreadable: skipped
    target = DiscoveredInstance(
        "ComfyUI", "/opt/ComfyUI", "http://127.0.0.1:8188", (), None, None, None
    )
    found, total = read_incidents(data, target, limit=3)
    assert total == 9
    assert [i.id for i in found] == [regression, ram, mine[-1]]
    assert found[0].regression_suspected and not found[1].regression_suspected
    assert (found[1].pool, found[1].node_type) == ("ram", None)
    assert (found[2].pool, found[2].node_type, found[2].instance) == ("gpu", "KSampler", "main")
    assert found[2].created_s == pytest.approx(samples.T0 + 360 + 1.0)
    everything, total_all = read_incidents(data, None, limit=20)
    assert total_all == 10 and other in [i.id for i in everything]


def test_no_snapshots_folder_is_no_incidents(tmp_path: Path) -> None:
    assert read_incidents(tmp_path, None) == ((), 0)


# -- which ComfyUI ----------------------------------------------------------------------------------


def _proc(pid: int, install: Path, *args: str) -> ComfyProcess:
    made = comfy_process_from(
        pid,
        ["/usr/bin/python3", str(install / "main.py"), *args],
        cwd=str(install),
        environ={},
        exists=lambda _p: True,
    )
    assert made is not None
    return made


@pytest.fixture
def installs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("ComfyUI", "Other", "Stopped"):
        out[name] = tmp_path / name
        out[name].mkdir()
    return out


def test_comfyui_path_names_the_install_and_finds_its_process(installs: dict[str, Path]) -> None:
    procs = [_proc(10, installs["Other"], "--port", "8189"), _proc(11, installs["ComfyUI"])]
    target, proc = resolve_target(
        instance=None,
        comfyui=str(installs["ComfyUI"]),
        configured=(),
        discovered=(),
        processes=procs,
    )
    assert target is not None and proc is not None
    assert (target.path, proc.pid, target.source) == (str(installs["ComfyUI"]), 11, "cli")


def test_comfyui_url_finds_the_process_by_port(installs: dict[str, Path]) -> None:
    procs = [
        _proc(10, installs["Other"], "--port", "8189", "--listen"),
        _proc(11, installs["ComfyUI"]),
    ]
    target, proc = resolve_target(
        instance=None,
        comfyui="http://localhost:8189/",
        configured=(),
        discovered=(),
        processes=procs,
    )
    assert proc is not None and proc.pid == 10
    assert target is not None and target.path == str(installs["Other"])


def test_comfyui_url_without_a_local_process_keeps_the_url() -> None:
    target, proc = resolve_target(
        instance=None, comfyui="http://10.0.0.5:8188", configured=(), discovered=(), processes=()
    )
    assert proc is None and target is not None
    assert (target.url, target.path, target.name) == ("http://10.0.0.5:8188", "", "10.0.0.5:8188")


def test_instance_name_from_discovery_then_config(installs: dict[str, Path]) -> None:
    procs = [_proc(11, installs["ComfyUI"])]
    discovered = (describe_install(installs["ComfyUI"], procs[0], source="process"),)
    configured = (InstanceSettings(name="render", path=str(installs["Stopped"])),)
    target, proc = resolve_target(
        instance="ComfyUI",
        comfyui=None,
        configured=configured,
        discovered=discovered,
        processes=procs,
    )
    assert target is not None and proc is not None and proc.pid == 11
    target, proc = resolve_target(
        instance="render",
        comfyui=None,
        configured=configured,
        discovered=discovered,
        processes=procs,
    )
    assert target is not None and proc is None
    assert (target.name, target.path) == ("render", str(installs["Stopped"]))


def test_without_a_name_the_config_then_the_first_discovered_is_diagnosed(
    installs: dict[str, Path],
) -> None:
    discovered = (describe_install(installs["Other"]),)
    configured = (InstanceSettings(name="api", url="http://127.0.0.1:9000"),)
    target, _ = resolve_target(
        instance=None, comfyui=None, configured=configured, discovered=discovered, processes=()
    )
    assert target is not None and (target.name, target.url) == ("api", "http://127.0.0.1:9000")
    target, _ = resolve_target(
        instance=None, comfyui=None, configured=(), discovered=discovered, processes=()
    )
    assert target is not None and target.path == str(installs["Other"])
    assert resolve_target(
        instance=None, comfyui=None, configured=(), discovered=(), processes=()
    ) == (None, None)


@pytest.mark.parametrize(
    ("instance", "comfyui", "message"),
    [
        (
            "nope",
            None,
            r"no ComfyUI instance named 'nope' \(known: Other\); or name one with --comfyui PATH\|URL",
        ),
        (None, "/no/such/dir", r"--comfyui /no/such/dir: not a directory or an http URL"),
    ],
    ids=["unknown-name", "missing-dir"],
)
def test_naming_nothing_known_is_a_usage_error(
    installs: dict[str, Path], instance: str | None, comfyui: str | None, message: str
) -> None:
    discovered = (describe_install(installs["Other"]),)
    with pytest.raises(ConfigError, match=message):
        resolve_target(
            instance=instance, comfyui=comfyui, configured=(), discovered=discovered, processes=()
        )


# -- sources that fail ---------------------------------------------------------------------------------


def test_a_source_that_never_answers_is_unknown_after_its_timeout() -> None:
    release = threading.Event()
    unknown: dict[str, str] = {}
    try:
        wait = _in_thread("gpu", release.wait, 0.2, unknown)
        assert wait() is None
        assert unknown == {"gpu": "no answer within 0.2 s"}
    finally:
        release.set()


def test_a_source_that_raises_is_unknown_with_the_error() -> None:
    unknown: dict[str, str] = {}

    def boom() -> None:
        raise PermissionError("access denied to /proc/1/environ")

    assert _in_thread("processes", boom, 10, unknown)() is None
    assert unknown == {"processes": "PermissionError: access denied to /proc/1/environ"}


def test_collecting_with_a_broken_gpu_dir_and_no_data_dir_still_gives_facts(
    tmp_path: Path, python_exe: str
) -> None:
    settings = Settings.model_validate(
        {
            "gpu": {"backend": "fake", "fake_dir": str(tmp_path / "missing-gpu")},
            "discovery": {"enabled": False},
        }
    )
    facts = collect_facts(
        DoctorOptions(
            python=python_exe,
            settings=settings,
            data_dir=tmp_path / "no-data",
            environ={"HOME": str(tmp_path)},
            timeout_s=60,
        )
    )
    assert facts.target is None and facts.python == python_exe and facts.python_source == "--python"
    assert facts.gpu is not None and facts.gpu.backend == "fake" and facts.gpu.devices == ()
    assert facts.torch is not None and facts.torch.import_error is not None
    assert facts.incidents is None and "no data directory" in facts.unknown["incidents"]
    assert facts.host is not None and facts.comfy_processes is not None


def test_a_missing_python_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--python /no/python: no such file"):
        collect_facts(
            DoctorOptions(
                python="/no/python",
                environ={"HOME": str(tmp_path)},
                settings=Settings.model_validate({"discovery": {"enabled": False}}),
            )
        )


def test_no_torch_skips_the_probe(tmp_path: Path, python_exe: str) -> None:
    facts = collect_facts(
        DoctorOptions(
            python=python_exe,
            torch=False,
            environ={"HOME": str(tmp_path)},
            data_dir=tmp_path,
            settings=Settings.model_validate(
                {"discovery": {"enabled": False}, "gpu": {"backend": "none"}}
            ),
        )
    )
    assert facts.torch is None and facts.unknown["torch"] == "skipped (--no-torch)"
    assert facts.incidents == ()

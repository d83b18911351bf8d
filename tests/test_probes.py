"""GPU probe contract (fake and real NVML), the psutil host probe, and backend selection."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pynvml
import pytest
from daemon_harness import wait_for
from fake_pynvml import FakeDevice as NvmlDevice
from fake_pynvml import FakeNvml

from oom_sentinel.config.settings import GpuSettings
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProbe, GpuProcessSample
from oom_sentinel.daemon.probes.fake_gpu import (
    ENV_FAKE_GPU,
    FakeDevice,
    FakeGpuDir,
    FakeProcessUsage,
)
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
from oom_sentinel.daemon.probes.gpu_select import NullGpuProbe, select_gpu_probe
from oom_sentinel.daemon.probes.host import (
    ProcessIdentity,
    ProcessNameCache,
    PsutilHostProbe,
    commit_from_memory_status,
    describe_process,
    parse_children_file,
    parse_status_kib,
)
from oom_sentinel.daemon.probes.nvml import NvmlGpuProbe

GiB = 1024**3
MiB = 1024**2
LINUX = sys.platform.startswith("linux")


# -- the GPU probe contract -----------------------------------------------------------------------


def check_gpu_probe_contract(probe: GpuProbe) -> None:
    """What every GpuProbe promises, whatever its backend."""
    assert probe.backend in ("nvml", "fake", "none")
    for _ in range(2):
        devices = probe.devices()
        processes = probe.processes()
        assert isinstance(devices, tuple) and isinstance(processes, tuple)
        assert all(isinstance(d, GpuDeviceSample) for d in devices)
        assert all(isinstance(p, GpuProcessSample) for p in processes)
        indices = [d.index for d in devices]
        assert indices == sorted(set(indices))
        for d in devices:
            assert isinstance(d.name, str) and d.name
            for value in (d.total_bytes, d.used_bytes, d.free_bytes, d.reserved_bytes):
                assert value is None or (isinstance(value, int) and value >= 0)
            if d.total_bytes is not None:
                for part in (d.used_bytes, d.free_bytes, d.reserved_bytes):
                    assert part is None or part <= d.total_bytes
        seen: set[tuple[int, int]] = set()
        for p in processes:
            assert p.pid > 0
            assert p.device_index in indices
            assert p.used_bytes is None or (isinstance(p.used_bytes, int) and p.used_bytes >= 0)
            assert (p.device_index, p.pid) not in seen
            seen.add((p.device_index, p.pid))
    probe.close()
    probe.close()
    assert probe.devices() == ()
    assert probe.processes() == ()


GPU_USER = textwrap.dedent(
    """
    import os, sys, time
    from oom_sentinel.daemon.probes.fake_gpu import FakeGpuDir, FakeProcessUsage
    d = FakeGpuDir(sys.argv[1])
    used = int(sys.argv[2])
    d.report(FakeProcessUsage(os.getpid(), "python", int(sys.argv[3]), used, used))
    print("ready", flush=True)
    time.sleep(60)
    """
)


def start_gpu_user(root: Path, used_bytes: int, device: int = 0) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", GPU_USER, str(root), str(used_bytes), str(device)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture
def fake_gpu(tmp_path: Path) -> Iterator[tuple[FakeGpuDir, subprocess.Popen[str]]]:
    root = FakeGpuDir(tmp_path / "gpu").create(
        [
            FakeDevice(0, "Fake RTX 4090", 24 * GiB, base_used_bytes=500 * MiB),
            FakeDevice(1, "Fake RTX 3060", 12 * GiB),
        ]
    )
    user = start_gpu_user(root.root, 6 * GiB, device=0)
    try:
        yield root, user
    finally:
        stop(user)


@pytest.fixture(params=["fake", pytest.param("nvml", marks=pytest.mark.gpu)])
def gpu_probe(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GpuProbe]:
    if request.param == "nvml":
        yield NvmlGpuProbe()
        return
    root = FakeGpuDir(tmp_path / "gpu").create([FakeDevice(0, "Fake GPU", 8 * GiB, 100 * MiB)])
    user = start_gpu_user(root.root, 2 * GiB)
    try:
        yield FakeGpuProbe(root)
    finally:
        stop(user)


def test_gpu_probe_contract(gpu_probe: GpuProbe) -> None:
    check_gpu_probe_contract(gpu_probe)


@pytest.mark.gpu
def test_real_nvml_sees_devices_with_memory() -> None:
    probe = NvmlGpuProbe()
    try:
        devices = probe.devices()
        assert devices, probe.status()
        assert all(d.total_bytes and d.total_bytes > 0 for d in devices)
        assert all(d.uuid and d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
        status = probe.status()
        assert status.state == "ready" and status.driver_version
    finally:
        probe.close()


# -- the fake GPU probe ------------------------------------------------------------------------------


def test_fake_probe_adds_live_process_usage_to_base(
    fake_gpu: tuple[FakeGpuDir, subprocess.Popen[str]],
) -> None:
    root, user = fake_gpu
    probe = FakeGpuProbe(root.root)
    first, second = probe.devices()
    assert first.used_bytes == 500 * MiB + 6 * GiB
    assert first.free_bytes == 24 * GiB - first.used_bytes
    assert second.used_bytes == 0 and second.total_bytes == 12 * GiB
    (proc,) = probe.processes()
    assert (proc.pid, proc.device_index, proc.used_bytes) == (user.pid, 0, 6 * GiB)
    assert proc.cmdline is not None and proc.cmdline[0] == sys.executable


def test_fake_probe_ignores_processes_that_died(
    fake_gpu: tuple[FakeGpuDir, subprocess.Popen[str]],
) -> None:
    root, user = fake_gpu
    probe = FakeGpuProbe(root)
    assert len(probe.processes()) == 1
    stop(user)
    assert probe.processes() == ()
    assert probe.devices()[0].used_bytes == 500 * MiB


def test_fake_probe_ignores_usage_on_unknown_device(tmp_path: Path) -> None:
    root = FakeGpuDir(tmp_path).create([FakeDevice(0, "Fake", 8 * GiB)])
    root.report(FakeProcessUsage(os.getpid(), "pytest", 3, GiB, GiB))
    assert FakeGpuProbe(root).processes() == ()


@pytest.mark.parametrize(
    "content",
    ["", "{not json", json.dumps({"devices": [{"name": "no index"}]}), json.dumps([1, 2])],
    ids=["empty", "not-json", "missing-fields", "wrong-shape"],
)
def test_fake_probe_reads_a_broken_devices_file_as_no_gpu(tmp_path: Path, content: str) -> None:
    (tmp_path / "devices.json").write_text(content)
    probe = FakeGpuProbe(tmp_path)
    assert probe.devices() == () and probe.processes() == ()


def test_fake_probe_on_a_missing_directory_is_empty(tmp_path: Path) -> None:
    probe = FakeGpuProbe(tmp_path / "nowhere")
    assert probe.devices() == () and probe.processes() == ()


# -- backend selection -----------------------------------------------------------------------------


def gpu_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("gpu_select")]


def test_env_var_selects_the_fake_gpu(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    FakeGpuDir(tmp_path).create([FakeDevice(0, "Fake", 8 * GiB)])
    caplog.set_level(logging.INFO)
    choice = select_gpu_probe(GpuSettings(), {ENV_FAKE_GPU: str(tmp_path)})
    assert isinstance(choice.probe, FakeGpuProbe) and choice.backend == "fake"
    assert gpu_lines(caplog) == [f"GPU probe: fake ({tmp_path} from ${ENV_FAKE_GPU}, 1 device(s))"]


def test_configured_fake_dir_wins_over_the_env_var(tmp_path: Path) -> None:
    FakeGpuDir(tmp_path / "a").create([FakeDevice(0, "A", GiB)])
    FakeGpuDir(tmp_path / "b").create([FakeDevice(0, "B", GiB), FakeDevice(1, "B2", GiB)])
    choice = select_gpu_probe(
        GpuSettings(fake_dir=str(tmp_path / "b")), {ENV_FAKE_GPU: str(tmp_path / "a")}
    )
    assert [d.name for d in choice.probe.devices()] == ["B", "B2"]


def test_backend_none_gives_no_gpu(tmp_path: Path) -> None:
    choice = select_gpu_probe(GpuSettings(backend="none"), {ENV_FAKE_GPU: str(tmp_path)})
    assert isinstance(choice.probe, NullGpuProbe) and choice.backend == "none"
    assert choice.probe.devices() == () and choice.probe.processes() == ()


def test_backend_fake_without_a_directory_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=ENV_FAKE_GPU):
        select_gpu_probe(GpuSettings(backend="fake"), {})


def test_auto_without_nvidia_driver_falls_back_to_none_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    choice = select_gpu_probe(
        GpuSettings(), {}, nvml_module=FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    )
    assert isinstance(choice.probe, NullGpuProbe)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
    assert gpu_lines(caplog) == [
        "GPU probe: none (NVML library not found (no NVIDIA driver installed))"
    ]


def test_auto_with_driver_not_loaded_keeps_nvml_retrying(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    choice = select_gpu_probe(GpuSettings(nvml_retry_s=5), {}, nvml_module=nvml)
    assert isinstance(choice.probe, NvmlGpuProbe)
    (line,) = gpu_lines(caplog)
    assert line.startswith("GPU probe: nvml (no data yet: NVIDIA driver not loaded")
    assert "retrying every 5 s" in line


def test_explicit_nvml_is_kept_even_without_a_driver() -> None:
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    choice = select_gpu_probe(GpuSettings(backend="nvml"), {}, nvml_module=nvml)
    assert isinstance(choice.probe, NvmlGpuProbe) and choice.backend == "nvml"
    assert choice.line.startswith("GPU probe: nvml (no data yet: NVML library not found")


def test_auto_with_working_nvml_selects_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    choice = select_gpu_probe(GpuSettings(), {}, nvml_module=FakeNvml([NvmlDevice(), NvmlDevice()]))
    assert choice.backend == "nvml"
    assert gpu_lines(caplog) == ["GPU probe: nvml (2 device(s), driver 550.54.14)"]
    choice.probe.close()


# -- host probe -------------------------------------------------------------------------------------


def test_host_sample_reads_real_ram_and_swap() -> None:
    host = PsutilHostProbe().host()
    assert host is not None
    assert host.ram_total_bytes > 0
    assert 0 < host.ram_available_bytes <= host.ram_total_bytes
    assert 0 <= host.swap_used_bytes <= max(host.swap_total_bytes, host.swap_used_bytes)
    if sys.platform != "win32":
        assert host.commit_limit_bytes is None and host.committed_bytes is None


TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    ballast = bytearray(int(sys.argv[1]) * 1024 * 1024)
    for i in range(len(ballast) // 4096):
        ballast[i * 4096] = 1
    kids = []
    if int(sys.argv[2]) > 0:
        for _ in range(2):
            kids.append(subprocess.Popen([sys.executable, __file__, "20", "0"],
                                         stdout=subprocess.PIPE, text=True))
        for k in kids:
            k.stdout.readline()
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def process_tree(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen(
        [sys.executable, str(script), "40", "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        for child in (
            psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        ):
            child.kill()
        stop(proc)


def test_process_tree_counts_root_and_children(process_tree: subprocess.Popen[str]) -> None:
    probe = PsutilHostProbe()
    tree = probe.process_tree(process_tree.pid)
    assert tree is not None
    assert tree.process_count == 3
    kids = psutil.Process(process_tree.pid).children(recursive=True)
    assert sorted(probe.descendants(process_tree.pid)) == sorted(k.pid for k in kids)
    root_rss = psutil.Process(process_tree.pid).memory_info().rss
    assert tree.rss_bytes >= root_rss + 2 * 20 * MiB
    if LINUX:
        assert tree.peak_rss_bytes is not None and tree.peak_rss_bytes >= 40 * MiB


def test_process_tree_of_a_dead_process_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert PsutilHostProbe().process_tree(proc.pid) is None


@pytest.mark.skipif(not LINUX, reason="zombies are a POSIX thing")
def test_process_tree_of_a_zombie_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(proc.pid, signal.SIGKILL)
        wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, what="zombie")
        assert PsutilHostProbe().process_tree(proc.pid) is None
    finally:
        proc.wait()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_child_that_vanished_mid_walk_is_skipped(
    tmp_path: Path, process_tree: subprocess.Popen[str]
) -> None:
    # a procfs view in which the root lists one real child and one that has already exited
    real_child = psutil.Process(process_tree.pid).children()[0].pid
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tid_dir = tmp_path / str(process_tree.pid) / "task" / str(process_tree.pid)
    tid_dir.mkdir(parents=True)
    (tid_dir / "children").write_text(f"{real_child} {gone.pid} ")
    (tmp_path / str(process_tree.pid) / "status").write_text("Name:\tpython\nVmHWM:\t  51200 kB\n")
    probe = PsutilHostProbe(procfs=tmp_path)
    tree = probe.process_tree(process_tree.pid)
    assert tree is not None
    assert tree.process_count == 2  # the root and the one living child
    assert tree.peak_rss_bytes == 51200 * 1024


def test_peak_rss_from_status_text() -> None:
    status = "Name:\tpython\nVmPeak:\t 1000 kB\nVmHWM:\t   20480 kB\nVmRSS:\t 10240 kB\n"
    assert parse_status_kib(status, "VmHWM") == 20480
    assert parse_status_kib(status, "VmSwap") is None
    assert parse_status_kib("VmHWM:\tgarbage\n", "VmHWM") is None


def test_children_file_parsing() -> None:
    assert parse_children_file("123 456 \n") == [123, 456]
    assert parse_children_file("") == []


@pytest.mark.parametrize(
    ("total", "avail", "expected"),
    [
        (48 * GiB, 20 * GiB, (48 * GiB, 28 * GiB)),
        (48 * GiB, 0, (48 * GiB, 48 * GiB)),
        (0, 0, (None, None)),
    ],
    ids=["normal", "exhausted", "unknown"],
)
def test_windows_commit_charge_from_page_file_fields(
    total: int, avail: int, expected: tuple[int | None, int | None]
) -> None:
    assert commit_from_memory_status(total, avail) == expected


def test_describe_process_names_living_and_dead_processes() -> None:
    me = describe_process(os.getpid())
    assert me.cmdline is not None and me.name is not None and me.create_time_s is not None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert describe_process(gone.pid) == ProcessIdentity(gone.pid, None, None)


def test_name_cache_reads_each_process_once_and_forgets_departed_ones() -> None:
    calls: list[int] = []

    def describe(pid: int) -> ProcessIdentity:
        calls.append(pid)
        return describe_process(pid)

    cache = ProcessNameCache(describe)
    me = os.getpid()
    parent = os.getppid()
    assert cache.lookup([me, parent])[me].name is not None
    cache.lookup([me, parent])
    assert sorted(calls) == sorted([me, parent])
    cache.lookup([me])
    cache.lookup([me, parent])
    assert calls.count(parent) == 2  # forgotten when it left the list, read again on return

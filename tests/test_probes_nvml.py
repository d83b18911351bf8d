"""NvmlGpuProbe's translation of NVML answers, against a scripted ``pynvml`` module.

There is no GPU here, so the module object handed to the probe is scripted: it carries the real
binding's error classes and constants (``pynvml.NVMLError(code)`` builds the same subclass the
real library raises) and functions that answer like a given driver would. The real NVML is
exercised by the contract test in ``test_probes.py`` (marked gpu) and by
``test_real_nvml_without_driver_is_empty_and_logs_once`` below.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from typing import Any

import pynvml as real
import pytest
from fake_pynvml import FakeDevice, FakeNvml, GiB, MiB

from oom_sentinel.daemon.probes.nvml import NOT_AVAILABLE, NvmlGpuProbe, describe_nvml_failure


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.endswith("probes.nvml") and r.levelno >= logging.WARNING
    ]


# -- memory -----------------------------------------------------------------------------------


def test_v2_memory_excludes_reserved_and_reports_it() -> None:
    nvml = FakeNvml([FakeDevice(used=10 * GiB, reserved=400 * MiB)])
    (dev,) = NvmlGpuProbe(nvml).devices()
    assert dev.name == "NVIDIA GeForce RTX 4090"
    assert dev.uuid == "GPU-4090"
    assert dev.total_bytes == 24 * GiB
    assert dev.used_bytes == 10 * GiB
    assert dev.reserved_bytes == 400 * MiB
    assert dev.free_bytes == 24 * GiB - 10 * GiB - 400 * MiB
    assert "memory_v1" not in nvml.calls


@pytest.mark.parametrize(
    "code",
    [
        real.NVML_ERROR_FUNCTION_NOT_FOUND,
        real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        real.NVML_ERROR_NOT_SUPPORTED,
    ],
    ids=["function-not-found", "argument-version-mismatch", "not-supported"],
)
def test_old_driver_falls_back_to_v1_memory_and_remembers(code: int) -> None:
    nvml = FakeNvml([FakeDevice(used=10 * GiB, reserved=400 * MiB, v2_error=code)])
    probe = NvmlGpuProbe(nvml)
    (dev,) = probe.devices()
    assert dev.used_bytes == 10 * GiB + 400 * MiB  # v1's used includes the reserved memory
    assert dev.reserved_bytes is None
    assert dev.total_bytes == 24 * GiB
    probe.devices()
    assert nvml.calls.count("memory_v2") == 1  # not retried on every sample
    assert nvml.calls.count("memory_v1") == 2


def test_binding_without_v2_constant_uses_v1() -> None:
    nvml = FakeNvml([FakeDevice()])
    del nvml.nvmlMemory_v2
    (dev,) = NvmlGpuProbe(nvml).devices()
    assert dev.reserved_bytes is None
    assert nvml.calls.count("memory_v2") == 0


def test_unsupported_memory_reads_as_none_not_zero(caplog: pytest.LogCaptureFixture) -> None:
    unified = FakeDevice(
        name="NVIDIA GB10",
        v2_error=real.NVML_ERROR_NOT_SUPPORTED,
        v1_error=real.NVML_ERROR_NOT_SUPPORTED,
    )
    caplog.set_level(logging.DEBUG)
    (dev,) = NvmlGpuProbe(FakeNvml([unified])).devices()
    assert dev.name == "NVIDIA GB10"
    assert (dev.total_bytes, dev.used_bytes, dev.free_bytes, dev.reserved_bytes) == (
        None,
        None,
        None,
        None,
    )
    assert warnings_of(caplog) == []  # "not supported" is a fact about the board, not a fault


def test_not_available_marker_in_memory_reads_as_none() -> None:
    nvml = FakeNvml([FakeDevice()])
    nvml.nvmlDeviceGetMemoryInfo = lambda dev, version=None: types.SimpleNamespace(
        total=24 * GiB, reserved=NOT_AVAILABLE, free=NOT_AVAILABLE, used=5 * GiB
    )
    (dev,) = NvmlGpuProbe(nvml).devices()
    assert dev.reserved_bytes is None and dev.free_bytes is None and dev.used_bytes == 5 * GiB


def test_byte_names_are_decoded() -> None:
    (dev,) = NvmlGpuProbe(FakeNvml([FakeDevice(name=b"Tesla T4")])).devices()
    assert dev.name == "Tesla T4"


def test_device_name_not_supported_keeps_the_memory() -> None:
    nvml = FakeNvml([FakeDevice(name_error=real.NVML_ERROR_NOT_SUPPORTED)])
    (dev,) = NvmlGpuProbe(nvml).devices()
    assert dev.name == "GPU 0" and dev.used_bytes == 10 * GiB


# -- processes ------------------------------------------------------------------------------------


def test_per_process_memory_not_available_is_none_not_zero() -> None:
    wddm = FakeDevice(compute=[(os.getpid(), NOT_AVAILABLE), (4242424, None), (4242425, 3 * GiB)])
    procs = NvmlGpuProbe(FakeNvml([wddm])).processes()
    used = {p.pid: p.used_bytes for p in procs}
    assert used == {os.getpid(): None, 4242424: None, 4242425: 3 * GiB}


def test_compute_and_graphics_lists_merge_without_double_counting() -> None:
    dev = FakeDevice(
        compute=[(100001, 2 * GiB), (100002, 1 * GiB)],
        graphics=[(100001, 2 * GiB), (100003, 300 * MiB)],
    )
    procs = NvmlGpuProbe(FakeNvml([dev])).processes()
    assert [(p.pid, p.used_bytes) for p in procs] == [
        (100001, 2 * GiB),
        (100002, 1 * GiB),
        (100003, 300 * MiB),
    ]


@pytest.mark.parametrize(
    ("api", "first_working"),
    [("v3", "compute_v3"), ("v2", "compute_v2"), ("v1", "compute_v1")],
    ids=["driver-with-v3", "driver-with-v2-only", "driver-with-v1-only"],
)
def test_process_list_uses_newest_api_the_driver_has(api: str, first_working: str) -> None:
    nvml = FakeNvml([FakeDevice(process_api=api, compute=[(100001, 1 * GiB)])])
    probe = NvmlGpuProbe(nvml)
    assert [(p.pid, p.used_bytes) for p in probe.processes()] == [(100001, 1 * GiB)]
    assert first_working in nvml.calls
    before = len([c for c in nvml.calls if c.startswith("compute_")])
    probe.processes()
    after = [c for c in nvml.calls if c.startswith("compute_")][before:]
    assert after == [first_working]  # the working version is remembered


def test_process_list_not_supported_on_one_device_keeps_the_others() -> None:
    nvml = FakeNvml(
        [
            FakeDevice(process_error=real.NVML_ERROR_NOT_SUPPORTED, compute=[(100001, GiB)]),
            FakeDevice(uuid="GPU-b", compute=[(100002, 2 * GiB)]),
        ]
    )
    procs = NvmlGpuProbe(nvml).processes()
    assert [(p.device_index, p.pid) for p in procs] == [(1, 100002)]


def test_process_names_come_from_the_os() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "pass"], check=True)
        del dead
        nvml = FakeNvml([FakeDevice(compute=[(child.pid, GiB), (2**22 + 12345, GiB)])])
        procs = {p.pid: p for p in NvmlGpuProbe(nvml).processes()}
        assert procs[child.pid].cmdline is not None
        assert procs[child.pid].cmdline[-1] == "import time; time.sleep(30)"
        assert procs[child.pid].name is not None and "python" in procs[child.pid].name
        assert procs[2**22 + 12345].name is None and procs[2**22 + 12345].cmdline is None
    finally:
        child.kill()
        child.wait()


# -- NVML as a whole failing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words", "absent"),
    [
        (real.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver installed", True),
        (real.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded", False),
        (real.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver upgraded without a reboot", False),
        (real.NVML_ERROR_FUNCTION_NOT_FOUND, "newer than the NVIDIA driver", False),
        (real.NVML_ERROR_NO_PERMISSION, "/dev/nvidiactl", False),
        (real.NVML_ERROR_UNKNOWN, "NVML error", False),
    ],
    ids=[
        "library-not-found",
        "driver-not-loaded",
        "rm-version-mismatch",
        "function-not-found",
        "no-permission",
        "unknown",
    ],
)
def test_init_failure_degrades_to_no_data_and_logs_once(
    code: int, words: str, absent: bool, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = FakeNvml(init_error=code)
    clock = Clock()
    probe = NvmlGpuProbe(nvml, clock=clock, retry_interval_s=60)
    caplog.set_level(logging.DEBUG)
    for _ in range(5):
        assert probe.devices() == ()
        assert probe.processes() == ()
    clock.now += 61
    assert probe.devices() == ()  # retried, same reason
    assert nvml.calls.count("init") == 2
    warnings = warnings_of(caplog)
    assert len(warnings) == 1, warnings
    assert words in warnings[0]
    status = probe.status()
    assert status.state == "failed" and words in (status.reason or "")
    assert status.absent is absent


def test_recovery_after_retry_interval_brings_data_back(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeDevice()], init_error=real.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    clock = Clock()
    probe = NvmlGpuProbe(nvml, clock=clock, retry_interval_s=60)
    caplog.set_level(logging.INFO)
    assert probe.devices() == ()
    nvml.init_error = None  # the machine was rebooted into the new driver
    clock.now += 30
    assert probe.devices() == ()  # not retried before the interval
    clock.now += 31
    assert len(probe.devices()) == 1
    assert probe.status().state == "ready"
    assert probe.status().driver_version == "550.54.14"
    assert any("available again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "code",
    [
        real.NVML_ERROR_DRIVER_NOT_LOADED,
        real.NVML_ERROR_UNINITIALIZED,
        real.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    ],
    ids=["driver-unloaded", "uninitialized", "rm-version-mismatch"],
)
def test_driver_going_away_mid_session_shuts_down_and_retries(code: int) -> None:
    nvml = FakeNvml([FakeDevice(compute=[(100001, GiB)])])
    clock = Clock()
    probe = NvmlGpuProbe(nvml, clock=clock, retry_interval_s=60)
    assert len(probe.devices()) == 1
    nvml.query_error = code
    assert probe.devices() == ()
    assert probe.processes() == ()
    assert nvml.calls.count("shutdown") == 1
    assert probe.status().state == "failed"
    nvml.query_error = None
    clock.now += 61
    assert len(probe.processes()) == 1
    assert nvml.initialised == 1  # every init was balanced by a shutdown


def test_lost_gpu_reads_as_unknown_and_others_still_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost = FakeDevice(uuid="GPU-lost", v2_error=real.NVML_ERROR_GPU_IS_LOST)
    lost.v1_error = real.NVML_ERROR_GPU_IS_LOST
    ok = FakeDevice(uuid="GPU-ok", compute=[(100001, GiB)])
    nvml = FakeNvml([lost, ok])
    probe = NvmlGpuProbe(nvml)
    caplog.set_level(logging.WARNING)
    first, second = probe.devices()
    assert first.used_bytes is None and first.total_bytes is None
    assert second.used_bytes == ok.used
    assert probe.status().lost_devices == (0,)
    probe.devices()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "lost" in errors[0].getMessage()


def test_device_without_a_handle_is_listed_with_unknown_values() -> None:
    hidden = FakeDevice(handle_error=real.NVML_ERROR_NO_PERMISSION)
    nvml = FakeNvml([hidden, FakeDevice(uuid="GPU-b")])
    first, second = NvmlGpuProbe(nvml).devices()
    assert (first.index, first.name, first.used_bytes) == (0, "GPU 0", None)
    assert second.used_bytes is not None


def test_unexpected_binding_error_never_reaches_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml([FakeDevice()])

    def broken(dev: FakeDevice) -> list[Any]:
        raise RuntimeError("struct layout mismatch")

    nvml.nvmlDeviceGetComputeRunningProcesses_v3 = broken
    probe = NvmlGpuProbe(nvml)
    caplog.set_level(logging.WARNING)
    assert probe.processes() == ()
    assert probe.processes() == ()
    assert len([r for r in caplog.records if "struct layout" in r.getMessage()]) == 1


def test_nothing_touches_the_driver_before_the_first_query() -> None:
    nvml = FakeNvml()
    probe = NvmlGpuProbe(nvml)
    assert nvml.calls == []
    assert probe.status().state == "idle"
    probe.devices()
    assert nvml.calls[0] == "init"


def test_close_shuts_nvml_down_once_and_stays_closed() -> None:
    nvml = FakeNvml([FakeDevice()])
    probe = NvmlGpuProbe(nvml, retry_interval_s=0)
    assert probe.devices()
    probe.close()
    probe.close()
    assert nvml.calls.count("shutdown") == 1
    assert probe.devices() == () and probe.processes() == ()
    assert nvml.calls.count("init") == 1
    assert probe.status().state == "closed"


def test_close_before_any_query_does_not_call_shutdown() -> None:
    nvml = FakeNvml()
    NvmlGpuProbe(nvml).close()
    assert nvml.calls == []


def test_missing_pynvml_module_is_reported_as_not_installed() -> None:
    assert "nvidia-ml-py" in describe_nvml_failure(ImportError("No module named 'pynvml'"))


def _real_nvml_works() -> bool:
    try:
        real.nvmlInit()
    except real.NVMLError:
        return False
    real.nvmlShutdown()
    return True


@pytest.mark.skipif(_real_nvml_works(), reason="this machine has a working NVIDIA driver")
def test_real_nvml_without_driver_is_empty_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    probe = NvmlGpuProbe()  # the real pynvml module
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        assert probe.devices() == ()
        assert probe.processes() == ()
    assert probe.start() is False
    warnings = warnings_of(caplog)
    assert len(warnings) == 1
    assert "NVML library not found" in warnings[0]
    assert probe.status().absent
    probe.close()

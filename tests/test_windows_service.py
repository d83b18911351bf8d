"""The Windows service wrapper, on Linux, with pywin32 replaced by recording stand-ins.

What is real: the service class, its threads, the settings loading, the stop timeout, the
install sequence. What is not: the service manager and the Event Log (see fake_win32.py); none
of this has run on a real Windows machine.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from fake_comfy_install import make_install
from fake_win32 import SERVICE_RUNNING, SERVICE_STOPPED, Harness, Journal, make_modules

from oom_sentinel.config.settings import LoadedSettings
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef
from oom_sentinel.windows_service import win32
from oom_sentinel.windows_service.paths import (
    desktop_locations,
    discover_all_profiles,
    service_data_dir,
    user_profiles,
)
from oom_sentinel.windows_service.service import (
    CLASS_STRING,
    SERVICE_NAME,
    build_service_class,
    install_service,
    service_settings,
    uninstall_service,
)


class Loop:
    """Stands in for run_service (the lead's loop) with its exact signature: reports ready,
    records one incident, then waits for the stop event -- or misbehaves as asked."""

    def __init__(
        self,
        *,
        incident: bool = True,
        ignore_stop: bool = False,
        fail: Exception | None = None,
        exit_code: int = 0,
    ) -> None:
        self.incident = incident
        self.ignore_stop = ignore_stop
        self.fail = fail
        self.exit_code = exit_code
        self.stop: threading.Event | None = None
        self.loaded: LoadedSettings | None = None
        self.returned = threading.Event()
        self.release = threading.Event()

    def __call__(
        self,
        loaded_settings: LoadedSettings,
        *,
        stop: threading.Event,
        on_ready: Callable[[str], None] | None = None,
        event_sink: Callable[[Any, SnapshotRef], None] | None = None,
    ) -> int:
        self.loaded, self.stop = loaded_settings, stop
        try:
            if self.fail is not None:
                raise self.fail
            assert on_ready is not None and event_sink is not None
            on_ready("watching 1 instance, GPU probe: fake")
            if self.incident:
                ref = SnapshotRef(
                    "20260102T101113Z_gpu_KSampler",
                    Path(r"C:\ProgramData\oom-sentinel\snapshots\x"),
                    samples.T0,
                )
                event_sink(samples.incident(), ref)
            if self.exit_code:
                return self.exit_code
            if self.ignore_stop:
                self.release.wait(30)
            else:
                stop.wait(30)
            return 0
        finally:
            self.returned.set()


@pytest.fixture
def journal() -> Journal:
    return Journal()


def _service(journal: Journal, loop: Loop, tmp_path: Path, **kwargs: Any) -> Any:
    modules = make_modules(journal)
    cls = build_service_class(
        modules,
        run_service=loop,
        settings_loader=lambda config: service_settings(
            config, {"ProgramData": str(tmp_path / "ProgramData")}
        ),
        **kwargs,
    )
    return cls([SERVICE_NAME])


def test_start_reports_running_only_when_the_loop_is_ready(
    journal: Journal, tmp_path: Path
) -> None:
    loop = Loop()
    service = _service(journal, loop, tmp_path)
    harness = Harness(service, journal)
    harness.start()
    journal.wait_for(lambda: any(s["status"] == SERVICE_RUNNING for s in journal.statuses))
    assert journal.status_names()[:2] == ["START_PENDING", "RUNNING"]
    assert journal.statuses[0]["waitHint"] >= 10_000
    assert ("started", SERVICE_NAME) in journal.events
    # the loop got the settings: the service's data dir under ProgramData
    assert loop.loaded is not None
    assert Path(loop.loaded.settings.data_dir) == tmp_path / "ProgramData" / "oom-sentinel"
    service.SvcStop()
    harness.thread.join(15)
    assert harness.stopped()


def test_stop_sets_the_loop_event_and_reports_stopped(journal: Journal, tmp_path: Path) -> None:
    loop = Loop()
    service = _service(journal, loop, tmp_path)
    harness = Harness(service, journal)
    harness.start()
    journal.wait_for(lambda: service.ready.is_set())
    service.SvcStop()
    assert loop.stop is service.stop_requested and loop.stop.is_set()
    harness.thread.join(15)
    assert harness.stopped() and loop.returned.is_set()
    names = journal.status_names()
    assert names[-2:] == ["STOP_PENDING", "STOPPED"]
    stop_pending = next(s for s in journal.statuses if s["status"] == 3)
    assert stop_pending["waitHint"] >= 15_000
    assert journal.statuses[-1]["win32ExitCode"] == 0
    assert journal.events[-1] == ("stopped", SERVICE_NAME)


def test_an_incident_writes_an_event_log_entry(journal: Journal, tmp_path: Path) -> None:
    service = _service(journal, Loop(), tmp_path)
    harness = Harness(service, journal)
    harness.start()
    journal.wait_for(lambda: any(kind == "warning" for kind, _ in journal.events))
    service.SvcStop()
    harness.thread.join(15)
    (entry,) = [text for kind, text in journal.events if kind == "warning"]
    assert entry.startswith("GPU out of memory in KSampler (node 3) on main")
    assert "Snapshot: 20260102T101113Z_gpu_KSampler" in entry
    assert "oom-sentinel snapshots show 20260102T101113Z_gpu_KSampler" in entry
    assert any(kind == "info" and "running" in text for kind, text in journal.events)


def test_a_loop_that_ignores_stop_is_abandoned_within_the_timeout(
    journal: Journal, tmp_path: Path
) -> None:
    loop = Loop(ignore_stop=True)
    service = _service(journal, loop, tmp_path, stop_timeout_s=0.5)
    harness = Harness(service, journal)
    harness.start()
    journal.wait_for(lambda: service.ready.is_set())
    service.SvcStop()
    harness.thread.join(15)
    assert harness.stopped() and not loop.returned.is_set()
    errors = [text for kind, text in journal.events if kind == "error"]
    assert errors == ["oom-sentinel did not stop within 0.5 s of the stop request; exiting anyway"]
    assert journal.statuses[-1] == {
        "status": SERVICE_STOPPED,
        "waitHint": 5000,
        "win32ExitCode": 1066,
        "svcExitCode": 1,
    }
    loop.release.set()


def test_an_error_in_the_loop_is_logged_and_reported_as_a_failed_stop(
    journal: Journal, tmp_path: Path
) -> None:
    loop = Loop(fail=ConfigError("config.toml: gpu.backend: must be auto, nvml, fake or none"))
    service = _service(journal, loop, tmp_path)
    harness = Harness(service, journal)
    harness.start()
    harness.thread.join(15)
    assert harness.stopped()
    assert (
        "error",
        "oom-sentinel stopped: config.toml: gpu.backend: must be auto, nvml, fake or none",
    ) in journal.events
    assert "RUNNING" not in journal.status_names()
    assert (
        journal.statuses[-1]["svcExitCode"] == 2 and journal.statuses[-1]["win32ExitCode"] == 1066
    )


def test_a_crash_in_the_loop_is_logged(journal: Journal, tmp_path: Path) -> None:
    service = _service(journal, Loop(fail=RuntimeError("boom")), tmp_path)
    harness = Harness(service, journal)
    harness.start()
    harness.thread.join(15)
    assert ("error", "oom-sentinel crashed: RuntimeError: boom") in journal.events
    assert journal.statuses[-1]["svcExitCode"] == 1


def test_a_loop_ending_on_its_own_with_an_error_says_so(journal: Journal, tmp_path: Path) -> None:
    service = _service(journal, Loop(incident=False, exit_code=3), tmp_path)
    harness = Harness(service, journal)
    harness.start()
    harness.thread.join(15)
    assert ("error", "oom-sentinel ended on its own with exit status 3") in journal.events
    assert journal.statuses[-1]["svcExitCode"] == 3


def test_the_installed_config_is_read_and_a_bad_one_is_an_event_log_error(
    journal: Journal, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[logs]\npoll_interval_ms = 0\n")
    journal.options[(SERVICE_NAME, "config")] = str(config)
    loop = Loop()
    service = _service(journal, loop, tmp_path)
    harness = Harness(service, journal)
    harness.start()
    harness.thread.join(15)
    (error,) = [text for kind, text in journal.events if kind == "error"]
    assert (
        error == f"oom-sentinel cannot start: {config}: logs.poll_interval_ms: must be >= 1, got 0"
    )
    assert loop.stop is None  # the loop never ran
    assert journal.statuses[-1]["svcExitCode"] == 2

    config.write_text(f'data_dir = "{(tmp_path / "mine").as_posix()}"\n')
    journal2 = Journal()
    journal2.options[(SERVICE_NAME, "config")] = str(config)
    loop2 = Loop(incident=False)
    service2 = _service(journal2, loop2, tmp_path)
    harness2 = Harness(service2, journal2)
    harness2.start()
    journal2.wait_for(lambda: service2.ready.is_set())
    service2.SvcStop()
    harness2.thread.join(15)
    assert loop2.loaded is not None and loop2.loaded.source == config
    assert loop2.loaded.settings.data_dir == (tmp_path / "mine").as_posix()


def test_install_registers_starts_and_sets_recovery(journal: Journal, tmp_path: Path) -> None:
    ran: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    config = tmp_path / "config.toml"
    lines = install_service(config, modules=make_modules(journal), run=run)
    names = [c[0] for c in journal.calls]
    assert names == [
        "InstallService",
        "SetServiceCustomOption",
        "AddSourceToRegistry",
        "StartService",
    ]
    _, args, kwargs = journal.calls[0]
    assert args[:2] == (CLASS_STRING, SERVICE_NAME)
    assert kwargs["startType"] == 2  # automatic
    assert journal.options[(SERVICE_NAME, "config")] == str(config.absolute())
    assert ran == [
        [
            "sc.exe",
            "failure",
            SERVICE_NAME,
            "reset=",
            "86400",
            "actions=",
            "restart/5000/restart/5000/restart/60000",
        ]
    ]
    assert lines[-1] == f"done: start {SERVICE_NAME!r}"


def test_install_dry_run_does_nothing(journal: Journal) -> None:
    lines = install_service(None, dry_run=True, modules=make_modules(journal))
    assert journal.calls == [] and all(line.startswith("would ") for line in lines)


def test_install_failure_is_one_line(journal: Journal) -> None:
    modules = make_modules(journal)

    def denied(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "Access is denied")

    modules.win32serviceutil.InstallService = denied
    with pytest.raises(Exception) as info:
        install_service(None, modules=modules, run=lambda *a, **k: None)  # type: ignore[arg-type,return-value]
    assert (
        str(info.value)
        == "installing the service failed: Access is denied (run it as administrator?)"
    )


def test_uninstall_stops_and_removes(journal: Journal) -> None:
    uninstall_service(modules=make_modules(journal))
    assert [c[0] for c in journal.calls] == ["StopService", "RemoveService"]


def test_the_seam_without_pywin32_says_what_to_install() -> None:
    win32.use(None)
    with pytest.raises(win32.PyWin32Missing) as info:
        win32.load()
    assert "pip install pywin32" in str(info.value)


def test_the_seam_returns_what_tests_hand_it(journal: Journal) -> None:
    modules = make_modules(journal)
    win32.use(modules)
    try:
        assert win32.load() is modules
        from oom_sentinel.windows_service import service as module

        module._built = None
        cls = module.OomSentinelService
        assert cls._svc_name_ == SERVICE_NAME
        assert issubclass(cls, modules.win32serviceutil.ServiceFramework)
    finally:
        win32.use(None)
        module._built = None


# --- paths ------------------------------------------------------------------------------------


def test_service_data_dir_is_under_program_data() -> None:
    assert service_data_dir({"ProgramData": r"D:\PD"}) == Path(r"D:\PD") / "oom-sentinel"


def test_portable_and_desktop_installs_are_found_in_every_profile(tmp_path: Path) -> None:
    users = tmp_path / "Users"
    alice, bob = users / "alice", users / "bob"
    for skipped in ("Public", "Default", "All Users"):
        (users / skipped).mkdir(parents=True)
    # alice: the portable build unpacked on her Desktop
    portable = make_install(alice / "Desktop" / "ComfyUI_windows_portable" / "ComfyUI")
    (portable.parent / "python_embeded").mkdir()
    (portable.parent / "python_embeded" / "python.exe").write_text("")
    # bob: ComfyUI Desktop, its basePath in %APPDATA%\ComfyUI\config.json
    base = make_install(bob / "Documents" / "ComfyUI")
    config_dir, logs_dir = desktop_locations(bob)
    assert config_dir == bob / "AppData" / "Roaming" / "ComfyUI"
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text(json.dumps({"basePath": str(base)}))
    profiles = user_profiles(users)
    assert profiles == [alice, bob]
    found = {inst.path: inst for inst in discover_all_profiles(profiles)}
    assert str(portable) in found and found[str(portable)].source == "portable"
    assert found[str(portable)].python == str(portable.parent / "python_embeded" / "python.exe")
    desktop = found[str(base)]
    assert desktop.source == "desktop" and desktop.name == "ComfyUI Desktop"
    assert str(logs_dir / "comfyui.log") in desktop.log_paths


def test_same_named_installs_in_two_profiles_get_the_owner_in_their_name(tmp_path: Path) -> None:
    users = tmp_path / "Users"
    make_install(users / "alice" / "ComfyUI")
    make_install(users / "bob" / "ComfyUI")
    names = sorted(i.name for i in discover_all_profiles(user_profiles(users)))
    assert names == ["alice: ComfyUI", "bob: ComfyUI"]

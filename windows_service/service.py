"""oom-sentinel as a Windows service: a thin pywin32 ``ServiceFramework`` around the same daemon
loop that systemd runs on Linux (``oom_sentinel.daemon.service.wiring.run_service``).

What the wrapper adds, and nothing else:

* **status** -- ``START_PENDING`` until the daemon calls ``on_ready`` (its first memory sample),
  then ``RUNNING``; ``STOP_PENDING`` with a wait hint when the service manager asks it to stop;
  a daemon that ends on its own with an error is reported as stopped with that exit code, so
  the recovery actions set at install (restart after 5 s) apply.
* **stop within the manager's timeout** -- ``SvcStop`` sets the loop's ``stop`` event; the loop
  runs on its own thread, and if it has not returned ``stop_timeout_s`` later the service logs
  that and exits anyway (the manager would otherwise kill it, silently).
* **Event Log** -- started/stopped, one warning entry per incident (``event_sink``: the summary,
  the snapshot id and path), and an error entry for any failure, under the source
  ``oom-sentinel``.
* **paths** -- the config file named at install (kept in the service's registry key), and the
  data dir ``%ProgramData%\\oom-sentinel`` when the config names none (``paths.py``).

pywin32 is reached only through ``win32.py``; ``build_service_class`` takes the modules and the
loop function explicitly, so the tests run all of this on Linux with recording stand-ins.
Nothing here has run on a real Windows machine yet (see windows_service/README.md).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from oom_sentinel.config.settings import LoadedSettings, load_settings
from oom_sentinel.daemon.core.errors import EXIT_ERROR, SentinelError
from oom_sentinel.windows_service import win32
from oom_sentinel.windows_service.paths import service_data_dir

if TYPE_CHECKING:
    from oom_sentinel.daemon.incidents.snapshot import SnapshotRef
    from oom_sentinel.daemon.incidents.tracker import Incident

__all__ = [
    "CLASS_STRING",
    "SERVICE_NAME",
    "STOP_TIMEOUT_S",
    "RunService",
    "WindowsServiceError",
    "build_service_class",
    "install_service",
    "main",
    "service_settings",
    "uninstall_service",
]

SERVICE_NAME = "oom-sentinel"
DISPLAY_NAME = "oom-sentinel (ComfyUI out-of-memory watchdog)"
DESCRIPTION = (
    "Records ComfyUI out-of-memory crashes as snapshots and sends alerts. "
    "See `oom-sentinel snapshots list`."
)
CLASS_STRING = "oom_sentinel.windows_service.service.OomSentinelService"
#: the registry value (under the service's Parameters key) that names the config file
CONFIG_OPTION = "config"
#: how long the loop may take to return after a stop request (the SCM waits ~20 s at shutdown)
STOP_TIMEOUT_S = 15.0
#: the wait hint while starting (NVML and the first sample can take a few seconds)
START_WAIT_HINT_MS = 30_000
#: ERROR_SERVICE_SPECIFIC_ERROR: the service's own exit code is in svcExitCode
_SERVICE_SPECIFIC_ERROR = 1066


class WindowsServiceError(SentinelError):
    """Installing, removing or running the Windows service failed."""


class RunService(Protocol):
    """``oom_sentinel.daemon.service.wiring.run_service``: runs the loop until ``stop`` is set."""

    def __call__(
        self,
        loaded_settings: LoadedSettings,
        /,
        *,
        stop: threading.Event,
        on_ready: Callable[[str], None] | None = None,
        event_sink: Callable[[Incident, SnapshotRef], None] | None = None,
    ) -> int: ...


def _default_run_service() -> RunService:  # pragma: no cover - the lead's loop
    from oom_sentinel.daemon.service.wiring import run_service

    return run_service


def service_settings(
    config_path: str | None, environ: dict[str, str] | None = None
) -> LoadedSettings:
    """The settings the service runs with: the installed config (or the search path), and
    ``%ProgramData%\\oom-sentinel`` as the data dir when the config names none (a LocalSystem
    service's user dirs are under System32)."""
    loaded = load_settings(config_path or None)
    if loaded.settings.data_dir:
        return loaded
    data_dir = str(service_data_dir(os.environ if environ is None else environ))
    return LoadedSettings(loaded.settings.model_copy(update={"data_dir": data_dir}), loaded.source)


def build_service_class(
    modules: win32.Win32Modules,
    *,
    run_service: RunService | None = None,
    settings_loader: Callable[[str | None], LoadedSettings] = service_settings,
    stop_timeout_s: float = STOP_TIMEOUT_S,
) -> type:
    """The ``ServiceFramework`` subclass, built on ``modules`` (real pywin32 or stand-ins)."""
    base = modules.win32serviceutil.ServiceFramework
    svc = modules.win32service
    sm = modules.servicemanager

    class OomSentinelService(base):  # type: ignore[misc, valid-type]
        _svc_name_ = SERVICE_NAME
        _svc_display_name_ = DISPLAY_NAME
        _svc_description_ = DESCRIPTION

        def __init__(self, args: Any) -> None:
            base.__init__(self, args)
            #: the daemon loop's stop event (set by SvcStop / SvcShutdown)
            self.stop_requested = threading.Event()
            self.ready = threading.Event()
            self.exit_code: int = 0

        # -- the service manager's controls ----------------------------------------------
        def SvcStop(self) -> None:
            self.ReportServiceStatus(
                svc.SERVICE_STOP_PENDING, waitHint=int((stop_timeout_s + 5) * 1000)
            )
            self.stop_requested.set()

        def SvcShutdown(self) -> None:
            self.SvcStop()

        def SvcRun(self) -> None:
            # pywin32's SvcRun reports RUNNING before doing anything; we say so only once the
            # daemon has taken its first sample.
            self.ReportServiceStatus(svc.SERVICE_START_PENDING, waitHint=START_WAIT_HINT_MS)
            self.SvcDoRun()
            if self.exit_code:
                self.ReportServiceStatus(
                    svc.SERVICE_STOPPED,
                    win32ExitCode=_SERVICE_SPECIFIC_ERROR,
                    svcExitCode=self.exit_code,
                )
            else:
                self.ReportServiceStatus(svc.SERVICE_STOP_PENDING)

        def SvcDoRun(self) -> None:
            sm.LogMsg(sm.EVENTLOG_INFORMATION_TYPE, sm.PYS_SERVICE_STARTED, (self._svc_name_, ""))
            try:
                self.exit_code = self._run()
            finally:
                sm.LogMsg(
                    sm.EVENTLOG_INFORMATION_TYPE, sm.PYS_SERVICE_STOPPED, (self._svc_name_, "")
                )

        # -- the loop ------------------------------------------------------------------
        def _run(self) -> int:
            try:
                config = modules.win32serviceutil.GetServiceCustomOption(
                    self._svc_name_, CONFIG_OPTION, None
                )
                loaded = settings_loader(config)
                runner = run_service or _default_run_service()
            except SentinelError as exc:
                sm.LogErrorMsg(f"oom-sentinel cannot start: {exc}")
                return exc.exit_code
            outcome: dict[str, int] = {}

            def target() -> None:
                try:
                    outcome["code"] = int(
                        runner(
                            loaded,
                            stop=self.stop_requested,
                            on_ready=self._on_ready,
                            event_sink=self._on_incident,
                        )
                    )
                except SentinelError as exc:
                    sm.LogErrorMsg(f"oom-sentinel stopped: {exc}")
                    outcome["code"] = exc.exit_code
                except Exception as exc:
                    sm.LogErrorMsg(f"oom-sentinel crashed: {type(exc).__name__}: {exc}")
                    outcome["code"] = EXIT_ERROR

            loop = threading.Thread(target=target, name="oom-sentinel-daemon", daemon=True)
            loop.start()
            while loop.is_alive() and not self.stop_requested.is_set():
                loop.join(0.25)
            loop.join(stop_timeout_s)
            if loop.is_alive():
                sm.LogErrorMsg(
                    f"oom-sentinel did not stop within {stop_timeout_s:g} s of the stop "
                    "request; exiting anyway"
                )
                return EXIT_ERROR
            code = outcome.get("code", EXIT_ERROR)
            if code and not self.stop_requested.is_set():
                sm.LogErrorMsg(f"oom-sentinel ended on its own with exit status {code}")
            return code if not self.stop_requested.is_set() else 0

        def _on_ready(self, status: str) -> None:
            if not self.ready.is_set():
                self.ready.set()
                self.ReportServiceStatus(svc.SERVICE_RUNNING)
            sm.LogInfoMsg(f"oom-sentinel is running: {status}")

        def _on_incident(self, incident: Incident, ref: SnapshotRef) -> None:
            # the Event Log being full must not stop the watchdog
            with contextlib.suppress(Exception):
                sm.LogWarningMsg(
                    f"{incident.summary}\nSnapshot: {ref.id}\n{ref.path}\n"
                    f"Read it: oom-sentinel snapshots show {ref.id}"
                )

    return OomSentinelService


_built: type | None = None


def __getattr__(name: str) -> Any:
    """``OomSentinelService`` is built on first use from the real pywin32 (pythonservice.exe
    imports this module and looks the class up by ``CLASS_STRING``)."""
    global _built
    if name == "OomSentinelService":
        if _built is None:
            _built = build_service_class(win32.load())
        return _built
    raise AttributeError(name)


# --- install / remove ---------------------------------------------------------------------------

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SentinelError:
        raise
    except Exception as exc:  # pywintypes.error and friends: translate at the boundary
        detail = getattr(exc, "strerror", None) or str(exc)
        raise WindowsServiceError(f"{what} failed: {detail} (run it as administrator?)") from None


def install_service(
    config_path: Path | str | None,
    *,
    dry_run: bool = False,
    modules: win32.Win32Modules | None = None,
    run: Runner = subprocess.run,
) -> list[str]:
    """Install (and start) the service; returns the lines to print. ``dry_run``: only say."""
    failure_actions = [
        "sc.exe",
        "failure",
        SERVICE_NAME,
        "reset=",
        "86400",
        "actions=",
        "restart/5000/restart/5000/restart/60000",
    ]
    config = str(Path(config_path).absolute()) if config_path else None
    steps = [
        f"install the service {SERVICE_NAME!r} ({CLASS_STRING}), automatic start",
        *([f"record the config file {config}"] if config else []),
        f"register the Event Log source {SERVICE_NAME!r}",
        "restart on failure: " + " ".join(failure_actions),
        f"start {SERVICE_NAME!r}",
    ]
    if dry_run:
        return [f"would {step}" for step in steps]
    w = modules or win32.load()
    _call(
        "installing the service",
        w.win32serviceutil.InstallService,
        CLASS_STRING,
        SERVICE_NAME,
        DISPLAY_NAME,
        startType=w.win32service.SERVICE_AUTO_START,
        description=DESCRIPTION,
    )
    if config:
        _call(
            "recording the config path",
            w.win32serviceutil.SetServiceCustomOption,
            SERVICE_NAME,
            CONFIG_OPTION,
            config,
        )
    _call(
        "registering the Event Log source",
        w.win32evtlogutil.AddSourceToRegistry,
        SERVICE_NAME,
        getattr(w.servicemanager, "__file__", None),
    )
    proc = run(failure_actions, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise WindowsServiceError(
            f"sc.exe failure {SERVICE_NAME} failed (exit {proc.returncode}): "
            + " ".join((proc.stderr or proc.stdout or "").split())[:200]
        )
    _call("starting the service", w.win32serviceutil.StartService, SERVICE_NAME)
    return [f"done: {step}" for step in steps]


def uninstall_service(
    *, dry_run: bool = False, modules: win32.Win32Modules | None = None
) -> list[str]:
    """Stop and remove the service (the data dir is kept)."""
    if dry_run:
        return [f"would stop {SERVICE_NAME!r}", f"would remove {SERVICE_NAME!r}"]
    w = modules or win32.load()
    with contextlib.suppress(Exception):  # not running: nothing to stop
        w.win32serviceutil.StopService(SERVICE_NAME)
    _call("removing the service", w.win32serviceutil.RemoveService, SERVICE_NAME)
    return [f"removed {SERVICE_NAME!r}; the data dir is kept"]


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - Windows only
    """``python -m oom_sentinel.windows_service.service install|start|stop|remove|debug``:
    pywin32's own command line, for what ``oom-sentinel service`` does not cover."""
    w = win32.load()
    w.win32serviceutil.HandleCommandLine(
        build_service_class(w), argv=argv if argv is not None else sys.argv
    )


if __name__ == "__main__":  # pragma: no cover
    main()

"""Recording stand-ins for pywin32 (not a test module): pywin32 cannot exist on Linux.

They keep pywin32's names and signatures for what the service uses, and record every call in
one shared ``Journal`` so a test can read the sequence: statuses reported to the service
manager, Event Log entries, registry options, installs. ``Harness.run`` plays the part of
pythonservice.exe: it calls ``SvcRun`` on a service thread and reports ``SERVICE_STOPPED`` when
it returns, as the C framework does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from oom_sentinel.windows_service.win32 import Win32Modules

SERVICE_STOPPED = 1
SERVICE_START_PENDING = 2
SERVICE_STOP_PENDING = 3
SERVICE_RUNNING = 4
STATUS_NAMES = {1: "STOPPED", 2: "START_PENDING", 3: "STOP_PENDING", 4: "RUNNING"}


@dataclass
class Journal:
    statuses: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    options: dict[tuple[str, str], Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def status_names(self) -> list[str]:
        with self.lock:
            return [STATUS_NAMES[s["status"]] for s in self.statuses]

    def wait_for(self, predicate: Any, timeout_s: float = 15.0) -> None:
        with self.changed:
            if not self.changed.wait_for(predicate, timeout_s):
                raise AssertionError("the service did not get there in time")


def make_modules(journal: Journal) -> Win32Modules:
    class ServiceFramework:
        """pywin32's base class, minus the service manager."""

        _svc_name_ = ""

        def __init__(self, args: Any) -> None:
            self.args = args

        def ReportServiceStatus(
            self,
            serviceStatus: int,
            waitHint: int = 5000,
            win32ExitCode: int = 0,
            svcExitCode: int = 0,
        ) -> None:
            with journal.changed:
                journal.statuses.append(
                    {
                        "status": serviceStatus,
                        "waitHint": waitHint,
                        "win32ExitCode": win32ExitCode,
                        "svcExitCode": svcExitCode,
                    }
                )
                journal.changed.notify_all()

    def record(name: str, result: Any = None) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with journal.changed:
                journal.calls.append((name, args, kwargs))
                journal.changed.notify_all()
            return result

        return call

    def event(kind: str) -> Any:
        def log(text: str) -> None:
            with journal.changed:
                journal.events.append((kind, text))
                journal.changed.notify_all()

        return log

    def log_msg(event_type: int, event_id: int, strings: tuple[str, ...]) -> None:
        kind = {1001: "started", 1002: "stopped"}.get(event_id, str(event_id))
        with journal.changed:
            journal.events.append((kind, " ".join(strings).strip()))
            journal.changed.notify_all()

    def set_option(service: str, option: str, value: Any) -> None:
        journal.options[(service, option)] = value
        record("SetServiceCustomOption")(service, option, value)

    def get_option(service: str, option: str, default: Any = None) -> Any:
        return journal.options.get((service, option), default)

    win32serviceutil = SimpleNamespace(
        ServiceFramework=ServiceFramework,
        InstallService=record("InstallService"),
        StartService=record("StartService"),
        StopService=record("StopService"),
        RemoveService=record("RemoveService"),
        SetServiceCustomOption=set_option,
        GetServiceCustomOption=get_option,
        HandleCommandLine=record("HandleCommandLine"),
    )
    win32service = SimpleNamespace(
        SERVICE_STOPPED=SERVICE_STOPPED,
        SERVICE_START_PENDING=SERVICE_START_PENDING,
        SERVICE_STOP_PENDING=SERVICE_STOP_PENDING,
        SERVICE_RUNNING=SERVICE_RUNNING,
        SERVICE_AUTO_START=2,
        SERVICE_DEMAND_START=3,
    )
    servicemanager = SimpleNamespace(
        __file__=r"C:\Python311\Lib\site-packages\win32\servicemanager.pyd",
        EVENTLOG_INFORMATION_TYPE=4,
        EVENTLOG_WARNING_TYPE=2,
        EVENTLOG_ERROR_TYPE=1,
        PYS_SERVICE_STARTED=1001,
        PYS_SERVICE_STOPPED=1002,
        LogMsg=log_msg,
        LogInfoMsg=event("info"),
        LogWarningMsg=event("warning"),
        LogErrorMsg=event("error"),
        SetEventSourceName=record("SetEventSourceName"),
    )
    win32evtlogutil = SimpleNamespace(
        AddSourceToRegistry=record("AddSourceToRegistry"),
        ReportEvent=record("ReportEvent"),
    )
    win32evtlog = SimpleNamespace(EVENTLOG_ERROR_TYPE=1, EVENTLOG_WARNING_TYPE=2)
    win32event = SimpleNamespace(CreateEvent=record("CreateEvent", 1), SetEvent=record("SetEvent"))
    return Win32Modules(
        win32serviceutil=win32serviceutil,
        win32service=win32service,
        win32event=win32event,
        servicemanager=servicemanager,
        win32evtlog=win32evtlog,
        win32evtlogutil=win32evtlogutil,
    )


class Harness:
    """pythonservice.exe's part: run ``SvcRun`` on a thread, report STOPPED when it returns."""

    def __init__(self, service: Any, journal: Journal) -> None:
        self.service = service
        self.journal = journal
        self.thread = threading.Thread(target=self._run, name="service-main", daemon=True)

    def _run(self) -> None:
        self.service.SvcRun()
        last = self.journal.statuses[-1]["status"] if self.journal.statuses else None
        if last != SERVICE_STOPPED:
            self.service.ReportServiceStatus(SERVICE_STOPPED)

    def start(self) -> None:
        self.thread.start()

    def stopped(self) -> bool:
        return not self.thread.is_alive()

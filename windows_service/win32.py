"""The one place the Windows service imports pywin32, so tests can hand it stand-ins.

pywin32 exists only on Windows; the service code reaches ``win32serviceutil``, ``win32service``,
``win32event``, ``servicemanager``, ``win32evtlog`` and ``win32evtlogutil`` through the
``Win32Modules`` that ``load()`` returns. On Linux the tests call ``use(fakes)`` with objects
that record every call; nothing else in the package imports a ``win32*`` module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oom_sentinel.daemon.core.errors import SentinelError

__all__ = ["PyWin32Missing", "Win32Modules", "load", "use"]


class PyWin32Missing(SentinelError):
    """pywin32 is not installed (or this is not Windows)."""


@dataclass(frozen=True)
class Win32Modules:
    win32serviceutil: Any
    win32service: Any
    win32event: Any
    servicemanager: Any
    win32evtlog: Any
    win32evtlogutil: Any


_override: Win32Modules | None = None


def use(modules: Win32Modules | None) -> None:
    """Make ``load()`` return ``modules`` (tests); ``None`` goes back to the real pywin32."""
    global _override
    _override = modules


def load() -> Win32Modules:
    """pywin32's modules, or ``PyWin32Missing`` with the command that installs them."""
    if _override is not None:
        return _override
    try:  # pragma: no cover - Windows only
        import servicemanager
        import win32event
        import win32evtlog
        import win32evtlogutil
        import win32service
        import win32serviceutil
    except ImportError as exc:
        raise PyWin32Missing(
            "the Windows service needs pywin32: pip install pywin32 (Windows only), then run "
            "pywin32_postinstall -install as administrator"
        ) from exc
    return Win32Modules(  # pragma: no cover - Windows only
        win32serviceutil=win32serviceutil,
        win32service=win32service,
        win32event=win32event,
        servicemanager=servicemanager,
        win32evtlog=win32evtlog,
        win32evtlogutil=win32evtlogutil,
    )

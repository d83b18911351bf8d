"""Children that die with ``oom-bisect``: the parent-death signal for every process it starts.

``oom-bisect`` can die without running any cleanup (SIGKILL, the OOM killer, SIGHUP from an
SSH drop). A replay server left behind holds a GPU; a ``git checkout`` left behind in the
workspace spun at 100% CPU for an hour. On Linux a child started with
``prctl(PR_SET_PDEATHSIG, SIGKILL)`` is killed by the kernel when its parent goes, whatever
the parent was doing; elsewhere there is no such thing and this is a no-op (Windows replay
servers sit in a kill-on-close Job object instead, see ``replay.py``).

The signal follows the *thread* that forked the child, not the process: start a long-lived
child from a thread that lives as long as ``oom-bisect`` (``replay._Spawner``), or wait for
it on the thread that started it (a git command run to its end does).

A ``preexec_fn`` has a price: CPython then forks instead of using vfork, and runs the
``os.register_at_fork`` handlers in the parent after the fork (``logging`` has one). A signal
that arrives during the fork is handled at the first bytecode after it -- inside such a
handler, where an exception is only printed ("Exception ignored"): a Ctrl-C or SIGTERM
raising KeyboardInterrupt there was lost and the bisect went on. Fork such children inside
``signals_deferred()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["PR_SET_PDEATHSIG", "pdeathsig_preexec", "signals_deferred"]

PR_SET_PDEATHSIG = 1
_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)


def pdeathsig_preexec(sig: int = _SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when the thread that forked it dies
    (Linux ``prctl(PR_SET_PDEATHSIG)``); None elsewhere. ``prctl`` is looked up here, before
    the fork: the child only calls it. If we died between the fork and the ``prctl`` the
    child has been re-parented already and exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


#: the signals whose Python handlers oom-bisect relies on to stop (Ctrl-C, ``kill``, systemd)
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred(signums: tuple[int, ...] = DEFERRED_SIGNALS) -> Iterator[None]:
    """While in force, the main thread's Python handlers for ``signums`` only take note; on
    the way out the handlers are put back and each noted signal is handed to its own handler,
    so a Ctrl-C during a fork raises KeyboardInterrupt here instead of vanishing in an at-fork
    handler (see the module docstring). Handlers that are not Python callables (``SIG_DFL``,
    ``SIG_IGN``) are left alone. Off the main thread it does nothing: Python runs signal
    handlers only on the main thread, so a fork elsewhere cannot swallow one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        noted.append(signum)

    previous: dict[int, Callable[[int, FrameType | None], object]] = {}
    for signum in signums:
        handler = signal.getsignal(signum)
        if callable(handler):
            previous[signum] = handler
            signal.signal(signum, note)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):
            previous[signum](signum, None)

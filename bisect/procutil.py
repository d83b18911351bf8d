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
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["PR_SET_PDEATHSIG", "pdeathsig_preexec"]

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

"""Waiting on the processes a test started (not a test module): that one is gone, that a
background one reaches a point while it still runs, and reaping it whatever happened.

Shared by the tests that kill ``oom-bisect`` (or a stand-in for it) and check what it leaves:
tests/test_bisect_replay_death.py, tests/test_bisect_forkserver.py, tests/test_bisect_e2e.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psutil

T = TypeVar("T")


def wait_gone(pid: int, timeout_s: float = 15.0) -> bool:
    """True once ``pid`` has exited (a zombie counts: it runs nothing), False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` if it still runs and wait for it: the ``finally`` of a background start, so
    a failed test leaves no process behind."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def wait_while_running(
    proc: subprocess.Popen[Any],
    reached: Callable[[], T | None],
    timeout_s: float,
    what: str | Callable[[], str],
    interval_s: float = 0.05,
) -> T:
    """Poll ``reached()`` until it returns a truthy value, and return that value.

    Fails (AssertionError) if ``proc`` exits first, with its stderr when piped (why it died),
    or when ``timeout_s`` passes with ``what`` (what did not happen; a callable is asked then); ``reached`` may assert too.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else f"exit {proc.returncode}"
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"{said} (waited {timeout_s:g} s)")
        found = reached()
        if found:
            return found
        time.sleep(interval_s)

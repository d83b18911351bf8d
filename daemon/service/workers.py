"""One lifecycle for every daemon worker thread: start, stop (ask, wake, join with a timeout),
the last time its loop was seen working, and the crash that ended it. ``Health`` folds every
worker of the service into one answer: systemd's watchdog is pinged (``WATCHDOG=1``) only while
all are alive, ``status`` and the ``worker_up`` metric say which one is not, and a worker that
ends is logged once by name.

Why one base: five threads (alert sender, API watcher, process watcher, install-state
capture, /metrics server, plus the scheduler's loop) each had their own start/stop/is_alive,
and a crash was a traceback on stderr that nothing else saw. Here a worker's target runs
inside a wrapper that records what ended it, so a dead worker is reported the same way
whichever it is. The target owns its loop: it checks ``stopping`` (or is woken by the
``wake`` it gives ``stop``) and calls ``beat()`` each turn."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from oom_sentinel.daemon.service.sdnotify import Notifier, watchdog_interval_s

log = logging.getLogger("oom_sentinel")


class Worker:
    """A daemon thread running ``target`` once; the target loops until ``stopping`` is set.

    ``name`` is the worker's health name (``status``'s ``workers``, the ``worker_up`` metric);
    ``thread_name`` the thread's (what ``py-spy`` and tracebacks show)."""

    def __init__(
        self,
        name: str,
        target: Callable[[], None],
        *,
        thread_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.thread_name = thread_name or name
        self._target = target
        self._clock = clock
        self._thread: threading.Thread | None = None
        #: set by ``stop`` (or ``request_stop``): the target's loop ends at its next turn
        self.stopping = threading.Event()
        #: when the target last said it was working (``beat``); None before it ran
        self.last_alive_s: float | None = None
        #: ``"Type: message"`` of the exception that ended the target, None otherwise
        self.error: str | None = None
        #: when the target returned or raised (None while it runs, or before it ran)
        self.ended_s: float | None = None

    # -- from the owner ------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the thread unless it runs; False when it already did."""
        if self.is_alive():
            return False
        self.stopping.clear()
        self.error = self.ended_s = None
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return True

    def request_stop(self) -> None:
        self.stopping.set()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the thread to end; True when it has (or never ran)."""
        thread = self._thread
        if thread is None:
            return True
        if thread is not threading.current_thread():
            thread.join(timeout_s)
        return not thread.is_alive()

    def stop(self, timeout_s: float, wake: Callable[[], None] | None = None) -> bool:
        """Ask the target to end, ``wake`` it from its wait, join; True when it ended within
        ``timeout_s`` (a stuck one stays a daemon thread: it cannot hold the process)."""
        self.request_stop()
        if wake is not None:
            wake()
        return self.join(timeout_s)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def health(self) -> dict[str, Any]:
        """The worker's line in ``status``: alive, last seen working, what ended it."""
        return {
            "alive": self.is_alive(),
            "last_alive_s": self.last_alive_s,
            "ended_s": self.ended_s,
            "error": self.error,
        }

    # -- from the target's thread ------------------------------------------------------------

    def beat(self) -> None:
        """The target's loop is working (one turn done)."""
        self.last_alive_s = self._clock()

    def _run(self) -> None:
        self.beat()
        try:
            self._target()
        except BaseException as exc:  # SystemExit too: whatever ends the thread is reported
            self.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.error("the %s worker crashed: %s", self.name, self.error, exc_info=True)
        finally:
            self.ended_s = self._clock()


class Health:
    """Every worker of the service, checked together: alive or not, each death logged once.

    ``on_check`` (the metrics' ``worker_up`` gauge) hears every worker's state at each check.
    """

    def __init__(self, on_check: Callable[[str, bool], None] | None = None) -> None:
        self._workers: dict[str, Worker] = {}
        self.on_check = on_check
        #: workers seen dead (each is logged once, by name)
        self._dead: set[str] = set()

    def add(self, worker: Worker) -> Worker:
        self._workers[worker.name] = worker
        return worker

    @property
    def workers(self) -> Mapping[str, Worker]:
        return self._workers

    def check(self) -> dict[str, bool]:
        """Liveness of every worker; one that is not alive is logged once by name."""
        alive = {name: w.is_alive() for name, w in self._workers.items()}
        for name, ok in alive.items():
            if self.on_check is not None:
                self.on_check(name, ok)
            if not ok and name not in self._dead:
                self._dead.add(name)
                why = self._workers[name].error or "it ended"
                log.error(
                    "the %s worker is dead (%s): systemd's watchdog is no longer pinged, so "
                    "the service is restarted",
                    name,
                    why,
                )
            elif ok:
                self._dead.discard(name)
        return alive

    def healthy(self) -> bool:
        """Every worker alive: only then is systemd's watchdog pinged."""
        return all(self.check().values())

    def details(self) -> dict[str, dict[str, Any]]:
        return {name: w.health() for name, w in self._workers.items()}


class WatchdogPing:
    """systemd's watchdog (``WatchdogSec=``, ``WATCHDOG_USEC``): ``WATCHDOG=1`` a little
    more often than asked, and only while ``health`` says every worker is alive -- so a dead
    worker gets the service restarted. Without ``WATCHDOG_USEC`` it never pings."""

    def __init__(self, notifier: Notifier, environ: Mapping[str, str], health: Health) -> None:
        self.notifier = notifier
        self.interval_s = watchdog_interval_s(environ)
        self.health = health
        self.last_s = 0.0

    def next_due(self) -> float | None:
        return None if self.interval_s is None else self.last_s + self.interval_s

    def tick(self, now: float) -> None:
        if self.interval_s is None or now - self.last_s < self.interval_s * 0.9:
            return
        if self.health.healthy():
            self.notifier.watchdog()
            self.last_s = now

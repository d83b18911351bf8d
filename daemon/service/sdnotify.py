"""systemd's notify protocol (sd_notify(3)) in a few lines of our own.

Why not a library: `systemd-python` needs libsystemd headers to build and `sdnotify` swallows
errors; the protocol is one datagram per message to the socket in ``$NOTIFY_SOCKET``. Outside
systemd (no ``$NOTIFY_SOCKET``) every call is a cheap no-op, so the service code calls it
unconditionally.

The watchdog contract matters more than the transport: ``WATCHDOG=1`` is sent only by the
service's own loop after it has checked that every worker is alive, so a wedged sampler or log
follower makes systemd restart us instead of pinging on blindly (see service.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

__all__ = ["Notifier", "watchdog_interval_s"]


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """How often to ping: half of ``$WATCHDOG_USEC`` (as sd_watchdog_enabled(3) advises),
    or None when the watchdog is off or meant for another process (``$WATCHDOG_PID``)."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2_000_000


class Notifier:
    """Sends READY / STATUS / WATCHDOG / RELOADING / STOPPING to the service manager."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()  # abstract namespace
        elif address.startswith("/"):
            self._address = address
        self._sock: socket.socket | None = None
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, **fields: str | int) -> bool:
        """Send one datagram (``READY=1`` etc.); False when not under systemd or it failed.

        A failure is never fatal: systemd may be restarting, and the watchdog will tell."""
        if self._sock is None or self._address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            self._sock.sendto(payload, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def reloading(self) -> bool:
        # Type=notify-reload (systemd >= 253) wants MONOTONIC_USEC with RELOADING=1.
        return self.send(
            RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        )

    def stopping(self) -> bool:
        return self.send(STOPPING=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

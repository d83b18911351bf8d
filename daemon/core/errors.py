"""One exception tree for the daemon and the bisect, so the front ends can turn any failure
into one line and a documented exit status.

    SentinelError                 message is one complete sentence naming what and where (1)
      ConfigError                 "config.toml: instances[0].port: must be 1..65535, got 0" (2)
      InputError                  bad workflow JSON, foreign snapshot, unreadable log (3)
      StoreError                  corrupt or foreign database file
      ProbeError                  a probe the caller depends on failed (ComfyUI's interpreter)
      ComfyError                  server did not start, API error, websocket closed
      BisectError
        BadRef                    "custom_nodes/foo: 'v9' is not a commit" (2: usage)
        NotBisecting              no session to act on

A few modules add a subclass next to the code that raises it (``SnapshotNotFound``,
``SnapshotWriteError``, ``MetricsError``, ``ServiceError``, ``DesktopUnavailable``, the Windows
service's two); they keep the base class's exit status 1.

What is not an error is a value: a GPU probe never raises (no NVML means the "none" probe,
chosen once in ``gpu_select``), and a bisect whose candidates are all skipped ends with the
``plan.OnlySkippedLeft`` step, which ``oom-bisect`` reports as "ambiguous" (exit status 5;
the bisect's own statuses 4, 5 and 130 are in ``bisect/cli/main.py``).

Adapters translate foreign errors (pynvml, psutil, git, HTTP) at the boundary with
``raise ... from exc``; only the CLIs and the service loop catch ``SentinelError``.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_INPUT",
    "EXIT_OK",
    "BadRef",
    "BisectError",
    "ComfyError",
    "ConfigError",
    "InputError",
    "NotBisecting",
    "ProbeError",
    "SentinelError",
    "StoreError",
]

# Exit statuses shared by both CLIs (documented in README.md, "Exit status").
EXIT_OK = 0
EXIT_ERROR = 1  # a runtime failure (store, probe, ComfyUI, bisect) -- one line on stderr
EXIT_CONFIG = 2  # invalid configuration or command-line usage
EXIT_INPUT = 3  # unreadable or malformed input file (workflow, log, snapshot)


class SentinelError(Exception):
    """Base of every error we raise on purpose; ``str(err)`` is the whole user-facing line."""

    exit_code: int = EXIT_ERROR


class ConfigError(SentinelError):
    """The configuration (file, environment or flags) is invalid; nothing was started."""

    exit_code = EXIT_CONFIG


class InputError(SentinelError):
    """A file the user handed us (workflow, log, snapshot, Manager file) cannot be used."""

    exit_code = EXIT_INPUT


class StoreError(SentinelError):
    """The SQLite store is unreadable, corrupt or belongs to another program."""


class ProbeError(SentinelError):
    """A memory or process probe failed in a way the caller must know about."""


class ComfyError(SentinelError):
    """A ComfyUI instance did not start, answered with an error, or went away."""


class BisectError(SentinelError):
    """The bisect cannot go on as asked."""


class BadRef(BisectError):
    """A git ref or state description does not name anything we can check out."""

    exit_code = EXIT_CONFIG


class NotBisecting(BisectError):
    """A session command was given while no bisect session exists."""

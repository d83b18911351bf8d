"""How the daemon process logs and answers signals: set up once by the front end (the CLI's
``run``) before the service is built, so every module's lines look the same."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from oom_sentinel.daemon.core.redact import redact_text

log = logging.getLogger("oom_sentinel")

_SYSLOG_PRIORITY = {"CRITICAL": 2, "ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}


def install_signal_handlers(
    stop: threading.Event, reload: Callable[[], None] | None = None
) -> None:
    """SIGTERM/SIGINT stop the loop (within one tick); SIGHUP asks for a config reload."""

    def handler(signum: int, frame: Any) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if reload is not None and hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda signum, frame: reload())


def configure_logging(level: str, environ: Mapping[str, str] | None = None) -> None:
    """Plain lines on stderr; under journald, ``<N>`` priority prefixes instead of times."""
    env = os.environ if environ is None else environ
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    if env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"):
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    # APScheduler logs every job run at INFO
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


class _RedactingFormatter(logging.Formatter):
    """Every daemon log line passes ``redact_text``: a ComfyUI URL's ``?token=``, an apprise
    URL or a token in an error message is masked whichever module logged it."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class _JournalFormatter(_RedactingFormatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prio = _SYSLOG_PRIORITY.get(record.levelname, 6)
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines())

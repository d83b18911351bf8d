"""Take the wrapper's prefix off a ComfyUI log line, so that prefixes never hide what a line says.

Core ComfyUI logs with format ``%(message)s``; the prefixes come from whoever wrote the file
(comfyui-facts.md §3.4): ComfyUI-Manager (``[2026-01-02 10:11:12.345] ``, older ``[2026-01-02
10:11] ``), the ``/internal/logs`` copy (``2025-04-27T21:57:57.289009 - ``), ComfyUI Desktop's
electron-log (``[2025-03-28 01:40:15.296] [info]  ``), launchers that use Python logging
(``2024-12-16 17:10:56,767 - root - ERROR - ``, ``ERROR:root:``), newer level tags
(``[INFO] ``), and per-line prefixes that wrap *every* line, continuation lines included
(journald/syslog ``May 15 23:09:27 host kernel: ``, ``docker compose`` ``comfyui  | ``,
BuildKit's ``#14 107.3 ``, GitHub Actions' ``2024-04-14T22:05:23.8605906Z ``).

The difference matters for record assembly (records.py): a wrapper prefix marks the start of
a new log record, and the wrapper leaves continuation lines (traceback bodies) bare; a
per-line prefix says nothing about record boundaries.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Split", "split_prefix", "strip_ansi", "strip_prefix"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# Wrapper prefixes: each one starts a new record. Order matters: electron-log before Manager.
_ELECTRON_LEVEL = re.compile(r"\[(?:error|warn|info|verbose|debug|silly)\] ?\s?")
_MANAGER = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d(?:\.\d+)?)?)\] ?")
_INTERNAL = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?) - ")
_PYLOGGING = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - [\w.\-]+ - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
)
_LEVEL_COLON = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.\-]*:")
_LEVEL_TAG = re.compile(r"\[(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\] ")
_LEVEL_TAGS = ("[DEBUG] ", "[INFO] ", "[WARNING] ", "[WARN] ", "[ERROR] ", "[CRITICAL] ")

# Per-line prefixes: they wrap every line, so they do not mark record starts.
_SYSLOG = re.compile(
    r"([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ [^\s:\[]+(?:\[\d+\])?: (?:\[ *\d+\.\d+\] )?"
)
_COMPOSE = re.compile(r"[a-z0-9][a-z0-9_.\-]*\s+\| ")
#: BuildKit's plain progress output (``docker build``): the step and its seconds, ``#14 107.3 ``
_BUILDKIT = re.compile(r"#\d+ \d+\.\d+(?: |$)")
#: GitHub Actions' raw log: every line stamped in UTC, ``2024-04-14T22:05:23.8605906Z ``
_ACTIONS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)(?: |$)")


class Split(NamedTuple):
    """A line cut into its prefix facts and its message.

    (A named tuple rather than a frozen dataclass: it is built for every line the scanners
    assemble, and a tuple is several times cheaper to create.)
    """

    timestamp: str | None
    message: str
    #: True when a record-starting prefix was found: the line starts a new log record
    starts_record: bool
    #: True when a per-line prefix (journal, compose) was removed
    per_line: bool = False


def strip_ansi(line: str) -> str:
    """Remove terminal colour codes (``\\x1b[32m[INFO]\\x1b[0m``)."""
    return _ANSI.sub("", line) if "\x1b" in line else line


#: builds a ``Split`` without the named tuple's Python-level ``__new__`` (half the cost of a
#: split on the scanners' path, which splits every line it feeds)
_new_split = tuple.__new__


def split_prefix(line: str) -> Split:
    """Recognize the known prefixes of ``line`` (one line, no newline). Never raises."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if not line:
        return _new_split(Split, (None, line, False, False))
    per_line = False
    line_time: str | None = None
    first = line[0]
    if first == "[":
        pass  # neither per-line prefix starts with "[" (the common case: Manager's prefix)
    elif first.isupper() and first in "JFMASOND":
        m = _SYSLOG.match(line)
        if m:
            line, line_time = line[m.end() :], m.group(1)
            per_line = True
            if not line:
                return _new_split(Split, (line_time, line, False, True))
            first = line[0]
    else:
        # the per-line prefixes without a time: BuildKit's step, docker compose's service
        if first == "#" and line[1:2].isdigit():
            m = _BUILDKIT.match(line)
        elif first.isdigit() and line[10:11] == "T" and "Z" in line[19:29]:
            m = _ACTIONS.match(line)
            if m:
                line_time = m.group(1)
        elif "| " in line and (first.islower() or first.isdigit()):
            m = _COMPOSE.match(line)
        else:
            m = None
        if m:
            line = line[m.end() :]
            per_line = True
            if not line:
                return _new_split(Split, (None, line, False, True))
            first = line[0]
    timestamp: str | None = None
    starts = False
    if first == "[":
        m = _MANAGER.match(line)
        if m:
            timestamp, line, starts = m.group(1), line[m.end() :], True
            if line[:1] == "[":
                # electron-log adds a level after the time: ``[2025-..] [info]  text``;
                # a Manager prefix may be followed by ComfyUI's own ``[INFO] `` tag
                m = _ELECTRON_LEVEL.match(line) or _LEVEL_TAG.match(line)
                if m:
                    line = line[m.end() :]
        elif line.startswith(_LEVEL_TAGS):
            m = _LEVEL_TAG.match(line)
            if m:
                line, starts = line[m.end() :], True
    elif first.isdigit():
        m = _INTERNAL.match(line) or _PYLOGGING.match(line)
        if m:
            timestamp, line, starts = m.group(1), line[m.end() :], True
    elif first in "DIWEC":
        m = _LEVEL_COLON.match(line)
        if m:
            line, starts = line[m.end() :], True
    return _new_split(Split, (timestamp or line_time, line, starts, per_line))


def strip_prefix(line: str) -> tuple[str | None, str]:
    """Return ``(timestamp text or None, message)`` for one log line. Never raises.

    >>> strip_prefix("[2026-01-02 10:11:12.345] got prompt")
    ('2026-01-02 10:11:12.345', 'got prompt')
    >>> strip_prefix("2025-04-27T21:57:57.289009 - got prompt")
    ('2025-04-27T21:57:57.289009', 'got prompt')
    >>> strip_prefix("  File \\"execution.py\\", line 327, in execute")
    (None, '  File "execution.py", line 327, in execute')
    """
    split = split_prefix(line)
    return split.timestamp, split.message

"""The Linux kernel's OOM-killer lines, read once: one line of text in, the facts it states out.

Two readers need them and both use this module: the classifier (classify/rules.py), for lines
in a log or a user's paste, and the kill evidence (kernel/oom.py), for ``/dev/kmsg`` and the
journal after a watched process died. The kernel's report of one kill (mm/oom_kill.c,
mm/memcontrol.c) reads, oldest first::

    pt_main_thread invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0
    ... (call trace, Mem-Info, the task table; v1 before 4.19:
    Task in /docker/abc killed as a result of limit of /docker/abc)
    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/docker/abc,task_memcg=/docker/abc,task=pt_main_thread,pid=1234,uid=1000
    Memory cgroup out of memory: Killed process 1234 (pt_main_thread) total-vm:..kB, anon-rss:..kB, file-rss:..kB, shmem-rss:..kB, UID:1000 pgtables:..kB oom_score_adj:0
    oom_reaper: reaped process 1234 (pt_main_thread), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB

Kernels before 4.19 have no ``oom-kill:`` line and first name the chosen victim
(``Out of memory: Kill process N (comm) score S or sacrifice child``), then the process
actually killed (``Killed process M (comm) ...``, a child of N when one was sacrificed).

A name in these lines is a *thread's* ``comm`` (16 bytes, NUL included), not a program's:
torch renames the main thread ``pt_main_thread``, so ComfyUI is killed as
``Killed process <its pid> (pt_main_thread)`` and the allocating task may be
``GC Thread#9``. The pid is what identifies the process; nothing here or in the readers
compares a name with "python".

A line may carry any prefix (dmesg's ``[ 12.345678]``, ``dmesg -T``'s ``[Sun Mar 30 ...]``,
syslog's ``host kernel:``, an ISO time, a quote in prose): the kernel's text is found where it
starts in the line. Pure and standard library only (kernel/oom.py is run as a copy by an
unprivileged user, with this file beside it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["KernelOomLine", "Kind", "Scope", "kernel_lines", "parse_kernel_line"]

Kind = Literal["invoked", "summary", "chosen", "killed", "reaped", "cgroup"]
#: "global": the whole machine (``Out of memory``, ``global_oom``); "memcg": a memory
#: cgroup's limit (``Memory cgroup out of memory``, ``CONSTRAINT_MEMCG``, ``oom_memcg=``)
Scope = Literal["global", "memcg"]

#: the kernel keeps a task's name in 16 bytes, its NUL included
TASK_COMM_MAX = 15
#: kB fields are read this far along a kill line (a paste can be one huge line)
_FIELDS_SPAN = 400
#: the invoking task's name is looked for this far before ``invoked oom-killer``
_INVOKED_WINDOW = 64
#: digits a number may have (a longer one is no pid or size, and ``int`` refuses > 4300)
_MAX_DIGITS = 19

_INVOKED_AT = " invoked oom-killer:"
#: how far before a second marker on one line its statement may start ('Out of memory: ')
_SAME_LINE_BACK = 32
_LAST_WORD = re.compile(r"\b(\S+)\Z")
#: what ends a prefix before the invoking task's name: dmesg's ``] ``, syslog's ``kernel: ``,
#: an ISO time's zone (``2024-04-29T14:55:41,678628+02:00 ``)
_PREFIX_END = re.compile(r"\] |kernel: |\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)? ")
_SUMMARY = re.compile(r"oom-kill:constraint=")
#: the victim at the summary's end; a comm may hold spaces and commas, so it ends at ",pid="
_SUMMARY_TASK = re.compile(r",task=(?P<task>.*?),pid=(?P<pid>\d+)(?:,uid=(?P<uid>\d+))?")
_KILL = re.compile(
    r"(?:(?P<scope>Out of memory|Memory cgroup out of memory)(?: \([\w ]+\))?: )?"
    # (RHEL 6's kernels put the uid between: 'Killed process 3080, UID 0, (forward) ...')
    r"(?P<verb>Killed|Kill) process (?P<pid>\d+)(?:, UID \d+,)? \((?P<comm>[^)\n]{0,64})\)"
)
_SCORE = re.compile(r"\s*score (\d+)")
_REAPED = re.compile(r"oom_reaper: reaped process (?P<pid>\d+) \((?P<comm>[^)\n]{0,64})\)")
_TASK_IN = re.compile(r"Task in (?P<task>\S+) killed as a result of limit of (?P<limit>\S+)")
_KB_FIELD = re.compile(r"\b(?P<key>[A-Za-z][\w-]*):\s?(?P<value>\d[\d,]*)\s?kB")
#: a line holds one of these where it holds a kernel OOM line (the cheap test before a regex)
_MARKERS = re.compile(
    r"Kill(?:ed)? process |invoked oom-killer:|oom-kill:constraint=|oom_reaper: reaped"
    r"|killed as a result of limit"
)


@dataclass(frozen=True, slots=True)
class KernelOomLine:
    """One line of the kernel's OOM-killer report, and the facts it states."""

    #: "invoked" (``<comm> invoked oom-killer``: the allocating task, not the victim),
    #: "summary" (``oom-kill:constraint=…,task=<comm>,pid=N``), "chosen" (before 4.19: ``…:
    #: Kill process N (<comm>) score S or sacrifice child``; a child may die instead), "killed"
    #: (``… Killed process N (<comm>) …``), "reaped" (``oom_reaper: reaped process N``: only
    #: an OOM victim is reaped), "cgroup" (before 4.19: ``Task in <cg> killed as a result of
    #: limit of <cg>``)
    kind: Kind
    #: the line as given (without its line break)
    text: str
    #: where the kernel's own text starts in ``text`` (after any prefix)
    start: int = 0
    pid: int | None = None
    #: a thread's name (``pt_main_thread`` for torch's main thread), spaces kept
    comm: str | None = None
    #: only where the line says it
    scope: Scope | None = None
    #: CONSTRAINT_NONE, CONSTRAINT_MEMCG, CONSTRAINT_CPUSET, CONSTRAINT_MEMORY_POLICY
    constraint: str | None = None
    #: the memory cgroup whose limit was hit
    oom_memcg: str | None = None
    #: the victim's memory cgroup
    task_memcg: str | None = None
    uid: int | None = None
    #: the victim's badness ("chosen" lines)
    score: int | None = None
    #: the kB fields in line order: total-vm, anon-rss, file-rss, shmem-rss, pgtables …
    kib: tuple[tuple[str, int], ...] = ()

    def bytes_of(self, field: str) -> int | None:
        """A kB field in bytes (``"anon-rss"``), or None when the line has none."""
        for key, value in self.kib:
            if key == field:
                return value * 1024
        return None

    @property
    def rss_bytes(self) -> int | None:
        """The resident set the line reports: anon + file + shmem, in bytes."""
        parts = [self.bytes_of(k) for k in ("anon-rss", "file-rss", "shmem-rss")]
        known = [p for p in parts if p is not None]
        return sum(known) if known else None


def _int(digits: str | None) -> int | None:
    if not digits or len(digits) > _MAX_DIGITS:
        return None
    return int(digits)


def _kib(text: str) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for m in _KB_FIELD.finditer(text):
        value = _int(m.group("value").replace(",", ""))
        if value is not None:
            out.append((m.group("key"), value))
    return tuple(out)


def _invoking_task(line: str) -> tuple[str, int] | None:
    """(name, start) of the task before ``invoked oom-killer``, spaces kept (``GC Thread#9``).

    The last word before it is the name's end; the words before that belong to the name when
    they follow the line's prefix (or start the line) and fit the kernel's 15 characters.
    Only a short window before the words is read, so a huge line costs no more than a short.
    """
    at = line.find(_INVOKED_AT)
    if at <= 0:
        return None
    lo = max(0, at - _INVOKED_WINDOW)
    m = _LAST_WORD.search(line, lo, at)
    if m is None:
        return None
    name, start = m.group(1), m.start(1)
    before = line[lo:start]
    ends = [e.end() for e in _PREFIX_END.finditer(before)]
    if not ends and lo > 0:
        return name, start  # the line's start is out of the window: the name is one word
    head = lo + (ends[-1] if ends else 0)
    tail = line[head:start]
    if tail and not tail.isspace() and len(tail) + len(name) <= TASK_COMM_MAX:
        lead = len(tail) - len(tail.lstrip())
        return tail.lstrip() + name, head + lead
    return name, start


def _summary(line: str, m: re.Match[str]) -> KernelOomLine:
    body = line[m.start() + len("oom-kill:") :]
    t = _SUMMARY_TASK.search(body)
    head = body[: t.start()] if t else body.split(None, 1)[0]
    fields: dict[str, str] = {}
    for part in head.split(","):
        key, eq, value = part.partition("=")
        fields.setdefault(key.strip(), value if eq else "")
    constraint = fields.get("constraint") or None
    scope: Scope | None = None
    if "oom_memcg" in fields or constraint == "CONSTRAINT_MEMCG":
        scope = "memcg"
    elif "global_oom" in fields:
        scope = "global"
    pid = _int(t.group("pid")) if t else None
    uid = _int(t.group("uid")) if t else None
    return KernelOomLine(
        "summary",
        line,
        m.start(),
        pid=pid,
        comm=t.group("task") if t else None,
        scope=scope,
        constraint=constraint,
        oom_memcg=fields.get("oom_memcg") or None,
        task_memcg=fields.get("task_memcg") or None,
        uid=uid,
    )


def parse_kernel_line(text: str) -> KernelOomLine | None:
    """The kernel OOM-killer line in ``text`` (one line, any prefix), or None. Never raises."""
    line = text.rstrip("\r\n")
    if _MARKERS.search(line) is None:
        return None
    m = _REAPED.search(line) if "oom_reaper" in line else None
    if m:
        rest = line[m.end() : m.end() + _FIELDS_SPAN]
        return KernelOomLine(
            "reaped",
            line,
            m.start(),
            pid=_int(m.group("pid")),
            comm=m.group("comm"),
            kib=_kib(rest),
        )
    m = _KILL.search(line) if "process " in line else None
    while m is not None and m.group("verb") == "Kill" and m.group("scope") is None:
        m = _KILL.search(line, m.end())  # a bare "Kill process" is anybody's words
    if m is not None:
        scope_text = m.group("scope")
        scope: Scope | None = None
        if scope_text == "Out of memory":
            scope = "global"
        elif scope_text == "Memory cgroup out of memory":
            scope = "memcg"
        rest = line[m.end() : m.end() + _FIELDS_SPAN]
        if m.group("verb") == "Kill":
            sm = _SCORE.match(rest)
            return KernelOomLine(
                "chosen",
                line,
                m.start(),
                pid=_int(m.group("pid")),
                comm=m.group("comm"),
                scope=scope,
                score=_int(sm.group(1)) if sm else None,
            )
        return KernelOomLine(
            "killed",
            line,
            m.start(),
            pid=_int(m.group("pid")),
            comm=m.group("comm"),
            scope=scope,
            kib=_kib(rest),
        )
    m = _SUMMARY.search(line) if "oom-kill:" in line else None
    if m:
        return _summary(line, m)
    task = _invoking_task(line)
    if task is not None:
        return KernelOomLine("invoked", line, task[1], comm=task[0])
    m = _TASK_IN.search(line) if "Task in " in line else None
    if m:
        return KernelOomLine(
            "cgroup",
            line,
            m.start(),
            scope="memcg",
            oom_memcg=m.group("limit"),
            task_memcg=m.group("task"),
        )
    return None


def kernel_lines(text: str) -> Iterator[tuple[int, KernelOomLine]]:
    """``(offset of its line in text, record)`` of each kernel OOM line in ``text`` (many
    lines), in order. Only the lines holding a marker are looked at: a 250 KiB traceback
    costs one regex scan."""
    done = -1
    after = 0  # where the marker before, on the same line, ended
    for m in _MARKERS.finditer(text):
        begin = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        if end < 0:
            end = len(text)
        if begin <= done:
            # a second statement on one line (a paste that flattened the kernel's lines): read
            # from a little before its marker (its scope, its task), not into the one before;
            # one that names no process is a fragment of the statement before, and is left out
            start = max(after, m.start() - _SAME_LINE_BACK)
            after = m.end()
            record = parse_kernel_line(text[start:end])
            if record is not None and record.pid is not None:
                yield begin, record
            continue
        done, after = begin, m.end()
        record = parse_kernel_line(text[begin:end])
        if record is not None:
            yield begin, record

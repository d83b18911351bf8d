"""nohang's journal lines about a victim, read once: who it is, its RSS, the signal sent.

nohang (an earlyoom-like killer on Linux desktops) names its victim in a block, then acts on
it. Two readers need its wording: the classifier (classify/rules.py: the action line in a log
or a paste is a kill) and the kill evidence (kernel/oom.py: the block names the pid that died).
Its wording is nohang's own (src/nohang, 0.2) and the 0.1 journals users posted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["NOHANG_ACTION", "NohangLine", "parse_nohang_line"]

#: nohang's victim block, one journal line each (its ``log()`` prints them under one call,
#: journald splits them): 'Victim status (found in 3ms):' / '  PID:       12297, name: tail,
#: state: S, ...' (0.2) or 'Process with highest badness ...:' / '  PID: 12297, Name: tail, ...'
_NOHANG_VICTIM = re.compile(r"^\s*PID:\s+(?P<pid>\d+), [Nn]ame: (?P<name>[^,\n]*)", re.M)
#: its RSS line in the same block: '  Vm, MiB:   Size: 9349, RSS: 8939, Swap: 384' (0.2) or
#: '  VmRSS:     8939 MiB  (Anon: ...' (0.1)
_NOHANG_RSS = re.compile(
    r"^\s*(?:Vm, MiB:\s+Size: \d+, RSS: (?P<new>\d+)|VmRSS:\s+(?P<old>\d+) MiB)", re.M
)
#: its action on the victim: 'Sending SIGTERM to the victim' (0.2), 'Send SIGKILL to the victim;
#: total response time: 609 ms' (0.1); a soft action running a command is no kill of ours
NOHANG_ACTION = re.compile(r"\bSend(?:ing)? (?P<sig>SIG[A-Z]+) to the victim\b")


@dataclass(frozen=True, slots=True)
class NohangLine:
    """One of nohang's journal lines about a victim: who it is, its RSS, or the signal sent."""

    kind: Literal["victim", "rss", "action"]
    text: str
    pid: int | None = None
    name: str | None = None
    rss_bytes: int | None = None
    signal: str | None = None


def parse_nohang_line(text: str) -> NohangLine | None:
    """A line of nohang's (or nohang-desktop's) victim report, or None (pure)."""
    line = text.rstrip("\n")
    victim = _NOHANG_VICTIM.search(line)
    rss = _NOHANG_RSS.search(line)
    rss_bytes = int(rss.group("new") or rss.group("old")) * 1024 * 1024 if rss else None
    pid = int(victim.group("pid")) if victim else None
    name = victim.group("name").strip() if victim else None
    # (a block logged as one message, through syslog, holds all three)
    if (m := NOHANG_ACTION.search(line)) is not None:
        return NohangLine("action", line, pid, name, rss_bytes, m.group("sig"))
    if victim is not None:
        return NohangLine("victim", line, pid, name, rss_bytes)
    if rss is not None:
        return NohangLine("rss", line, rss_bytes=rss_bytes)
    return None

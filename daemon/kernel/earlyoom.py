"""earlyoom's line announcing a kill, read once: the victim's pid, name, uid, RSS, the signal.

Two readers need its wording: the classifier (classify/rules.py: the line in a log or a paste
is a kill by earlyoom) and the kill evidence (kernel/oom.py: the line names the pid that died).
They once held a pattern each and drifted (the classifier's missed the pre-2019 wording and
``oom_score_adj``), so the wording lives here. It is earlyoom's own across its versions:
``sending SIGTERM to process <pid> uid <uid> "<name>": oom_score <n>, VmRSS <n> MiB`` (older:
``badness``; before 2020 no uid; ``oom_score_adj`` in some), and before 2019 ``killing process
<pid> "<name>" with signal <n>: badness <n>, VmRSS <n> MiB`` (1.0-1.1: ``Killing process
'<name>' with signal <n>, pid: <pid>, badness: <n>, VmRSS: <n> MiB``). A paste cut inside the
VmRSS figure still tells the kill, without its size. Its start-up self-test sends the no-op
signal 0 and is no kill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from signal import SIGKILL, SIGTERM

__all__ = [
    "EARLYOOM_GATES",
    "EARLYOOM_KILL",
    "EarlyoomKill",
    "earlyoom_kill_of",
    "parse_earlyoom_line",
]

#: either wording of the kill line (``parse_earlyoom_line`` tells the self-test apart)
EARLYOOM_KILL = re.compile(
    r"sending (?P<sig>SIG[A-Z]+|\S+(?: \(no-op signal\))?) to process (?P<pid>\d+)"
    r"(?: uid (?P<uid>\d+))? \"(?P<name>[^\"\n]*)\":"
    r"(?: (?:badness|oom_score) (?P<score>-?\d+),)?(?: oom_score_adj -?\d+,)?"
    # (a paste may cut the line inside its VmRSS figure: the kill is still told, its size not)
    r" VmRSS (?:(?P<rss>\d+) MiB|\d*(?=\n|$))"
    r"|killing process (?P<old_pid>\d+) \"(?P<old_name>[^\"\n]*)\" with signal (?P<old_signum>\d+): "
    r"badness -?\d+, VmRSS (?P<old_rss>\d+) MiB"
    # (earlyoom 1.0-1.1: "Killing process 'bash' with signal 15, pid: 5874, badness: 538, VmRSS:
    # 3160 MiB")
    r"|Killing process '(?P<v1_name>[^'\n]*)' with signal (?P<v1_signum>\d+), pid: (?P<v1_pid>\d+),"
    r" badness: -?\d+, VmRSS: (?P<v1_rss>\d+) MiB"
)
#: literals one of which every kill line holds (the classifier's gate before the pattern)
EARLYOOM_GATES = ("sending SIG", "with signal ")

_SIGNAL_NAMES = {int(SIGTERM): "SIGTERM", int(SIGKILL): "SIGKILL"}


@dataclass(frozen=True, slots=True)
class EarlyoomKill:
    """earlyoom's line announcing a kill."""

    pid: int
    signal: str
    name: str
    text: str
    uid: int | None = None
    vm_rss_bytes: int | None = None


def earlyoom_kill_of(m: re.Match[str], text: str) -> EarlyoomKill | None:
    """The kill an ``EARLYOOM_KILL`` match announces, or None for the self-test (pure)."""
    for old in ("old", "v1"):
        if m.group(f"{old}_pid") is not None:
            signum = int(m.group(f"{old}_signum"))
            if signum == 0:
                return None
            return EarlyoomKill(
                pid=int(m.group(f"{old}_pid")),
                signal=_SIGNAL_NAMES.get(signum, str(signum)),
                name=m.group(f"{old}_name"),
                text=text,
                vm_rss_bytes=int(m.group(f"{old}_rss")) * 1024 * 1024,
            )
    sig = m.group("sig")
    if not sig.startswith("SIG"):
        return None  # the start-up self-test with the no-op signal
    return EarlyoomKill(
        pid=int(m.group("pid")),
        signal=sig,
        name=m.group("name"),
        text=text,
        uid=int(m.group("uid")) if m.group("uid") else None,
        vm_rss_bytes=int(m.group("rss")) * 1024 * 1024 if m.group("rss") else None,
    )


def parse_earlyoom_line(text: str) -> EarlyoomKill | None:
    """earlyoom's kill line, or None (pure)."""
    line = text.rstrip("\n")
    for m in EARLYOOM_KILL.finditer(line):
        kill = earlyoom_kill_of(m, line)
        if kill is not None:
            return kill
    return None

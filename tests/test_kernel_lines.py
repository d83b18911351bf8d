"""kernel/lines.py, the one reader of the kernel's OOM-killer lines, and its two users.

The lines are synthetic but shaped as mm/oom_kill.c and mm/memcontrol.c print them (and as
dmesg, ``dmesg -T``, syslog and the journal wrap them); parser tests, not corpus entries. The
last part feeds every line to both users (classify/rules.py for pasted and logged text,
kernel/oom.py for a watched process's death) and checks they state the same facts.
"""

from __future__ import annotations

import io

import pytest

from oom_sentinel.daemon.classify import scan_stream
from oom_sentinel.daemon.classify.rules import classify_record
from oom_sentinel.daemon.kernel.lines import KernelOomLine, kernel_lines, parse_kernel_line
from oom_sentinel.daemon.kernel.oom import (
    LiveReadings,
    LogEntry,
    LogSource,
    ProcessDeath,
    assess_kill,
)

PID = 1234
UNIT = "/system.slice/comfyui.service"
DOCKER = "/docker/4f2c"
KB = " total-vm:48979828kB, anon-rss:23167252kB, file-rss:83700kB, shmem-rss:20kB, UID:1000 pgtables:46968kB oom_score_adj:0"

INVOKED_DMESG = (
    "[ 8274.081234] pt_main_thread invoked oom-killer: "
    "gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0"
)
INVOKED_SPACE_JOURNAL = (
    "Dec 01 10:00:00 box kernel: GC Thread#9 invoked oom-killer: "
    "gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0"
)
INVOKED_KMSG = (
    "pt_main_thread invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
)
SUMMARY_V2 = (
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=comfyui.service,mems_allowed=0,"
    f"oom_memcg={UNIT},task_memcg={UNIT},task=pt_main_thread,pid={PID},uid=1000"
)
SUMMARY_GLOBAL_DMESG = (
    "[240333.375663] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
    "mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/session-2.scope,"
    f"task=pt_main_thread,pid={PID},uid=1000"
)
SUMMARY_SPACE_JOURNAL = (
    "Dec 01 10:00:00 box kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
    f"mems_allowed=0,global_oom,task_memcg=/,task=GC Thread#9,pid={PID},uid=1000"
)
KILLED_V2_JOURNAL = (
    f"Dec 01 10:00:00 box kernel: Memory cgroup out of memory: Killed process {PID} (pt_main_thread)"
    + KB
)
KILLED_V1_DMESG = f"[ 1234.567890] Memory cgroup out of memory: Killed process {PID} (python3)" + KB
KILLED_GLOBAL_T = (
    f"[Sun Mar 30 08:24:01 2025] Out of memory: Killed process {PID} (pt_main_thread)" + KB
)
KILLED_GLOBAL_KMSG = f"Out of memory: Killed process {PID} (pt_main_thread)" + KB
KILLED_BARE_SYSLOG = (
    f"Aug 18 03:19:11 host kernel: Killed process {PID} (python) total-vm:12907828kB, "
    "anon-rss:11500204kB, file-rss:0kB"
)
CHOSEN = f"Out of memory: Kill process {PID} (python) score 931 or sacrifice child"
TASK_IN = f"Task in {DOCKER} killed as a result of limit of {DOCKER}"
REAPED = f"oom_reaper: reaped process {PID} (pt_main_thread), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB"


# -- the parser -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "pid", "comm", "scope"),
    [
        (INVOKED_DMESG, "invoked", None, "pt_main_thread", None),
        (INVOKED_SPACE_JOURNAL, "invoked", None, "GC Thread#9", None),
        (INVOKED_KMSG, "invoked", None, "pt_main_thread", None),
        (SUMMARY_V2, "summary", PID, "pt_main_thread", "memcg"),
        (SUMMARY_GLOBAL_DMESG, "summary", PID, "pt_main_thread", "global"),
        (SUMMARY_SPACE_JOURNAL, "summary", PID, "GC Thread#9", "global"),
        (KILLED_V2_JOURNAL, "killed", PID, "pt_main_thread", "memcg"),
        (KILLED_V1_DMESG, "killed", PID, "python3", "memcg"),
        (KILLED_GLOBAL_T, "killed", PID, "pt_main_thread", "global"),
        (KILLED_BARE_SYSLOG, "killed", PID, "python", None),
        (CHOSEN, "chosen", PID, "python", "global"),
        (TASK_IN, "cgroup", None, None, "memcg"),
        (REAPED, "reaped", PID, "pt_main_thread", None),
    ],
)
def test_each_line_shape_gives_its_kind_pid_thread_name_and_scope(
    text: str, kind: str, pid: int | None, comm: str | None, scope: str | None
) -> None:
    line = parse_kernel_line(text)
    assert line is not None
    assert (line.kind, line.pid, line.comm, line.scope) == (kind, pid, comm, scope)


def test_the_kernels_text_starts_after_any_prefix() -> None:
    for text, first in [
        (INVOKED_SPACE_JOURNAL, "GC Thread#9 invoked"),
        (INVOKED_DMESG, "pt_main_thread invoked"),
        (KILLED_GLOBAL_T, "Out of memory: Killed"),
        (SUMMARY_GLOBAL_DMESG, "oom-kill:constraint="),
        (f"they wrote `{CHOSEN}` twice", "Out of memory: Kill process"),
    ]:
        line = parse_kernel_line(text)
        assert line is not None and line.text[line.start :].startswith(first), text


def test_the_summary_names_constraint_cgroups_and_uid() -> None:
    line = parse_kernel_line(SUMMARY_V2)
    assert line is not None
    assert (line.constraint, line.oom_memcg, line.task_memcg, line.uid) == (
        "CONSTRAINT_MEMCG",
        UNIT,
        UNIT,
        1000,
    )
    glob = parse_kernel_line(SUMMARY_GLOBAL_DMESG)
    assert glob is not None and glob.oom_memcg is None and glob.constraint == "CONSTRAINT_NONE"


def test_a_task_name_with_a_comma_ends_at_the_pid() -> None:
    line = parse_kernel_line(
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,0-1,"
        "global_oom,task_memcg=/,task=a,b c,pid=77,uid=0"
    )
    assert line is not None and (line.comm, line.pid, line.scope) == ("a,b c", 77, "global")


def test_kill_line_figures_are_bytes() -> None:
    line = parse_kernel_line(KILLED_V2_JOURNAL)
    assert line is not None
    assert line.bytes_of("anon-rss") == 23167252 * 1024
    assert line.bytes_of("pgtables") == 46968 * 1024
    assert line.rss_bytes == (23167252 + 83700 + 20) * 1024
    assert line.bytes_of("swapents") is None
    reaped = parse_kernel_line(REAPED)
    assert reaped is not None and reaped.rss_bytes == 0


def test_the_chosen_line_carries_its_score_and_a_bare_kill_process_is_nobodys() -> None:
    line = parse_kernel_line(CHOSEN)
    assert line is not None and line.score == 931
    assert parse_kernel_line("Kill process 12 (bash) now, please") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "oom-kill",
        "usb 1-1: new high-speed USB device number 5",
        "systemd-coredump[91686]: Process 87058 (pt_main_thread) of user 0 terminated abnormally",
        "Killed",
    ],
)
def test_other_lines_are_none(text: str) -> None:
    assert parse_kernel_line(text) is None


def test_kernel_lines_finds_each_line_of_a_paste_once_with_its_offset() -> None:
    text = "\n".join(["some words", INVOKED_KMSG, "  call trace", SUMMARY_V2, KILLED_GLOBAL_KMSG])
    found = list(kernel_lines(text))
    assert [k.kind for _, k in found] == ["invoked", "summary", "killed"]
    for at, k in found:
        assert text[at:].startswith(k.text)


# -- both users state the same facts ------------------------------------------------------------------


def _rules_facts(text: str) -> tuple[int | None, str | None, str | None] | None:
    """(pid, name, scope) the classifier gives a line, scope in the parser's words."""
    event = classify_record(text)
    if event is None:
        return None
    extra = dict(event.extra)
    assert event.killer == "kernel"
    name = extra.get("process_name", extra.get("invoked_by"))
    scope = {"cgroup": "memcg", "system": "global", None: None}[extra.get("scope")]
    return event.killed_pid, name, scope


def _readings() -> LiveReadings:
    return LiveReadings(pid=PID, time_s=1000.0, counters_error="the process has no memory cgroup")


def _oom_evidence(*texts: str) -> tuple[bool, str | None, str | None]:
    """(the kill of PID is certain, constraint, cgroup) from kernel/oom.py on kmsg lines."""
    death = ProcessDeath(PID, died_at_s=1006.0, signal=9, comm="python3")
    source = LogSource("kmsg", "read", entries=tuple(LogEntry(t, 1005.0, "kernel") for t in texts))
    ev = assess_kill(death, _readings(), _readings(), [source])
    certain = (ev.killer, ev.confidence) == ("kernel", "certain")
    return certain, ev.constraint, ev.cgroup


KILL_LINES = [
    (SUMMARY_V2, "pt_main_thread", "memcg"),
    (SUMMARY_GLOBAL_DMESG, "pt_main_thread", "global"),
    (SUMMARY_SPACE_JOURNAL, "GC Thread#9", "global"),
    (KILLED_V2_JOURNAL, "pt_main_thread", "memcg"),
    (KILLED_V1_DMESG, "python3", "memcg"),
    (KILLED_GLOBAL_T, "pt_main_thread", "global"),
    (KILLED_GLOBAL_KMSG, "pt_main_thread", "global"),
    (KILLED_BARE_SYSLOG, "python", None),
]


@pytest.mark.parametrize(("text", "comm", "scope"), KILL_LINES)
def test_a_kill_line_gives_the_same_pid_name_and_scope_through_both_paths(
    text: str, comm: str, scope: str | None
) -> None:
    parsed = parse_kernel_line(text)
    assert parsed is not None
    # the classifier: the victim's pid and thread name, the scope only where the line says it
    assert _rules_facts(text) == (PID, comm, scope) == (parsed.pid, parsed.comm, parsed.scope)
    # the kill evidence: the same pid is ComfyUI's (its comm "python3" is never compared),
    # and a memory cgroup's kill is named as one
    certain, constraint, _ = _oom_evidence(text)
    assert certain
    assert (constraint == "CONSTRAINT_MEMCG") == (scope == "memcg")


@pytest.mark.parametrize("text", [INVOKED_DMESG, INVOKED_SPACE_JOURNAL, INVOKED_KMSG])
def test_an_invoked_line_names_the_allocating_task_and_no_victim_on_both_paths(text: str) -> None:
    parsed = parse_kernel_line(text)
    assert parsed is not None
    assert _rules_facts(text) == (None, parsed.comm, None)
    assert _oom_evidence(text)[0] is False


@pytest.mark.parametrize("text", [CHOSEN, REAPED])
def test_a_chosen_or_reaped_line_alone_is_no_kill_of_that_pid_on_both_paths(text: str) -> None:
    """``Kill process N … or sacrifice child`` may end in a child's death; the reaper line
    follows the kill line, which is the one that counts (counted once, not twice)."""
    facts = _rules_facts(text)
    assert facts is None or facts[0] is None
    assert _oom_evidence(text)[0] is False


def test_a_kill_of_another_pid_named_python3_is_not_comfyuis() -> None:
    other = f"Out of memory: Killed process {PID + 1} (python3)" + KB
    assert _oom_evidence(other)[0] is False
    assert _rules_facts(other) == (PID + 1, "python3", "global")


def test_the_older_kernels_memcg_report_names_the_cgroup_on_both_paths() -> None:
    """Before 4.19 no ``oom-kill:`` line: ``Task in … killed as a result of limit of …``."""
    killed = f"Memory cgroup out of memory: Killed process {PID} (pt_main_thread)" + KB
    certain, constraint, cgroup = _oom_evidence(INVOKED_KMSG, TASK_IN, killed)
    assert (certain, constraint, cgroup) == (True, "CONSTRAINT_MEMCG", DOCKER)
    assert _rules_facts("\n".join([TASK_IN, f"Killed process {PID} (pt_main_thread)" + KB])) == (
        PID,
        "pt_main_thread",
        "memcg",
    )


def test_the_older_kernels_pair_with_a_sacrificed_child_stays_two_kills_apart() -> None:
    """The chosen parent and the killed child: the classifier folds the pair into one event
    for the child, and the kill evidence does not blame the parent."""
    child = PID + 7
    text = f"{CHOSEN}\nKilled process {child} (worker)" + KB + "\n"
    events = [f.event for f in scan_stream(io.BytesIO(text.encode()))]
    assert [(e.killed_pid, dict(e.extra)["process_name"]) for e in events] == [(child, "worker")]
    assert _oom_evidence(CHOSEN, f"Killed process {child} (worker)" + KB)[0] is False


def test_records_are_frozen_values() -> None:
    line = parse_kernel_line(INVOKED_KMSG)
    assert line == KernelOomLine("invoked", INVOKED_KMSG, 0, comm="pt_main_thread")


def test_a_line_of_garbage_numbers_or_length_never_raises() -> None:
    huge = "9" * 5000  # int() refuses more than 4300 digits
    line = parse_kernel_line(f"Out of memory: Killed process {huge} (x) anon-rss:{huge}kB")
    assert line is not None and line.pid is None and line.kib == ()
    summary = parse_kernel_line(f"oom-kill:constraint=CONSTRAINT_NONE,task=x,pid={huge},uid=1")
    assert summary is not None and summary.pid is None and summary.uid == 1
    # far from the line's start, the name is the last word (no prefix to tell where it began)
    far = parse_kernel_line("x" * 100 + " GC Thread#9 invoked oom-killer: gfp_mask=0x0")
    assert far is not None and far.comm == "Thread#9"


def test_rhel6_kill_line_with_its_uid_before_the_name() -> None:
    line = parse_kernel_line(
        "Aug 11 16:28:11 kernel: Killed process 3080, UID 0, (forward) total-vm:1429064kB, anon-rss:1130444kB, file-rss:136kB"
    )
    assert line is not None and (line.kind, line.pid, line.comm) == ("killed", 3080, "forward")
    assert line.bytes_of("anon-rss") == 1130444 * 1024


def test_two_statements_flattened_onto_one_line_are_both_read() -> None:
    text = (
        "logs: Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child "
        "Killed process 5372 (mongod), UID 0, total-vm:2539052kB, anon-rss:2117096kB, file-rss:0kB\n"
    )
    found = [(r.kind, r.pid, r.comm) for _, r in kernel_lines(text)]
    assert found == [("chosen", 5372, "mongod"), ("killed", 5372, "mongod")]
    # one statement on its line is read once
    single = "Out of memory: Killed process 12 (python) total-vm:1kB, anon-rss:1kB\n"
    assert [(r.kind, r.pid) for _, r in kernel_lines(single)] == [("killed", 12)]

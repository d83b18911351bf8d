"""Read an out-of-memory failure out of log text or a ComfyUI ``execution_error``: which pool ran
out, on which backend, by how much, in which node, and whether ComfyUI recovered.

Everything here is pure and never raises: the input is whatever a log, a user's paste or a
websocket handed us. The rules follow the texts the producers really print (comfyui-facts.md
§2 and §11, torch's allocator messages across versions, the kernel's and earlyoom's kill lines)
and are checked against a labelled corpus of excerpts users posted (tests/corpus/).

A rule fires on a *message structure*, never on the bare words "out of memory": prose such as
"it gets out of memory quick" or a node called ``OutOfMemoryGuard`` stays negative.

Every rule needs one of ``NEEDLES`` in the text. That is the cheap prefilter the file scanner
runs over raw bytes before anything is decoded or split into lines, and because
``classify_record`` checks the same needles first, the prefilter can never hide an event.
Both prefilters (``PREFILTERS``: one Aho-Corasick pass when ``ahocorasick-rs`` is installed,
else one ``bytes.find`` pass per needle) report every line that holds one of these needles,
and nothing else, so the scanner's windows are the same whichever runs.

Units: torch (CUDA/HIP/XPU ``format_size``), MPS (``GB``/``MB`` computed with 1024), numpy
(``MiB``/``GiB``), the kernel (``kB``) and earlyoom (``MiB``) all print binary multiples, so
every K/M/G here is 1024-based.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import re
import stat
import sys
import tempfile
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any, BinaryIO

from oom_sentinel.daemon.events import Backend, OomEvent, OtherProcess, Pool
from oom_sentinel.daemon.logformat import split_prefix, strip_ansi
from oom_sentinel.daemon.records import Record, RecordAssembler

__all__ = [
    "DEFAULT_PREFILTER",
    "LOOKBEHIND_LINES",
    "MERGE_GAP_LINES",
    "NEEDLES",
    "PARALLEL_RANGE_BYTES",
    "PREFILTERS",
    "Finding",
    "Prefilter",
    "classify_execution_error",
    "classify_record",
    "has_needle",
    "iter_findings",
    "parse_size",
    "scan_lines",
    "scan_stream",
]

#: Substrings at least one of which every detectable OOM text contains (see module docstring).
#: Chosen for the speed of ``bytes.find``: long or upper-case needles skip fastest.
NEEDLES: tuple[str, ...] = (
    "emory",  # out of memory, MemoryError, not enough memory, video memory, Memory cgroup
    "Allocation on device",  # cudaMallocAsync
    "_STATUS_",  # CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_NOT_ALLOCATED, ...
    "OOM",  # Got an OOM, OOMed, the OOM killer
    "Killed",  # bare Killed, Killed process
    "rror 1455",  # os error 1455, WinError 1455 (the paging file, in any language)
    "sending SIG",  # earlyoom
    "nvalid buffer",  # MPS: Invalid buffer size: 8.21 GB (no memory words at all)
    "oom-kill",  # the kernel: pt_main_thread invoked oom-killer, oom-kill:constraint=...
)
_NEEDLES_B: tuple[bytes, ...] = tuple(n.encode() for n in NEEDLES)

#: Two events this many lines apart or closer may be one failure seen twice (ComfyUI's
#: ``!!! Exception`` header and its traceback, the traceback and ``Got an OOM`` after a
#: memory summary table, a shell's ``Killed`` and the kernel's line).
MERGE_GAP_LINES = 80

_K = 1024
_UNITS: dict[str, int] = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": _K,
    "kb": _K,
    "kib": _K,
    "m": _K**2,
    "mb": _K**2,
    "mib": _K**2,
    "g": _K**3,
    "gb": _K**3,
    "gib": _K**3,
    "t": _K**4,
    "tb": _K**4,
    "tib": _K**4,
    "p": _K**5,
    "pb": _K**5,
    "pib": _K**5,
}
_SIZE = r"(\d+(?:,\d{3})*(?:\.\d*)?)\s?(bytes|byte|[KMGTP]i?B|kB|B)\b"


def parse_size(number: str, unit: str) -> int | None:
    """``("2.00", "GiB")`` → 2147483648; None when it is not a size."""
    try:
        value = float(number.replace(",", ""))
    except ValueError:
        return None
    factor = _UNITS.get(unit.lower())
    if factor is None or value < 0 or value > 1e21:
        return None
    return round(value * factor)


def has_needle(text: str) -> bool:
    """True when ``text`` could hold an OOM (the scanner's prefilter, on str)."""
    return (  # spelled out: about three times faster than any() over NEEDLES
        "emory" in text
        or "OOM" in text
        or "Killed" in text
        or "Allocation on device" in text
        or "_STATUS_" in text
        or "rror 1455" in text
        or "sending SIG" in text
        or "nvalid buffer" in text
        or "oom-kill" in text
    )


# --------------------------------------------------------------------------------------------
# message rules
# --------------------------------------------------------------------------------------------

_M = re.MULTILINE
_RX_KERNEL_KILLED = re.compile(r"\bKilled process (\d+) \(([^)\n]*)\)")
_RX_KERNEL_KILL = re.compile(
    r"(Memory cgroup out of memory|Out of memory(?: \([\w ]+\))?): Kill(?:ed)? process (\d+) \(([^)\n]*)\)"
)
_RX_KERNEL_FIELD = re.compile(r"\b(total-vm|anon-rss|file-rss|shmem-rss):\s?([\d,]+)\s?kB")
_RX_EARLYOOM = re.compile(
    r'sending (SIGTERM|SIGKILL) to process (\d+) uid (\d+) "([^"\n]*)":'
    r"(?: (?:oom_score|badness) (-?\d+),)? VmRSS (\d+) MiB"
)
_RX_OOMD = re.compile(r"\bKilled (/\S+) due to (?:memory|swap)")
_RX_SYSTEMD_UNIT = re.compile(
    r"([\w@.\-]+): A process of this unit has been killed by the OOM killer"
)
_RX_BASH_KILLED = re.compile(r"\bline \d+:\s+(\d+) Killed(?:\s|$)", _M)
_RX_BARE_KILLED = re.compile(r"^(?:\[\d+\][+-]?\s+)?Killed(?:\s{2,}\S.*)?\s*$", _M)

_RX_MPS = re.compile(r"MPS backend out of memory(?: \(MPS allocated|\.|\s*$)", _M)
_RX_TORCH_DEVICE = re.compile(r"(CUDA|HIP|XPU) out of memory\.(?= Tried to allocate|\s*$)", _M)
_RX_TORCH_DEVICE_LINE = re.compile(
    r"^(?:\S+Error: |!!! Exception during processing !!! )?(CUDA|HIP|XPU) out of memory\b", _M
)
_RX_EXCEED = re.compile(r"Allocation on device (\d+) would exceed allowed memory")
_RX_ALLOC_ON_DEVICE = re.compile(
    r"(?:^|OutOfMemoryError: |!!! |\*\* |: )Allocation on device\s*$|OutOfMemoryError: Allocation on device\b",
    _M,
)
_RX_CUDA_ERROR_OOM = re.compile(
    r"\b(CUDA|HIP) (?:driver )?error: out of memory|\b(cuda|hip)ErrorMemoryAllocation\b|hipErrorOutOfMemory"
)
_RX_LIB_ALLOC = re.compile(
    r"\b(CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT|HIPBLAS|ROCBLAS|MIOPEN|HIPSOLVER)_STATUS_(?:ALLOC_FAILED|NOT_ALLOCATED)\b",
    re.IGNORECASE,
)
_RX_DIRECTML = re.compile(
    r"(?:Could not allocate tensor with (\d+) bytes\. )?There is not enough GPU video memory available"
)
_RX_PAGEFILE = re.compile(r"(?:os error|WinError) 1455\b")
_RX_CPU_ALLOC = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate (\d+) ?(bytes|GB)"
)
_RX_MMAP = re.compile(r"unable to mmap (\d+) bytes from file [\s\S]{0,400}?Cannot allocate memory")
_RX_NUMPY = re.compile(r"Unable to allocate (\d+(?:\.\d*)?) ?([KMGTP]?i?B|bytes) for an array")
_RX_GOT_OOM = re.compile(r"Got an OOM, unloading all loaded models")
_RX_TIPS = re.compile(r"This error means you ran out of memory on your GPU")
#: MPSAllocator's refusal of a single buffer over the device's limit; torch formats the size
#: with two decimals (``8.21 GB``; newer torch ``19.38 GiB``), which keeps other programs'
#: "invalid buffer size: 64" out
_RX_MPS_BUFFER = re.compile(
    r"(?:\b([A-Za-z_]\w*Error): ?)?Invalid buffer size: ?(\d+\.\d\d) ?([KMG]i?B)\b"
)
#: the kernel's first OOM line names the allocating task, which for torch is pt_main_thread
_RX_KERNEL_INVOKED = re.compile(r"\b(\S+) invoked oom-killer: ")
_RX_KERNEL_OOM_KILL_TASK = re.compile(r"\boom-kill:constraint=\S*?,task=([^,\s]+),pid=(\d+)")
#: an uncatchable C++ exception ending the process (``terminate called after throwing an
#: instance of 'c10::AcceleratorError'``)
_RX_CXX_TERMINATE = re.compile(r"instance of '([\w:]+)'")
#: custom-node packs' own OOM stops and hints, worded as their sources print them (the pack's
#: text is often all a paste has: VideoHelperSuite raises it instead of a torch message, and
#: SUPIR prints its hint before re-raising, so a cut traceback may end before torch's line)
_RX_VHS_LIMIT = re.compile(
    r"Memory limit hit after loading (\d+) frames|Meta Batch set to (\d+) frames but only (\d+) can fit in memory"
)
_RX_SUPIR_HINT = re.compile(r"too large of an image or batch_size for SUPIR was used")
#: rule → the pack that printed it
_NODE_PACK_RULES = {
    "vhs-memory-limit": "ComfyUI-VideoHelperSuite",
    "supir-oom-hint": "ComfyUI-SUPIR",
}
_RX_XPU_4GB = re.compile(r"can NOT allocate memory block with size larger than 4GB")

_RX_SOFT: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "soft-vae-tiled",
        re.compile(
            r"Ran out of memory when regular (?:VAE )?(?:de|en)coding, retrying with tiled VAE (?:de|en)coding"
        ),
    ),
    (
        "soft-split-attention-empty-cache",
        re.compile(r"out of memory error, emptying cache and trying again"),
    ),
    (
        "soft-split-attention-steps",
        re.compile(r"out of memory error, increasing steps and trying again(?: (\d+))?"),
    ),
    (
        "soft-vae-slice-attention",
        re.compile(r"scaled_dot_product_attention OOMed: switched to slice attention"),
    ),
    (
        "soft-subquadratic-softmax",
        re.compile(
            r"ran out of memory while running softmax in\s+_get_attention_scores_no_kv_chunking, trying slower in place softmax instead"
        ),
    ),
)

# exception lines: ``torch.OutOfMemoryError: CUDA out of memory. ...``, ``MemoryError``
_RX_EXC_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))(?::[ \t]?(.*))?$", _M
)
#: a field of ComfyUI's Error Report in any language: ``- **<label>:** <value>``, one per line
#: or, in a paste that lost its newlines, one after another on a line
_RX_ANY_FIELD = re.compile(
    r"(?:^|\s)-\s*\*\*([^*\n]{1,40}?):\*\*[ \t]*(.*?)(?=\s+-\s*\*\*[^*\n]{1,40}?:\*\*|\s+##|$)", _M
)
_RX_EXC_TYPE_VALUE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)$")
_RX_NODE_ID_VALUE = re.compile(r"^\d+(?::\d+)*$")
#: ComfyUI's old error dialog: the node on its own line, or (an issue title) the message after it
_RX_DIALOG = re.compile(r"^Error occurred when executing ([^:\n]+?):(?:[ \t]|$)", _M)
_RX_NODE_COLON = re.compile(r"^([A-Za-z][\w\-]{1,80}) : ")
_RX_NODE_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{2,80}$")
_NOT_NODES = frozenset(
    {"Traceback", "Killed", "Exception", "Error", "Warning", "Logs", "Details", "Other"}
)
_HEADER = "!!! Exception during processing !!!"
_QUOTES = frozenset("\"'`")

# numbers in torch's allocator messages (new style since torch 2.1, old style before, XPU both)
_RX_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_RX_GPU_INDEX = re.compile(r"\bGPU\s+(\d+)\b")
_RX_TOTAL = re.compile(r"total capac(?:i)?ty of " + _SIZE + r"|" + _SIZE + r" total capacity")
_RX_FREE = re.compile(r"of which " + _SIZE + r" is free|; " + _SIZE + r" free[;)]")
_RX_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_RX_THIS_PROCESS = re.compile(r"this process has " + _SIZE + r" memory in use")
_RX_ALLOCATED = re.compile(
    r"Of the allocated memory "
    + _SIZE
    + r" is allocated by PyTorch|"
    + _SIZE
    + r" already allocated"
)
_RX_PRIVATE = re.compile(r"with " + _SIZE + r" allocated in private pools")
_RX_RESERVED_UNALLOC = re.compile(
    # torch>=2.1 says "and X is reserved by PyTorch but unallocated"; "is reserved" only ever
    # introduces that figure, so a message cut right after it still gives it
    r"and " + _SIZE + r" is reserved\b|" + _SIZE + r" cached\)"
)
_RX_RESERVED = re.compile(_SIZE + r"\s+reserved in total\b")  # \s+: a message hard-wrapped here
_RX_ALLOWED = re.compile(r"[;.] " + _SIZE + r" allowed;")  # torch>=2.1: "... is free. X allowed;"
_RX_EX_ALLOCATED = re.compile(r"Currently allocated\s*:\s*" + _SIZE)
_RX_EX_REQUESTED = re.compile(r"Requested\s*:\s*" + _SIZE)
_RX_EX_LIMIT = re.compile(r"Device limit\s*:\s*" + _SIZE)
_RX_EX_FREE = re.compile(r"Free \(according to CUDA\)\s*:\s*" + _SIZE)
_RX_MPS_ALLOCATED = re.compile(r"MPS allocated: " + _SIZE)
_RX_MPS_OTHER = re.compile(r"other allocations: " + _SIZE)
_RX_MPS_MAX = re.compile(r"max allowed: " + _SIZE)
_RX_MPS_TRIED = re.compile(r"Tried to allocate " + _SIZE + r" on private pool")

#: another process holds at least this much GPU memory → "other processes named" (see events)
_OTHERS_MIN_BYTES = 512 * _K**2


def _size(m: re.Match[str] | None, group: int = 1) -> int | None:
    """Size from the first matched (number, unit) group pair at or after ``group``."""
    if m is None:
        return None
    groups = m.groups()
    for i in range(group - 1, len(groups) - 1, 2):
        if groups[i] is not None and groups[i + 1] is not None:
            return parse_size(groups[i], groups[i + 1])
    return None


@dataclass(frozen=True, slots=True)
class _Found:
    event: OomEvent
    #: index of the line (within the record) that carries the evidence
    line_index: int
    #: the record is ComfyUI's one-line ``!!! Exception during processing !!!`` header only
    header_only: bool = False


def _normalize(text: str) -> list[str]:
    """Lines of a record with wrapper prefixes, ANSI codes and markdown quote marks removed."""
    lines = []
    for raw in text.split("\n"):
        if raw[:1] in (" ", "\t"):  # no prefix starts with whitespace: a traceback body line
            lines.append(raw.rstrip("\r"))
            continue
        msg = split_prefix(raw.rstrip("\r")).message
        if msg.startswith(">"):
            msg = msg[2:] if msg.startswith("> ") else msg[1:]
        if msg[:1] in _QUOTES:
            msg = msg.lstrip("\"'`").lstrip()
        lines.append(msg)
    return lines


def _line_of(starts: list[int], pos: int) -> int:
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo


def classify_record(text: str) -> OomEvent | None:
    """The OOM event in one log record (a line and its continuation lines), or None.

    Never raises: a record that makes a rule trip over itself is treated as no OOM.
    """
    try:
        found = _classify(text)
    except Exception:  # the contract is "never raises"; _classify is fuzzed without this net
        return None
    return found.event if found is not None else None


#: normalized records up to this long are remembered (``_classify_normalized``)
_MEMO_CHARS = 8192


def _classify(text: str) -> _Found | None:
    if not isinstance(text, str) or not has_needle(text):
        return None
    if "\x1b" in text:
        text = strip_ansi(text)
    lines = _normalize(text)
    key = "\n".join(lines)  # lines hold no newline: the join is one-to-one
    if len(key) <= _MEMO_CHARS:
        return _classify_normalized(key)
    return _classify_lines(lines)


@functools.lru_cache(maxsize=256)
def _classify_normalized(key: str) -> _Found | None:
    """``_classify_lines`` of ``key.split("\\n")``, remembered: what follows normalization is a
    pure function of the normalized lines, and an OOM storm repeats the same record with only
    its timestamps changed (``Got an OOM, unloading all loaded models.``, a soft OOM's retry
    line, the same traceback). At most 256 × ``_MEMO_CHARS`` characters are held."""
    return _classify_lines(key.split("\n"))


def _classify_lines(lines: list[str]) -> _Found | None:
    """``_classify`` of a record already split into normalized lines (``_normalize``)."""
    # The rules read the record's "focus": every line that does not start with whitespace,
    # plus indented lines holding a needle. Traceback frames (most of a big record) drop out,
    # and no OOM text is lost: messages, exception lines, report fields and the numbers of
    # torch's multi-line messages all start at column 0.
    focus: list[int] = []
    indented: list[int] = []
    for i, line in enumerate(lines):
        (indented if line[:1] in (" ", "\t") else focus).append(i)
    # one needle test over all traceback frames together (they rarely hold one), then per line
    if indented and has_needle("\n".join([lines[i] for i in indented])):
        focus = sorted(focus + [i for i in indented if has_needle(lines[i])])
    flines = [lines[i] for i in focus]
    body = "\n".join(flines)
    starts = [0]
    for line in flines[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    # a pasted Error Report is parsed once, for the rules and for its fields
    report = _report(body)
    rule, pool, backend, pos, recovered = _detect(body, report)
    if rule is None:
        restored = _restore_case(body)
        if restored is None:
            return None
        report = _report(restored)
        rule, pool, backend, pos, recovered = _detect(restored, report)
        if rule is None:
            return None
        # case-only edits: every position and line length stays the same
        body = restored
        flines = body.split("\n")
        lines = list(lines)
        for i, line in zip(focus, flines, strict=True):
            lines[i] = line
    fidx = _line_of(starts, pos)
    idx = focus[fidx]
    fields: dict[str, Any] = {}
    extra: list[tuple[str, Any]] = []
    _numbers(rule, body, fields, extra)

    exc_type, exc_msg = _exception_of(flines, fidx)
    if exc_type is None:
        exc_type = _inline_exception_type(rule, body)
    node_type = node_id = None
    if report is not None:
        node_type, node_id, exc_type = report.node_type, report.node_id, report.exception_type
    if node_type is None:
        node_type = _dialog_node(body) or _colon_node(lines[idx])
    if node_type is None and idx > 0:
        prev = lines[idx - 1].strip()
        if _is_node_ident(prev):
            node_type = prev

    report_msg = report.message if report is not None else None
    message = _message_of(lines[idx], pos - starts[fidx], exc_msg, report_msg)
    if backend is Backend.UNKNOWN:
        backend = _backend_from_text(body, report_msg)
    if rule == "cuda-error-oom" and pinned_evidence("\n".join(lines)):
        pool = Pool.RAM
        extra.append(("host_memory", "pinned"))
    if pool is Pool.GPU and fields.get("requested_bytes") is not None:
        ru = fields.get("reserved_unallocated_bytes")
        if ru is not None and ru >= fields["requested_bytes"]:
            pool = Pool.GPU_FRAGMENTATION
    others = fields.pop("_others", ())
    named = bool(others)
    total, free, used = (
        fields.get("total_bytes"),
        fields.get("free_bytes"),
        fields.get("process_used_bytes"),
    )
    if not named and total is not None and free is not None and used is not None:
        outside = total - free - used
        if outside >= _OTHERS_MIN_BYTES:
            named = True
            extra.append(("outside_process_bytes", outside))
    if rule == "comfy-got-oom":
        extra.append(("comfy_unloaded_models", True))
    if rule in _NODE_PACK_RULES:
        extra.insert(0, ("node_pack", _NODE_PACK_RULES[rule]))
    event = OomEvent(
        pool=pool,
        backend=backend,
        recovered=recovered,
        message=message,
        exception_type=exc_type,
        node_type=node_type,
        node_id=node_id,
        other_processes=tuple(others),
        other_process_named=named,
        rule=rule,
        extra=tuple(extra),
        **fields,
    )
    header_only = lines[0].startswith(_HEADER) and len([ln for ln in lines if ln.strip()]) == 1
    return _Found(event, idx, header_only)


#: the words of the messages, in their printed case: a paste that was lower-cased (chat apps,
#: some forums) is matched again after these are put back; every edit changes case only
_CASED_WORDS: tuple[str, ...] = (
    "CUDA out of memory",
    "HIP out of memory",
    "XPU out of memory",
    "MPS backend out of memory",
    "MPS allocated",
    "CUDA error: out of memory",
    "Tried to allocate",
    "Of the allocated memory",
    "allocated by PyTorch",
    "reserved by PyTorch",
    "non-PyTorch",
    "Allocation on device",
    "Currently allocated",
    "Requested",
    "Device limit",
    "Free (according to CUDA)",
    "DefaultCPUAllocator",
    "OutOfMemoryError",
    "RuntimeError",
    "Invalid buffer size",
)
_RX_CASED_WORDS = re.compile("|".join(re.escape(w) for w in _CASED_WORDS), re.IGNORECASE)
_CASED = {w.lower(): w for w in _CASED_WORDS}
_RX_LOWER_UNIT_OR_GPU = re.compile(r"(?<=\d)( ?)([kmgtp])(i?)b\b|\bgpu(?= \d)")
#: a lower-cased record holds one of these
_LOWER_SIGNS = ("out of memory", "allocation on device", "invalid buffer size", "outofmemory")


def _restore_case(body: str) -> str | None:
    """``body`` with the messages' words in their printed case, or None when it has none of
    them in another case (see ``_CASED_WORDS``)."""
    low = body.lower()
    if not any(sign in low for sign in _LOWER_SIGNS):
        return None
    out = _RX_CASED_WORDS.sub(lambda m: _CASED[m.group(0).lower()], body)
    out = _RX_LOWER_UNIT_OR_GPU.sub(
        lambda m: (
            "GPU" if m.group(0) == "gpu" else f"{m.group(1)}{m.group(2).upper()}{m.group(3)}B"
        ),
        out,
    )
    return out if out != body else None


def _find(rx: re.Pattern[str], body: str, *gates: str) -> re.Match[str] | None:
    """``rx.search(body)``, run only when one of the literal ``gates`` is in ``body``.

    A record can be a 250 KiB traceback; a substring test is far cheaper than a regex search,
    and every rule below has a literal it cannot match without.
    """
    for gate in gates:
        if gate in body:
            return rx.search(body)
    return None


def _detect(body: str, report: _Report | None) -> tuple[str | None, Pool, Backend, int, bool]:
    """(rule, pool, backend, match position, recovered) of the strongest rule, or rule None.

    ``report`` is ``_report(body)``: the fields of a pasted Error Report, if ``body`` is one."""
    m = _find(_RX_KERNEL_KILL, body, "Kill") or _find(_RX_KERNEL_KILLED, body, "Killed process")
    if m:
        return "kernel-oom-kill", Pool.KILLED_BY_OS, Backend.CPU, m.start(), False
    m = _find(_RX_KERNEL_OOM_KILL_TASK, body, "oom-kill:") or _find(
        _RX_KERNEL_INVOKED, body, "invoked oom-killer"
    )
    if m:
        return "kernel-oom-kill", Pool.KILLED_BY_OS, Backend.CPU, m.start(), False
    m = _find(_RX_EARLYOOM, body, "sending SIG")
    if m:
        return "earlyoom-kill", Pool.KILLED_BY_OS, Backend.CPU, m.start(), False
    m = _find(_RX_OOMD, body, "Killed /")
    if m:
        return "systemd-oomd-kill", Pool.KILLED_BY_OS, Backend.CPU, m.start(), False
    m = _find(_RX_SYSTEMD_UNIT, body, "OOM killer")
    if m:
        return "systemd-oom-kill", Pool.KILLED_BY_OS, Backend.CPU, m.start(), False
    m = _find(_RX_MPS, body, "MPS backend out of memory")
    if m:
        return "mps-oom", Pool.UNIFIED_MPS, Backend.MPS, m.start(), False
    m = _find(_RX_MPS_BUFFER, body, "nvalid buffer")
    if m:
        return "mps-invalid-buffer", Pool.UNIFIED_MPS, Backend.MPS, m.start(), False
    m = _find(_RX_TORCH_DEVICE, body, " out of memory") or _find(
        _RX_TORCH_DEVICE_LINE, body, " out of memory"
    )
    if m:
        dev = m.group(1)
        backend = {"CUDA": Backend.CUDA, "HIP": Backend.ROCM, "XPU": Backend.XPU}[dev]
        return f"{dev.lower()}-oom", Pool.GPU, backend, m.start(1), False
    m = _find(_RX_EXCEED, body, "would exceed allowed memory")
    if m:
        return "cuda-exceed-allowed", Pool.GPU, Backend.CUDA, m.start(), False
    m = _find(_RX_ALLOC_ON_DEVICE, body, "Allocation on device")
    if m:
        pos = body.find("Allocation on device", m.start())
        return "cuda-alloc-on-device", Pool.GPU, Backend.CUDA, pos, False
    m = _find(
        _RX_CUDA_ERROR_OOM,
        body,
        "error: out of memory",
        "ErrorMemoryAllocation",
        "ErrorOutOfMemory",
    )
    if m:
        rocm = (m.group(1) or m.group(2) or "hip").lower() == "hip"
        return "cuda-error-oom", Pool.GPU, Backend.ROCM if rocm else Backend.CUDA, m.start(), False
    m = _find(_RX_LIB_ALLOC, body, "_STATUS_", "_status_", "_Status_")
    if m:
        lib = m.group(1).upper()
        backend = Backend.ROCM if lib.startswith(("HIP", "ROC", "MIOPEN")) else Backend.CUDA
        return f"{lib.lower()}-alloc-failed", Pool.GPU, backend, m.start(), False
    m = _find(_RX_DIRECTML, body, "not enough GPU video memory")
    if m:
        return "directml-oom", Pool.GPU, Backend.DIRECTML, m.start(), False
    m = _find(_RX_PAGEFILE, body, "rror 1455")
    if m:
        return "windows-pagefile", Pool.SWAP_PAGEFILE, Backend.CPU, m.start(), False
    m = _find(_RX_CPU_ALLOC, body, "DefaultCPUAllocator")
    if m:
        return "cpu-allocator", Pool.RAM, Backend.CPU, m.start(), False
    m = _find(_RX_MMAP, body, "unable to mmap")
    if m:
        return "mmap-enomem", Pool.RAM, Backend.CPU, m.start(), False
    m = _find(_RX_VHS_LIMIT, body, "Memory limit hit", "can fit in memory")
    if m:
        return "vhs-memory-limit", Pool.RAM, Backend.CPU, m.start(), False
    exc = _oom_exception_line(body) if "MemoryError" in body else None
    if exc is not None:
        type_name, start = exc
        if type_name.endswith("OutOfMemoryError"):
            return "oom-exception", Pool.GPU, Backend.UNKNOWN, start, False
        if _find(_RX_NUMPY, body, "Unable to allocate"):
            return "numpy-alloc", Pool.RAM, Backend.CPU, start, False
        return "memory-error", Pool.RAM, Backend.CPU, start, False
    if report is not None and report.exception_type.endswith(("OutOfMemoryError", "MemoryError")):
        type_name, start = report.exception_type, report.position
        if type_name.endswith("OutOfMemoryError"):
            return "oom-exception", Pool.GPU, Backend.UNKNOWN, start, False
        return "memory-error", Pool.RAM, Backend.CPU, start, False
    m = _find(_RX_GOT_OOM, body, "Got an OOM")
    if m:
        return "comfy-got-oom", Pool.GPU, Backend.UNKNOWN, m.start(), False
    m = _find(_RX_TIPS, body, "ran out of memory on your GPU")
    if m:
        return "comfy-oom-tips", Pool.GPU, Backend.UNKNOWN, m.start(), False
    m = _find(_RX_SUPIR_HINT, body, "for SUPIR was used")
    if m:
        return "supir-oom-hint", Pool.GPU, Backend.UNKNOWN, m.start(), False
    m = _find(_RX_BASH_KILLED, body, "Killed") or _find(_RX_BARE_KILLED, body, "Killed")
    if m:
        return "shell-killed", Pool.KILLED_BY_OS, Backend.CPU, m.start(), False
    if "out of memory" in body or "OOMed" in body:
        for name, rx in _RX_SOFT:
            m = rx.search(body)
            if m:
                return name, Pool.GPU, Backend.UNKNOWN, m.start(), True
    return None, Pool.GPU, Backend.UNKNOWN, 0, False


#: what in a record, or just before it, shows that CUDA's ``out of memory`` came from pinning
#: host RAM, not from VRAM: ComfyUI releasing a model's mmap to pin it, pinning APIs, the pinned
#: staging buffer, the offload stream's async copies, an uncatchable C++ error ending the process
_PINNED_MARKS: tuple[str, ...] = (
    "Attempting to release mmap",
    "pin_memory",
    "cudaHostRegister",
    "Unable to pin memory",
    "hostbuf",
    "HostBuffer",
    "offload_stream.synchronize",
    "non_blocking=non_blocking)",
    "terminate called after throwing",
)


def pinned_evidence(text: str) -> bool:
    """True when ``text`` shows host RAM being pinned (see ``_PINNED_MARKS``)."""
    return any(mark in text for mark in _PINNED_MARKS)


_RX_INLINE_OOM_TYPE = re.compile(
    r"((?:[A-Za-z_]\w*\.)*OutOfMemoryError): (?:CUDA|HIP|XPU) out of memory"
)


def _inline_exception_type(rule: str, body: str) -> str | None:
    """An exception type the text names inside a line rather than at its start."""
    if rule == "mps-invalid-buffer":
        m = _RX_MPS_BUFFER.search(body)
        return m.group(1) if m and m.group(1) else None
    if rule in ("cuda-oom", "hip-oom", "xpu-oom") and "OutOfMemoryError: " in body:
        m = _RX_INLINE_OOM_TYPE.search(body)
        return m.group(1) if m else None
    if rule == "cuda-error-oom" and "instance of '" in body:
        m = _RX_CXX_TERMINATE.search(body)
        return m.group(1) if m else None
    return None


def _oom_exception_line(body: str) -> tuple[str, int] | None:
    """The last exception line whose type is an OOM type (OutOfMemoryError, MemoryError)."""
    best = None
    for m in _RX_EXC_LINE.finditer(body):
        name = m.group(1)
        if name.endswith(("OutOfMemoryError", "MemoryError")):
            best = (name, m.start())
    return best


@dataclass(frozen=True, slots=True)
class _Report:
    """The error fields of a pasted ComfyUI Error Report."""

    exception_type: str
    #: where the exception type's field starts in the text
    position: int
    message: str | None
    node_type: str | None
    node_id: str | None


def _report(body: str) -> _Report | None:
    """The Error Report's fields read by their *structure*, in any language.

    The frontend writes ``- **Node ID:** …``, ``- **Node Type:** …``, ``- **Exception Type:**
    …``, ``- **Exception Message:** …`` in that order, and a translated page (or a browser's
    translation of it) renames the labels but keeps the Markdown and the Python type name.
    So the exception type is the first field whose value is a Python exception type, the
    message is the field after it, the node type the field before it (unless that is the node
    ID, a number) and the node ID the field before that when it is a number.
    """
    if ":**" not in body:
        return None
    fields = [(m.group(2).strip(), m.start(1)) for m in _RX_ANY_FIELD.finditer(body)]
    k = next((i for i, (value, _) in enumerate(fields) if _RX_EXC_TYPE_VALUE.match(value)), -1)
    if k < 0:
        return None
    value, pos = fields[k]
    message = fields[k + 1][0] or None if k + 1 < len(fields) else None
    node_type = node_id = None
    if k >= 1 and fields[k - 1][0]:
        before = fields[k - 1][0]
        if _RX_NODE_ID_VALUE.match(before):
            node_id = before
        else:
            node_type = before
            if k >= 2 and _RX_NODE_ID_VALUE.match(fields[k - 2][0]):
                node_id = fields[k - 2][0]
    return _Report(value, pos, message, node_type, node_id)


def _numbers(rule: str, body: str, fields: dict[str, Any], extra: list[tuple[str, Any]]) -> None:
    if rule.startswith(("cuda-oom", "hip-oom", "xpu-oom", "oom-exception", "cuda-alloc", "comfy-")):
        fields["requested_bytes"] = _size(_find(_RX_TRIED, body, "Tried to allocate"))
        m = _find(_RX_TOTAL, body, "total capac")
        if m:
            fields["total_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        m = _find(_RX_FREE, body, " free")
        if m:
            fields["free_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        m = _find(_RX_ALLOCATED, body, "allocated by PyTorch", "already allocated")
        if m:
            fields["allocated_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        m = _find(_RX_RESERVED_UNALLOC, body, "is reserved", "cached)")
        if m:
            fields["reserved_unallocated_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        reserved = _size(_find(_RX_RESERVED, body, "reserved in total"))
        fields["reserved_bytes"] = reserved
        if (
            fields.get("reserved_unallocated_bytes") is None
            and reserved is not None
            and fields.get("allocated_bytes") is not None
            and reserved >= fields["allocated_bytes"]
        ):
            fields["reserved_unallocated_bytes"] = reserved - fields["allocated_bytes"]
        fields["process_used_bytes"] = _size(_find(_RX_THIS_PROCESS, body, "this process has"))
        others = []
        for pm in _RX_PROCESS.finditer(body) if "Process " in body else ():
            others.append(
                OtherProcess(pid=int(pm.group(1)), bytes=parse_size(pm.group(2), pm.group(3)))
            )
        fields["_others"] = tuple(others)
        private = _size(_find(_RX_PRIVATE, body, "private pools"))
        if private is not None:
            extra.append(("private_pools_bytes", private))
        allowed = _size(_find(_RX_ALLOWED, body, " allowed;"))
        if allowed is not None:
            extra.append(("allowed_bytes", allowed))
        m = _find(_RX_GPU_INDEX, body, "GPU")
        if m:
            fields["gpu_index"] = int(m.group(1))
    if rule == "cuda-exceed-allowed":
        fields["allocated_bytes"] = _size(_RX_EX_ALLOCATED.search(body))
        fields["requested_bytes"] = _size(_RX_EX_REQUESTED.search(body))
        fields["total_bytes"] = _size(_RX_EX_LIMIT.search(body))
        fields["free_bytes"] = _size(_RX_EX_FREE.search(body))
        m = _RX_EXCEED.search(body)
        if m:
            fields["gpu_index"] = int(m.group(1))
    elif rule == "mps-oom":
        fields["mps_allocated_bytes"] = _size(_RX_MPS_ALLOCATED.search(body))
        fields["allocated_bytes"] = fields["mps_allocated_bytes"]
        fields["mps_other_bytes"] = _size(_RX_MPS_OTHER.search(body))
        fields["mps_max_allowed_bytes"] = _size(_RX_MPS_MAX.search(body))
        fields["requested_bytes"] = _size(_RX_MPS_TRIED.search(body))
    elif rule == "vhs-memory-limit":
        m = _RX_VHS_LIMIT.search(body)
        if m and m.group(1):
            extra.append(("frames_loaded", int(m.group(1))))
        elif m:
            extra.append(("frames_per_batch", int(m.group(2))))
            extra.append(("frames_that_fit", int(m.group(3))))
    elif rule == "mps-invalid-buffer":
        m = _RX_MPS_BUFFER.search(body)
        if m:
            fields["requested_bytes"] = parse_size(m.group(2), m.group(3))
    elif rule == "directml-oom":
        m = _RX_DIRECTML.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = int(m.group(1))
    elif rule == "cpu-allocator":
        m = _RX_CPU_ALLOC.search(body)
        if m:
            fields["requested_bytes"] = int(m.group(1)) * (1 if m.group(2) == "bytes" else _K**3)
    elif rule == "mmap-enomem":
        m = _RX_MMAP.search(body)
        if m:
            fields["requested_bytes"] = int(m.group(1))
    elif rule in ("numpy-alloc", "memory-error"):
        m = _RX_NUMPY.search(body)
        if m:
            fields["requested_bytes"] = parse_size(m.group(1), m.group(2))
    elif rule == "kernel-oom-kill":
        m = _RX_KERNEL_KILLED.search(body) or _RX_KERNEL_KILL.search(body)
        if m is not None:
            if m.re is _RX_KERNEL_KILLED:
                fields["killed_pid"], comm = int(m.group(1)), m.group(2)
            else:
                fields["killed_pid"], comm = int(m.group(2)), m.group(3)
            extra.append(("process_name", comm))
            tail = body[m.end() : m.end() + 400].split("\n", 1)[0]
            for fm in _RX_KERNEL_FIELD.finditer(tail):
                extra.append(
                    (
                        fm.group(1).replace("-", "_") + "_bytes",
                        int(fm.group(2).replace(",", "")) * _K,
                    )
                )
        else:
            tm = _RX_KERNEL_OOM_KILL_TASK.search(body)
            im = _RX_KERNEL_INVOKED.search(body)
            if tm is not None:
                fields["killed_pid"] = int(tm.group(2))
                extra.append(("process_name", tm.group(1)))
            elif im is not None:
                extra.append(("invoked_by", im.group(1)))
        cg = _RX_KERNEL_KILL.search(body)
        extra.append(
            ("scope", "cgroup" if cg and cg.group(1).startswith("Memory cgroup") else "system")
        )
        fields["killer"] = "kernel"
    elif rule == "earlyoom-kill":
        m = _RX_EARLYOOM.search(body)
        if m:
            fields["killed_pid"] = int(m.group(2))
            extra.append(("signal", m.group(1)))
            extra.append(("process_name", m.group(4)))
            extra.append(("vm_rss_bytes", int(m.group(6)) * _K**2))
        fields["killer"] = "earlyoom"
    elif rule == "systemd-oomd-kill":
        m = _RX_OOMD.search(body)
        if m:
            extra.append(("unit", m.group(1)))
        fields["killer"] = "systemd-oomd"
    elif rule == "systemd-oom-kill":
        m = _RX_SYSTEMD_UNIT.search(body)
        if m:
            extra.append(("unit", m.group(1)))
        fields["killer"] = "kernel"
    elif rule == "shell-killed":
        m = _RX_BASH_KILLED.search(body)
        if m:
            fields["killed_pid"] = int(m.group(1))
    elif rule == "soft-split-attention-steps":
        m = _RX_SOFT[2][1].search(body)
        if m and m.group(1):
            extra.append(("steps", int(m.group(1))))
    for key in list(fields):
        if fields[key] is None and key != "_others":
            del fields[key]


def _exception_of(lines: list[str], idx: int) -> tuple[str | None, str | None]:
    """(type, message) of the exception line carrying the evidence, else the last OOM-ish one."""
    m = _RX_EXC_LINE.match(lines[idx].lstrip())
    if m and not m.group(1).startswith(("Warning", "Compile")):
        return m.group(1), m.group(2)
    best: tuple[str | None, str | None] = (None, None)
    evidence = lines[idx]
    for line in lines:
        m = _RX_EXC_LINE.match(line)
        if not m:
            continue
        msg = (m.group(2) or "").strip()
        name = m.group(1)
        if (
            name.endswith(("OutOfMemoryError", "MemoryError"))
            or (msg and msg[:40] in evidence)
            or (msg and _shares_oom_text(msg, evidence))
        ):
            best = (name, m.group(2))
    return best


def _shares_oom_text(msg: str, evidence: str) -> bool:
    for key in (
        "out of memory",
        "Allocation on device",
        "DefaultCPUAllocator",
        "_STATUS_",
        "1455",
        "video memory",
        "allocate",
    ):
        if key in msg and key in evidence:
            return True
    return False


def _dialog_node(body: str) -> str | None:
    m = _RX_DIALOG.search(body)
    return m.group(1).strip() if m else None


def _colon_node(line: str) -> str | None:
    m = _RX_NODE_COLON.match(line)
    if m and not m.group(1).endswith(("Error", "Exception")):
        return m.group(1)
    return None


def _is_node_ident(text: str) -> bool:
    if not _RX_NODE_IDENT.match(text) or text in _NOT_NODES:
        return False
    if text.endswith(("Error", "Exception", "Warning")):
        return False
    return any(c.isupper() for c in text) or "_" in text


def _message_of(line: str, col: int, exc_msg: str | None, report: str | None) -> str:
    """The evidence text: the line from where the rule matched, without header or type."""
    if report and line.lstrip().startswith("-"):
        return report[:500]
    text = line[max(0, col) :].strip()
    if text.startswith(_HEADER):
        text = text[len(_HEADER) :].strip()
    m = _RX_EXC_LINE.match(text)
    if m and m.group(2):
        text = m.group(2).strip()
    elif m:
        text = m.group(1)
    if not text and exc_msg:
        text = exc_msg.strip()
    return text[:500]


def report_message(body: str) -> str | None:
    """The ``Exception Message`` of a pasted ComfyUI Error Report (any language), if any."""
    report = _report(body)
    return report.message if report is not None else None


def _backend_from_text(body: str, report_msg: str | None) -> Backend:
    if "HIP out of memory" in body or "PYTORCH_HIP_ALLOC_CONF" in body:
        return Backend.ROCM
    if "CUDA out of memory" in body or "Allocation on device" in body:
        return Backend.CUDA
    if "XPU out of memory" in body:
        return Backend.XPU
    if report_msg is not None and report_msg.startswith("HIP "):
        return Backend.ROCM
    if "MPS backend" in body:
        return Backend.MPS
    return Backend.UNKNOWN


# --------------------------------------------------------------------------------------------
# ComfyUI's execution_error payload
# --------------------------------------------------------------------------------------------


def classify_execution_error(payload: Mapping[str, Any]) -> OomEvent | None:
    """The OOM event in a websocket/history ``execution_error`` payload, or None. Never raises."""
    try:
        return _classify_execution_error(payload)
    except Exception:  # contract: never raises; the inner function is fuzzed without this net
        return None


def _text_field(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _classify_execution_error(payload: Mapping[str, Any]) -> OomEvent | None:
    if not isinstance(payload, Mapping):
        return None
    exc_type = _text_field(payload, "exception_type")
    message = _text_field(payload, "exception_message") or ""
    node_type = _text_field(payload, "node_type")
    node_id = _text_field(payload, "node_id")
    lines = [message]
    if exc_type:
        first, _, rest = message.partition("\n")
        lines = [f"{exc_type}: {first}" if first else exc_type, rest]
    found = _classify("\n".join(lines))
    if found is None:
        return None
    event = found.event
    msg_first = message.strip().split("\n", 1)[0].strip()
    return replace(
        event,
        exception_type=exc_type or event.exception_type,
        node_type=node_type or event.node_type,
        node_id=node_id or event.node_id,
        message=(msg_first or event.message)[:500],
        rule=f"execution-error/{event.rule}",
    )


# --------------------------------------------------------------------------------------------
# scanning whole files: records → events, with one failure seen twice folded into one
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """An event found in a file: the record it came from and the line that shows it."""

    record: Record
    event: OomEvent
    #: 1-based line number of the evidence line
    line_no: int
    #: last line of the last record folded into this finding
    end_line_no: int


_BOUNDARIES = ("got prompt", "Prompt executed in", "Processing interrupted", "Interrupting prompt")


#: how many lines may lie between pinning evidence and a bare CUDA OOM that is still read as
#: pinned host RAM. No more than the scanner's lookbehind always feeds before a needle's line
#: (``_StreamScanner.open_window``: at least three lines), so the byte scanner and the
#: line-by-line path see the same context and find the same events.
_PINNED_CONTEXT_LINES = 2
#: ... and at most this many records back
_PINNED_CONTEXT_RECORDS = 3


class _Folder:
    """Folds consecutive events that are one failure; tracks the previous record for node hints."""

    def __init__(self) -> None:
        self._cand: Finding | None = None
        #: the candidate is ComfyUI's bare exception header (its traceback may follow)
        self._header_only = False
        self._boundary = False
        self._prev: Record | None = None
        self._prev_hint: str | None = None
        #: the latest records without an event, (last line, text), newest last: read only when
        #: a bare CUDA OOM follows (``_with_pinning``), so the common path pays nothing
        self._quiet: deque[tuple[int, str]] = deque(maxlen=_PINNED_CONTEXT_RECORDS)

    def gap(self) -> list[Finding]:
        """The scanner skipped text here: nothing before may fold with anything after."""
        self._prev = None
        self._prev_hint = None
        self._quiet.clear()
        return self._close()

    def finish(self) -> list[Finding]:
        return self._close()

    def _close(self) -> list[Finding]:
        out = [self._cand] if self._cand is not None else []
        self._cand = None
        self._boundary = False
        return out

    def push(self, record: Record) -> list[Finding]:
        out: list[Finding] = []
        found = _classify_safe(record.text)
        hint = None
        if found is None:
            text = record.text
            self.note_boundary(text)
            first_raw = text.split("\n", 1)[0]
            # a node-type hint has no space; what follows the last prefix end ("] ", " - ")
            # has one whenever the message does, so this skips the prefix parse for most lines
            quick = first_raw.rsplit("] ", 1)[-1].rsplit(" - ", 1)[-1].strip()
            if record.line_count <= 3 and len(text) <= 200 and " " not in quick:
                first = split_prefix(first_raw).message.strip()
                if " " not in first and self._is_single_line(record) and _is_node_ident(first):
                    hint = first
            self._quiet.append((record.line_no + record.line_count - 1, text))
        else:
            found = self._with_hint(record, found)
            found = self._with_pinning(record, found)
            line_no = record.line_no + found.line_index
            end = record.line_no + record.line_count - 1
            finding = Finding(record, found.event, line_no, end)
            out.extend(self._fold(finding, found))
        self._prev = record
        self._prev_hint = hint
        return out

    def note_boundary(self, text: str) -> None:
        """What a record without an event does to folding: a prompt boundary (``got prompt``,
        ``Prompt executed in``, an interrupt) keeps events on either side apart."""
        maybe_boundary = "got prompt" in text or "Prompt executed" in text or "nterrupt" in text
        if maybe_boundary and split_prefix(text.split("\n", 1)[0]).message.strip().startswith(
            _BOUNDARIES
        ):
            self._boundary = True

    @staticmethod
    def _is_single_line(record: Record) -> bool:
        return sum(1 for ln in record.text.split("\n") if ln.strip()) == 1

    def _with_hint(self, record: Record, found: _Found) -> _Found:
        if found.event.node_type is not None or self._prev_hint is None or self._prev is None:
            return found
        if self._prev.line_no + self._prev.line_count != record.line_no or found.line_index != 0:
            return found
        return _Found(
            replace(found.event, node_type=self._prev_hint), found.line_index, found.header_only
        )

    def _with_pinning(self, record: Record, found: _Found) -> _Found:
        """CUDA's bare ``out of memory`` a few lines after ComfyUI released an mmap or tried to
        pin RAM is host RAM being pinned (the rule alone sees only its own record)."""
        event = found.event
        if event.rule != "cuda-error-oom" or event.pool is Pool.RAM:
            return found
        if not any(
            0 <= record.line_no - end - 1 <= _PINNED_CONTEXT_LINES and pinned_evidence(text)
            for end, text in self._quiet
        ):
            return found
        pinned = replace(
            event, pool=Pool.RAM, extra=_add_extra(event.extra, "host_memory", "pinned")
        )
        return _Found(pinned, found.line_index, found.header_only)

    def _fold(self, new: Finding, found: _Found) -> list[Finding]:
        cand = self._cand
        if cand is None:
            self._cand = new
            self._header_only = found.header_only
            self._boundary = False
            return []
        near = (
            not self._boundary
            and new.record.line_no - cand.end_line_no - 1 <= MERGE_GAP_LINES
            and new.record.line_no > cand.end_line_no - 1
        )
        merged = _merge(cand, new, self._header_only, found) if near else None
        if merged is not None:
            self._cand = merged
            self._header_only = self._header_only and found.header_only
            return []
        self._cand = new
        self._header_only = found.header_only
        self._boundary = False
        return [cand]


def _merge(cand: Finding, new: Finding, cand_header_only: bool, found: _Found) -> Finding | None:
    a, b = cand.event, new.event
    end = max(cand.end_line_no, new.end_line_no)
    if (
        b.rule in ("comfy-got-oom", "comfy-oom-tips")
        and not a.recovered
        and a.pool is not Pool.KILLED_BY_OS
    ):
        extra = (
            a.extra
            if b.rule == "comfy-oom-tips"
            else _add_extra(a.extra, "comfy_unloaded_models", True)
        )
        return replace(cand, event=replace(a, extra=extra), end_line_no=end)
    if (
        a.rule == "supir-oom-hint"
        and not b.recovered
        and b.pool in (Pool.GPU, Pool.GPU_FRAGMENTATION)
    ):
        return Finding(cand.record, _combine(primary=b, secondary=a), cand.line_no, end)
    if (
        cand_header_only
        and not b.recovered
        and not found.header_only
        and a.pool is not Pool.KILLED_BY_OS
    ):
        merged = _combine(primary=b, secondary=a)
        return Finding(cand.record, merged, cand.line_no, end)
    if a.pool is Pool.KILLED_BY_OS and b.pool is Pool.KILLED_BY_OS:
        if a.killed_pid is None or b.killed_pid is None or a.killed_pid == b.killed_pid:
            merged = _combine(primary=b if b.killer else a, secondary=a if b.killer else b)
            return Finding(cand.record, merged, cand.line_no, end)
        return None
    if _same(a, b):
        count = a.count + b.count
        return replace(cand, event=replace(a, count=count), end_line_no=end)
    return None


def _same(a: OomEvent, b: OomEvent) -> bool:
    if a.rule != b.rule or a.message != b.message or a.pool is not b.pool:
        return False
    return a == replace(b, count=a.count)


def _add_extra(
    extra: tuple[tuple[str, Any], ...], key: str, value: Any
) -> tuple[tuple[str, Any], ...]:
    return (*((k, v) for k, v in extra if k != key), (key, value))


def _combine(primary: OomEvent, secondary: OomEvent) -> OomEvent:
    """Fields of ``primary``, with its unknowns filled from ``secondary``."""
    updates: dict[str, Any] = {}
    for name in (
        "exception_type",
        "node_type",
        "node_id",
        "gpu_index",
        "requested_bytes",
        "total_bytes",
        "free_bytes",
        "allocated_bytes",
        "reserved_unallocated_bytes",
        "reserved_bytes",
        "process_used_bytes",
        "mps_allocated_bytes",
        "mps_other_bytes",
        "mps_max_allowed_bytes",
        "killer",
        "killed_pid",
    ):
        if getattr(primary, name) is None and getattr(secondary, name) is not None:
            updates[name] = getattr(secondary, name)
    if primary.backend is Backend.UNKNOWN and secondary.backend is not Backend.UNKNOWN:
        updates["backend"] = secondary.backend
    if not primary.other_processes and secondary.other_processes:
        updates["other_processes"] = secondary.other_processes
    if secondary.other_process_named:
        updates["other_process_named"] = True
    keys = {k for k, _ in primary.extra}
    extra = primary.extra + tuple((k, v) for k, v in secondary.extra if k not in keys)
    if extra != primary.extra:
        updates["extra"] = extra
    return replace(primary, **updates) if updates else primary


def _classify_safe(text: str) -> _Found | None:
    try:
        return _classify(text)
    except Exception:  # never raise out of a scan; the rules are fuzzed separately
        return None


def scan_lines(
    lines: Iterable[str], *, first_line_no: int = 1
) -> Iterator[tuple[Record, OomEvent]]:
    """Assemble ``lines`` (no newlines needed) into records and yield ``(record, event)``.

    Events that are one failure seen twice are folded into one (see ``MERGE_GAP_LINES``); the
    record is the first one of the fold. Use ``iter_findings`` for the evidence line numbers.
    """
    for finding in iter_findings(lines, first_line_no=first_line_no):
        yield finding.record, finding.event


def iter_findings(lines: Iterable[str], *, first_line_no: int = 1) -> Iterator[Finding]:
    """Like ``scan_lines`` but yields ``Finding`` (with line numbers). Byte offsets assume UTF-8."""
    assembler = RecordAssembler(first_line_no=first_line_no)
    folder = _Folder()
    offset = 0
    for line in lines:
        text = line[:-1] if line.endswith("\n") else line
        size = len(text.encode("utf-8", "replace")) + 1
        for record in assembler.feed(text, offset, offset + size):
            yield from folder.push(record)
        offset += size
    for record in assembler.flush():
        yield from folder.push(record)
    yield from folder.finish()


# -- the fast path over raw bytes --------------------------------------------------------------

_CHUNK = 4 * 1024 * 1024
#: a line longer than this is cut (memory stays bounded on a file without newlines)
_MAX_LINE = 256 * 1024
#: how far before a needle the scanner starts assembling records (lines)
LOOKBEHIND_LINES = 48
_LOOKBEHIND_BYTES = 64 * 1024
#: a needle this close after the last fed line continues the same window (no gap)
_CONTIGUOUS_LINES = MERGE_GAP_LINES + LOOKBEHIND_LINES
_CONTIGUOUS_BYTES = 1024 * 1024
_INDENTED_RUN = re.compile(rb"(?:[ \t][^\n]*\n)+")
#: a run of "plain" lines: each starts a record whatever precedes it (ComfyUI-Manager's prefix,
#: which split_prefix always takes, ASCII digits only), is short, and has no CR or ANSI code
_PLAIN_RUN = re.compile(
    rb"(?:\[\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d(?:\.\d+)?)?\][^\n\r\x1b]{0,4000}\n)+"
)
_BOUNDARY_BYTES = (b"got prompt", b"Prompt executed", b"nterrupt")
#: lines that probably start a record: the lookbehind stops a little before them
_RECORD_START = re.compile(
    rb"\[\d{4}-\d\d-\d\d \d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[.,]\d+ - |(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):"
    rb"|\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] |Traceback \(most|!!! Exception|# ComfyUI Error|Error occurred when"
)

# -- the prefilter -----------------------------------------------------------------------------
#
# A prefilter maps (buffer, end) to the ascending positions in ``buffer[:end]`` where a needle
# starts, with at least one position on every line that holds a needle. The scanner only works
# per line (a hit opens or extends the window around its line), so a position per needle-holding
# line is all it needs, and it never sees a position that is not a needle: the set of lines it
# opens windows for is exactly the set of lines ``has_needle`` accepts, whichever prefilter runs.

#: Type of a prefilter: (buffer, end) -> needle positions (see above).
Prefilter = Callable[[bytes | bytearray, int], list[int]]


def _hits_by_find(buf: bytes | bytearray, end: int) -> list[int]:
    """Every needle occurrence, by one ``bytes.find`` pass per needle (the stdlib fallback)."""
    out: list[int] = []
    find = buf.find
    for needle in _NEEDLES_B:
        pos = find(needle, 0, end)
        while pos >= 0:
            out.append(pos)
            pos = find(needle, pos + 1, end)
    out.sort()
    return out


def _automaton_prefilter() -> Prefilter | None:
    """All needles in one pass of a SIMD-accelerated Aho-Corasick automaton (``ahocorasick-rs``,
    the optional ``fast`` extra), or None when it is not installed.

    Leftmost-first matching reports non-overlapping matches only, but a needle occurrence it
    skips overlaps a reported one (it started inside it), and needles hold no newline, so both
    sit on the same line: every needle-holding line still gets a position.

    The module and the automaton load on the first scan: the daemon classifies records one
    at a time and never scans, so it does not carry them.
    """
    if importlib.util.find_spec("ahocorasick_rs") is None:
        return None
    find_all: Callable[[memoryview], list[tuple[int, int, int]]] | None = None

    def hits(buf: bytes | bytearray, end: int) -> list[int]:
        nonlocal find_all
        if find_all is None:
            import ahocorasick_rs

            automaton = ahocorasick_rs.BytesAhoCorasick(
                list(_NEEDLES_B), matchkind=ahocorasick_rs.MatchKind.LeftmostFirst
            )
            find_all = automaton.find_matches_as_indexes
        with memoryview(buf) as view, view[:end] as part:
            return [match[1] for match in find_all(part)]

    return hits


#: The prefilters this install has, by name; ``scan_stream(prefilter=...)`` picks one.
PREFILTERS: dict[str, Prefilter] = {"find": _hits_by_find}
_ac_hits = _automaton_prefilter()
if _ac_hits is not None:
    PREFILTERS["ahocorasick"] = _ac_hits
#: What ``scan_stream`` uses unless told otherwise: the automaton when installed.
DEFAULT_PREFILTER = "ahocorasick" if _ac_hits is not None else "find"


class _StreamScanner:
    """Needle-driven scan of a byte stream; see ``scan_stream``.

    Invariants: ``buf`` starts at a line start; ``limit`` ends the complete lines in it; the
    window (when open) has fed every line before ``fed_pos``; needles before ``scan_pos`` are
    handled; ``floor`` is the first position a new window may feed (earlier lines belong to
    records already classified); ``hits`` are the prefilter's needle positions in
    ``buf[:limit]``.

    What it finds does not depend on where its reads end (on lines up to ``_MAX_LINE``): a
    refill keeps every line a later window's lookbehind may reach (``_keep_from``). Only the
    cut of a longer line falls where a read ends, which is why a parallel scan aligns its reads
    with the sequential scan's (``_RangeReader``).
    """

    def __init__(
        self,
        stream: BinaryIO,
        chunk_size: int,
        hits_of: Prefilter,
        *,
        start_offset: int = 0,
        first_line_no: int = 1,
    ) -> None:
        self.stream = stream
        self.chunk_size = max(4096, chunk_size)
        self.hits_of = hits_of
        self.buf = bytearray()
        self.spare = bytearray(self.chunk_size)
        self.spare_view = memoryview(self.spare)
        self.buf_off = start_offset
        self.limit = 0
        self.cnt_pos = 0  # a line start in buf ...
        self.cnt_line = first_line_no  # ... and its line number
        self.scan_pos = 0
        self.floor = 0
        self.hits: list[int] = []
        self.asm: RecordAssembler | None = None
        self.fed_pos = 0
        self.fed_line = first_line_no
        self.first_line_no = first_line_no
        self.last_hit_line = 0
        self.folder = _Folder()
        self.eof = False

    def line_at(self, pos: int) -> int:
        """Line number of the line that starts at ``pos``."""
        if pos >= self.cnt_pos:
            self.cnt_line += self.buf.count(b"\n", self.cnt_pos, pos)
        else:
            self.cnt_line -= self.buf.count(b"\n", pos, self.cnt_pos)
        self.cnt_pos = pos
        return self.cnt_line

    def _readinto(self, target: bytearray) -> int:
        readinto = getattr(self.stream, "readinto", None)
        if readinto is not None:
            try:
                got = readinto(target)
            except (AttributeError, NotImplementedError, io.UnsupportedOperation):
                got = None
            if got is not None:
                return int(got)
        data = self.stream.read(len(target))
        target[: len(data)] = data
        return len(data)

    def needle_at_or_after(self, start: int) -> int:
        hits = self.hits
        i = bisect_left(hits, start)
        return hits[i] if i < len(hits) else -1

    def _keep_from(self, start: int) -> int:
        """Where a refill may cut the buffer when no window is open and ``start`` (a line start)
        is the next position to scan: no earlier than any line that ``open_window`` could
        reach from a needle at or after ``start``.

        The walk is ``open_window``'s without its stop at record starts. A walk from a later
        line has gone at least as many lines and bytes when it passes any line here, so it
        stops no earlier. Memory stays bounded: a line that does not fit in
        ``_LOOKBEHIND_BYTES + _MAX_LINE`` is not kept, and neither is anything before a cut
        (``start`` inside an over-long line).
        """
        if start > 0 and self.buf[start - 1] != 10:  # b"\n"
            return start
        floor = max(self.floor, 0)
        lowest = max(floor, start - _LOOKBEHIND_BYTES - _MAX_LINE)
        pos, back = start, 0
        while back < LOOKBEHIND_LINES and pos > floor and start - pos < _LOOKBEHIND_BYTES:
            nl = self.buf.rfind(b"\n", lowest, pos - 1)
            if nl >= 0:
                pos = nl + 1
            elif lowest == floor:
                pos = floor
            else:
                break  # the line before is too long to keep
            back += 1
        return pos

    def fill(self) -> None:
        keep = self.scan_pos if self.asm is None else min(self.scan_pos, self.fed_pos)
        keep = max(0, min(keep, self.limit))
        if self.asm is None:
            keep = self._keep_from(keep)
        self.line_at(keep)
        # One bytearray, trimmed at the front and refilled with readinto from one reused
        # buffer: no fresh multi-megabyte allocation (and its page faults) per chunk.
        del self.buf[:keep]
        got = self._readinto(self.spare)
        if got:
            self.buf += self.spare_view[:got]
        else:
            self.eof = True
        self.buf_off += keep
        for name in ("limit", "cnt_pos", "scan_pos", "floor", "fed_pos"):
            setattr(self, name, max(0, getattr(self, name) - keep))
        if self.eof:
            self.limit = len(self.buf)
        else:
            end = self.buf.rfind(b"\n") + 1
            if end <= self.limit and len(self.buf) - self.limit > _MAX_LINE:
                end = len(self.buf)  # an over-long line: cut it here
            self.limit = max(end, self.limit)
        self.hits = self.hits_of(self.buf, self.limit)

    def close_window(self) -> list[Finding]:
        if self.asm is not None:
            pending = self.asm.pending_start_offset
            self.floor = max(0, pending - self.buf_off) if pending is not None else self.fed_pos
            self.asm = None
        return self.folder.gap()

    def open_window(self, line_start: int, hit_line: int) -> None:
        pos, back = line_start, 0
        found_start = False
        extra = 0
        while back < LOOKBEHIND_LINES and pos > self.floor and line_start - pos < _LOOKBEHIND_BYTES:
            pos = max(self.buf.rfind(b"\n", self.floor, pos - 1) + 1, self.floor)
            back += 1
            if found_start:
                extra += 1
                if extra >= 2:
                    break
            elif _RECORD_START.match(self.buf, pos):
                found_start = True
        self.asm = RecordAssembler(first_line_no=hit_line - back)
        self.fed_pos, self.fed_line = pos, hit_line - back

    def feed(self) -> Iterator[Finding]:
        """Feed lines until the record holding the last needle is complete or data runs out."""
        asm = self.asm
        assert asm is not None
        buf, limit = self.buf, self.limit
        nxt = self.needle_at_or_after(self.fed_pos)
        while self.fed_pos < limit:
            if buf[self.fed_pos] in (32, 9) and asm.pending_line_no is not None:  # " ", "\t"
                # a run of indented lines (a traceback body) joins the pending record in bulk
                m = _INDENTED_RUN.match(buf, self.fed_pos, limit)
                if m and m.end() > self.fed_pos:
                    run_end = m.end()
                    block = buf[self.fed_pos : run_end - 1].decode("utf-8", "replace")
                    if asm.extend_indented(block, self.buf_off + run_end):
                        count = buf.count(b"\n", self.fed_pos, run_end)
                        if 0 <= nxt < run_end:
                            last = nxt
                            while 0 <= nxt < run_end:
                                last = nxt
                                nxt = self.needle_at_or_after(nxt + 1)
                            self.last_hit_line = self.fed_line + buf.count(
                                b"\n", self.fed_pos, last
                            )
                        self.fed_pos = run_end
                        self.fed_line += count
                        continue
            skip = self._plain_run(nxt) if buf[self.fed_pos] == 91 else None  # "["
            nl = buf.find(b"\n", self.fed_pos, limit)
            end = nl + 1 if nl >= 0 else limit
            line_end = nl if nl >= 0 else limit
            if line_end - self.fed_pos > _MAX_LINE:
                line_end = self.fed_pos + _MAX_LINE
            if 0 <= nxt < end:
                self.last_hit_line = self.fed_line
                nxt = self.needle_at_or_after(end)
            text = buf[self.fed_pos : line_end].decode("utf-8", "replace")
            for record in asm.feed_line(text, self.buf_off + self.fed_pos, self.buf_off + end):
                yield from self.folder.push(record)
            self.fed_pos = end
            line = self.fed_line
            self.fed_line += 1
            if line > self.last_hit_line and asm.pending_line_no == line:
                break  # the record with the last needle is complete
            if skip is not None:
                self._skip_plain(*skip)
        self.scan_pos = max(self.scan_pos, self.fed_pos)

    def _plain_run(self, nxt: int) -> tuple[int, int] | None:
        """(end, lines) of what ``_skip_plain`` may skip after the line at ``fed_pos``, when
        it starts a run of at least four plain lines (``_PLAIN_RUN``) that ends before the line
        of the next needle ``nxt`` and before ``last_hit_line``; else None.

        Such a run is the filler between two needles of one window (up to
        ``_CONTIGUOUS_LINES`` of progress bars and model loads). Each of its lines is a
        single-line record without a needle, ended by the next line: the window must count
        them and see the prompt boundaries among them, but nothing else about the records in
        the middle can change what is found. The first line and the last two are fed as
        usual: the record a needle's record follows (its node-type hint) is the last one, or
        the one before it when the needle's line continues the last.
        """
        if nxt < 0 or self.last_hit_line - self.fed_line < 4:
            return None
        buf, pos = self.buf, self.fed_pos
        stop = buf.rfind(b"\n", pos, nxt) + 1  # the needle's line start
        m = _PLAIN_RUN.match(buf, pos, stop)
        if m is None:
            return None
        lines = buf.count(b"\n", pos, m.end())
        if lines < 4 or self.fed_line + lines > self.last_hit_line:
            return None
        # the last two lines of the run are fed as usual (see above)
        end = buf.rfind(b"\n", pos, buf.rfind(b"\n", pos, m.end() - 1)) + 1
        return end, lines - 3

    def _skip_plain(self, end: int, lines: int) -> None:
        """Skip ``lines`` plain lines from ``fed_pos`` to ``end`` (see ``_plain_run``), the line
        before them being the pending record: as feeding them would, note their prompt
        boundaries and number the lines after them; the pending record is ended (and pushed)
        by the next line fed, with the same effect as the last skipped line's record."""
        asm = self.asm
        assert asm is not None
        buf, pos = self.buf, self.fed_pos
        for marker in _BOUNDARY_BYTES:
            at = buf.find(marker, pos, end)
            while at >= 0:
                start = max(pos, buf.rfind(b"\n", pos, at) + 1)
                stop = buf.find(b"\n", at, end)
                self.folder.note_boundary(buf[start:stop].decode("utf-8", "replace"))
                at = buf.find(marker, stop, end)
        asm.skip_lines(lines)
        self.fed_pos = end
        self.fed_line += lines

    def settled(self) -> bool:
        asm = self.asm
        return asm is None or (
            self.fed_line - 1 > self.last_hit_line and asm.pending_line_no == self.fed_line - 1
        )

    def run(self) -> Iterator[Finding]:
        while True:
            if self.asm is not None and not self.settled():
                if self.fed_pos < self.limit:
                    yield from self.feed()
                    continue
                if self.eof:
                    break
                self.fill()
                continue
            hit = self.needle_at_or_after(self.scan_pos)
            if hit < 0:
                self.scan_pos = self.limit
                if self.asm is not None:
                    start = self.buf.rfind(b"\n", 0, self.limit - 1) + 1 if self.limit else 0
                    if (
                        self.limit - self.fed_pos > _CONTIGUOUS_BYTES
                        or self.line_at(max(start, self.fed_pos)) - self.fed_line
                        > _CONTIGUOUS_LINES
                    ):
                        yield from self.close_window()
                if self.eof:
                    break
                self.fill()
                continue
            line_start = self.buf.rfind(b"\n", 0, hit) + 1
            hit_line = self.line_at(line_start)
            if (
                self.asm is not None
                and line_start >= self.fed_pos
                and hit_line - self.fed_line <= _CONTIGUOUS_LINES
            ):
                self.last_hit_line = hit_line
            else:
                if self.asm is not None:
                    yield from self.close_window()
                self.open_window(line_start, hit_line)
                self.last_hit_line = hit_line
            yield from self.feed()
        if self.asm is not None:
            for record in self.asm.flush():
                yield from self.folder.push(record)
            self.asm = None
        yield from self.folder.finish()

    def lines_read(self) -> int:
        """After ``run``: the number of newlines in everything read."""
        return self.line_at(len(self.buf)) - self.first_line_no


# -- parallel scan of a big regular file ------------------------------------------------------
#
# A big regular file is cut into byte ranges that this process and forked workers scan at
# once (past the prefilter the scan is Python, so only processes spread it over cores); this
# process takes ranges from the front and yields as it goes, the workers from the back
# (``_scan_ranges``). The findings are exactly the sequential scan's, in file order, because
# a range only starts at a *seam*: a line that
#
# * starts a record unconditionally (a wrapper prefix, records.py), so whatever record was
#   pending before it ends right before it, in the sequential scan as in the range before; and
# * is followed by ``_SEAM_LINES`` needle-free lines, none over ``_MAX_LINE``: the sequential
#   scan's next needle is then too far from its last fed line to be contiguous, so it closes
#   the window there (a gap: nothing folds across it), and that needle's lookbehind
#   (≤ ``LOOKBEHIND_LINES``) cannot reach back to the seam, so the range's scanner, which
#   starts fresh at the seam, opens the same window with the same records.
#
# Each range's reads end where the sequential scan's reads end (``_RangeReader``: an
# over-long line is cut at the same place), and a refill keeps whatever a lookbehind may need
# (``_StreamScanner._keep_from``), so where a buffer starts changes nothing. Worker findings go
# to an unlinked temp file, not to memory, until their turn comes: memory stays flat whatever
# the file holds.

#: a range handed to another process is at least this big (its start-up must pay)
PARALLEL_RANGE_BYTES = 32 * 1024 * 1024
#: needle-free lines a seam needs after it (see above: more than the contiguity distance)
_SEAM_LINES = 2 * _CONTIGUOUS_LINES
#: how far past a nominal split point a seam is looked for before giving that split up
_SEAM_SEARCH_BYTES = 1024 * 1024
#: at most this many ranges per process: enough for the work to even out between them
_RANGES_PER_PROCESS = 4


class _RangeReader(io.RawIOBase):
    """Bytes ``[start, end)`` of a file descriptor by positional reads (no shared file
    position), in reads that end where a sequential scan from ``base`` ends its reads:
    at ``base + k * chunk``."""

    def __init__(self, fd: int, start: int, end: int, base: int, chunk: int) -> None:
        super().__init__()
        self.fd = fd
        self.pos = start
        self.end = end
        self.base = base
        self.chunk = max(4096, chunk)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(
            len(buffer), self.end - self.pos, self.chunk - (self.pos - self.base) % self.chunk
        )
        got = 0
        with memoryview(buffer) as view:
            while got < want:
                with view[got:want] as part:  # straight into the buffer (Linux only, as forking)
                    n = os.preadv(self.fd, [part], self.pos + got)
                if not n:
                    break  # the file shrank: end of data
                got += n
        self.pos += got
        if got < want:
            self.end = self.pos
        return got


def _is_seam_line(line: bytes) -> bool:
    """Does this line (no newline) start a record whatever came before it (records.py)?"""
    text = line.decode("utf-8", "replace")
    if text.endswith("\r"):
        text = text.rstrip("\r")
    return text[:1] not in (" ", "\t") and split_prefix(text).starts_record


def _seam_after(fd: int, pos: int, end: int, hits_of: Prefilter) -> int | None:
    """The first seam (see above) at a line start in ``(pos, end)``, looked for within
    ``_SEAM_SEARCH_BYTES``; None when there is none there."""
    data = os.pread(fd, max(0, min(end, pos + _SEAM_SEARCH_BYTES) - pos), pos)
    hits = hits_of(data, len(data))
    cand = data.find(b"\n") + 1
    while 0 < cand < len(data):
        zone_end = cand
        for _ in range(_SEAM_LINES):
            nl = data.find(b"\n", zone_end)
            if nl < 0:
                return None  # ran out of data: no room for a seam here
            if nl - zone_end >= _MAX_LINE:
                break
            zone_end = nl + 1
        else:
            i = bisect_left(hits, zone_end) - 1
            if i < 0 or hits[i] < cand:
                if _is_seam_line(data[cand : data.find(b"\n", cand)]):
                    return pos + cand
                cand = data.find(b"\n", cand) + 1
                continue
            cand = data.find(b"\n", hits[i]) + 1  # restart after the last needle in the zone
            continue
        cand = data.find(b"\n", zone_end) + 1  # restart after the over-long line
    return None


def _plan_ranges(
    fd: int, start: int, size: int, parts: int, hits_of: Prefilter
) -> list[tuple[int, int]]:
    """Up to ``parts`` ranges covering ``[start, size)``, each but the first beginning at a
    seam near an even split (fewer when no seam is found near a split point)."""
    bounds = [start]
    for k in range(1, parts):
        nominal = start + (size - start) * k // parts
        if nominal <= bounds[-1]:
            continue
        seam = _seam_after(fd, nominal, size, hits_of)
        if seam is not None and bounds[-1] < seam < size:
            bounds.append(seam)
    bounds.append(size)
    return list(pairwise(bounds))


def _scan_range_to_file(
    fd: int, lo: int, hi: int, base: int, chunk_size: int, prefilter: str, out_fd: int
) -> None:
    """Worker process: scan ``[lo, hi)`` and pickle its findings (line numbers counted from the
    range start) and then ``("end", newlines in the range)`` to ``out_fd``."""
    scanner = _StreamScanner(
        _RangeReader(fd, lo, hi, base, chunk_size),  # type: ignore[arg-type]
        chunk_size,
        PREFILTERS[prefilter],
        start_offset=lo,
    )
    import pickle

    with open(out_fd, "wb", closefd=False) as out:
        for finding in scanner.run():
            pickle.dump(finding, out, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.dump(("end", scanner.lines_read()), out, protocol=pickle.HIGHEST_PROTOCOL)


def _shifted(finding: Finding, lines: int) -> Finding:
    record = replace(finding.record, line_no=finding.record.line_no + lines)
    return Finding(record, finding.event, finding.line_no + lines, finding.end_line_no + lines)


def _range_worker(
    fd: int,
    ranges: list[tuple[int, int]],
    chunk_size: int,
    prefilter: str,
    spill_fds: list[int],
    claim: Any,
    done: list[Any],
) -> None:
    """Worker process: take ranges from the back until the taken ones meet the scanning
    parent's (``claim`` = [next range the parent takes, first range a worker took]), scan each
    into its own file, and say so."""
    while True:
        with claim.get_lock():
            k = claim[1] - 1
            if k < claim[0]:
                return
            claim[1] = k
        lo, hi = ranges[k]
        _scan_range_to_file(fd, lo, hi, ranges[0][0], chunk_size, prefilter, spill_fds[k])
        done[k].set()


def _replay(spill: BinaryIO, lines: int, counted: list[int]) -> Iterator[Finding]:
    """A worker's findings from its file, line numbers moved on by ``lines``; the range's
    newline count is appended to ``counted`` once the file proves complete."""
    import pickle

    spill.seek(0)
    try:
        while True:
            item = pickle.load(spill)
            if not isinstance(item, Finding):
                if isinstance(item, tuple) and item[:1] == ("end",):
                    counted.append(int(item[1]))
                return
            yield _shifted(item, lines)
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError):
        return


def _scan_ranges(
    fd: int, ranges: list[tuple[int, int]], chunk_size: int, prefilter: str, workers: int = 1
) -> Iterator[Finding]:
    """Scan ``ranges`` (contiguous, the first one starting where a sequential scan would) here
    and in up to ``workers`` forked processes, yielding the findings in file order.

    This process takes ranges from the front and yields as it scans; the workers take them
    from the back. Where the two meet depends on who got the CPU: on a busy machine this
    process simply scans more of the file itself instead of waiting. A worker's findings are
    replayed from its file one at a time (memory stays flat). A range whose worker could not
    start, died, or left a file cut short is scanned here, skipping what was already replayed:
    a scan of a range always finds the same.
    """
    import multiprocessing  # the daemon never forks workers: only diagnose's big scans load it

    hits_of = PREFILTERS[prefilter]
    n = len(ranges)
    ctx = multiprocessing.get_context("fork")
    spills: list[BinaryIO] = []
    procs: list[Any] = []
    claim: Any = None
    done: list[Any] = []
    try:
        try:
            spills = [tempfile.TemporaryFile() for _ in range(n)]  # noqa: SIM115 - closed below
            claim = ctx.Array("i", [0, n])
            done = [ctx.Event() for _ in range(n)]
            for _ in range(max(0, min(workers, n - 1))):
                proc = ctx.Process(
                    target=_range_worker,
                    args=(
                        fd,
                        ranges,
                        chunk_size,
                        prefilter,
                        [s.fileno() for s in spills],
                        claim,
                        done,
                    ),
                    daemon=True,
                )
                proc.start()
                procs.append(proc)
        except OSError:
            pass  # no temp files or no fork: what no worker took is scanned here
        lines = 0
        for k, (lo, hi) in enumerate(ranges):
            sent = 0
            counted: list[int] = []
            if claim is not None:
                with claim.get_lock():
                    mine = claim[0] <= k < claim[1]
                    if mine:
                        claim[0] = k + 1
                if not mine:
                    while not done[k].wait(0.05) and any(p.is_alive() for p in procs):
                        pass
                    if done[k].is_set():
                        for finding in _replay(spills[k], lines, counted):
                            yield finding
                            sent += 1
            if not counted:
                scanner = _StreamScanner(
                    _RangeReader(fd, lo, hi, ranges[0][0], chunk_size),  # type: ignore[arg-type]
                    chunk_size,
                    hits_of,
                    start_offset=lo,
                    first_line_no=lines + 1,
                )
                for i, finding in enumerate(scanner.run()):
                    if i >= sent:
                        yield finding
                counted.append(scanner.lines_read())
            lines += counted[0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for spill in spills:
            spill.close()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _parallel_source(stream: BinaryIO) -> tuple[int, int, int] | None:
    """(fd, position, size) when ``stream`` is a regular file this process may fork to scan."""
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return None  # fork is only safe (and cheap) on Linux, from a single-threaded process
    try:
        fd = stream.fileno()
        st = os.fstat(fd)
        pos = stream.tell()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size <= pos:
        return None
    return fd, pos, st.st_size


def scan_stream(
    stream: BinaryIO,
    *,
    chunk_size: int = _CHUNK,
    prefilter: str | None = None,
    workers: int | None = 1,
    range_bytes: int | None = None,
) -> Iterator[Finding]:
    """Scan a binary stream for OOM events in constant memory; what ``diagnose`` runs.

    Only the lines around a needle (``NEEDLES``) are decoded and assembled into records
    (from up to ``LOOKBEHIND_LINES`` before it until its record is complete); everything else
    is skipped at prefilter speed (``prefilter``: a name in ``PREFILTERS``, by default
    ``DEFAULT_PREFILTER``). On ordinary logs the findings equal those of ``iter_findings``
    over the same lines; they can differ only when one record is longer than the lookbehind
    and its needle sits past it (the event is the same, its record starts later).

    ``workers`` > 1 (or None: one per CPU) lets a regular file of at least two
    ``range_bytes`` (default ``PARALLEL_RANGE_BYTES``) be cut into ranges of about that size
    that this process and ``workers - 1`` forked ones share (Linux, single-threaded callers);
    the findings are the same, in the same order (see "parallel scan" above). Such a scan
    reads the file up to the size it had when it started.
    """
    name = prefilter or DEFAULT_PREFILTER
    if name not in PREFILTERS:
        raise ValueError(f"unknown prefilter {name!r}; this install has {sorted(PREFILTERS)}")
    want = _cpu_count() if workers is None else workers
    source = _parallel_source(stream) if want > 1 else None
    if source is not None:
        fd, pos, size = source
        parts = (size - pos) // max(1, range_bytes or PARALLEL_RANGE_BYTES)
        parts = min(parts, _RANGES_PER_PROCESS * want)
        ranges = _plan_ranges(fd, pos, size, parts, PREFILTERS[name]) if parts > 1 else []
        if len(ranges) > 1:
            yield from _scan_ranges(fd, ranges, chunk_size, name, workers=want - 1)
            stream.seek(size)
            return
    # Offsets are the stream's own, as the parallel ranges report them: a scan that starts in
    # the middle of a file says where in the file each record is, whichever path ran it.
    try:
        start = stream.tell()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        start = 0
    yield from _StreamScanner(stream, chunk_size, PREFILTERS[name], start_offset=start).run()

"""Records in, events out: each record classified (classify/rules.py), and one failure seen
twice folded into one event (ComfyUI's ``!!! Exception`` header and its traceback, the
traceback and ``Got an OOM``, a shell's ``Killed`` and the kernel's line), with the hints that
only neighbouring records give (the node type printed on the line before, pinning evidence a
few lines up).

``iter_findings`` runs it over lines (the daemon's follower, a paste); the byte scanner
(classify/scan.py) feeds it the records of the windows around prefilter hits. Pure.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from oom_sentinel.daemon.classify.events import MERGED_FIELDS, OomEvent, Pool, unknown
from oom_sentinel.daemon.classify.rules import (
    RETRYING,
    _classify,
    _Found,
    _is_node_ident,
    has_needle,
    pinned_evidence,
)
from oom_sentinel.daemon.logs.prefix import split_prefix
from oom_sentinel.daemon.logs.records import Record, RecordAssembler

#: Two events this many lines apart or closer may be one failure seen twice (ComfyUI's
#: ``!!! Exception`` header and its traceback, the traceback and ``Got an OOM`` after a
#: memory summary table, a shell's ``Killed`` and the kernel's line).
MERGE_GAP_LINES = 80


@dataclass(frozen=True, slots=True)
class Finding:
    """An event found in a file: the record it came from and the line that shows it."""

    record: Record
    event: OomEvent
    #: 1-based line number of the evidence line
    line_no: int
    #: last line of the last record folded into this finding
    end_line_no: int


#: lines that keep events on either side apart: a prompt's start and end, an interrupt, and
#: ComfyUI's start-up ('Set vram state to: NORMAL_VRAM', logged once per process: a failure
#: after it is another run's, however alike)
_BOUNDARIES = (
    "got prompt",
    "Prompt executed in",
    "Processing interrupted",
    "Interrupting prompt",
    "Set vram state to: ",
)


#: how many lines may lie between pinning evidence and a bare CUDA OOM that is still read as
#: pinned host RAM. No more than the scanner's lookbehind always feeds before a needle's line
#: (``_StreamScanner.open_window``: at least three lines), so the byte scanner and the
#: line-by-line path see the same context and find the same events.
_PINNED_CONTEXT_LINES = 2
#: ... and at most this many records back
_PINNED_CONTEXT_RECORDS = 3


#: the end of a line that an exception's message runs past: the type, its colon, then words up
#: to the line's end with no closing full stop (a sentence that ends there was not wrapped)
_RX_WRAPPED_TYPE = re.compile(
    r"(?:^|(?<=[\s\"'`]))((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): \S[^\n]*(?:[^.\s]|: )$"
)


def _is_compile_wrapper(text: str) -> bool:
    return text.startswith("backend=") and text.rstrip().endswith("raised:") and "\n" not in text


#: how far after an OOM a pack's announced retry still speaks of it (lines)
_RETRY_LINES = 4


def _looks_like_node_class(text: str) -> bool:
    """A node class name, not a heading word ('Output:', 'Log:'): two capitals or more
    ('KSampler', 'VAEDecode') or an underscore ('WanVideo_Sampler')."""
    return "_" in text or sum(c.isupper() for c in text) >= 2


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
            # (a Markdown fence's language tag, '```Shell', names no node)
            if (
                record.line_count <= 3
                and len(text) <= 200
                and " " not in quick
                and not text.startswith("```")
            ):
                first = split_prefix(first_raw).message.strip().strip("*`_")  # Markdown
                if first.endswith(":"):  # a toast retyped as paragraphs: 'KSampler:', ''
                    first = first[:-1] if _looks_like_node_class(first[:-1]) else ""
                if " " not in first and self._is_single_line(record) and _is_node_ident(first):
                    hint = first
            self._quiet.append((record.line_no + record.line_count - 1, text))
            self._retry_announced(record)
            if hint is None and self._prev_hint is not None and _is_compile_wrapper(text):
                # torch.compile's "backend='inductor' raised:" between a toast's node class
                # and its message: the node hint stays for the record after it
                self._prev = record
                return out
        else:
            found = self._with_hint(record, found)
            found = self._with_wrapped_type(record, found)
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
        ``Prompt executed in``, an interrupt) or ComfyUI's start-up keeps events on either
        side apart."""
        maybe_boundary = (
            "got prompt" in text
            or "Prompt executed" in text
            or "nterrupt" in text
            or "Set vram state" in text
        )
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

    def _retry_announced(self, record: Record) -> None:
        """A pack's own retry of an OOM, announced a few lines after it (SeedVR2's 'OOM during
        ...' then 'Clearing memory and retrying'): a soft OOM, like ComfyUI's tiled-VAE retry.
        Only a record holding a needle counts: the file scanner pushes no other record after
        a window's last needle, and both scans must find the same."""
        cand = self._cand
        if cand is None or cand.event.recovered or cand.event.pool is Pool.KILLED_BY_OS:
            return
        if record.line_no - cand.end_line_no > _RETRY_LINES:
            return
        text = record.text
        retried = "etrying" in text and RETRYING.search(text) is not None
        # (ncnn's Vulkan allocator going on with another heap: 'weight allocator fallback to
        # device memory')
        if not (retried or "fallback to device memory" in text) or not has_needle(text):
            return
        self._cand = replace(cand, event=replace(cand.event, recovered=True))

    def _with_wrapped_type(self, record: Record, found: _Found) -> _Found:
        """An exception type the line just before names when its message was hard-wrapped
        there (``... RuntimeError: TensorStorage .../tensor.h 168`` / ``cuda failed with
        error 2 out of memory``), or goes on over lines (a pack's ``RuntimeError: Failed to
        load video: ...`` / ``due to: ... DefaultCPUAllocator ...``): the message's rest became
        a record of its own. A record that starts with a capital starts a message of its own."""
        event = found.event
        if event.exception_type is not None or found.line_index != 0 or self._prev is None:
            return found
        if self._prev.line_no + self._prev.line_count != record.line_no:
            return found
        first = record.text[:1]
        if not (first.islower() or first == "/"):
            return found  # a message's rest goes on in lower case or with a path; else new
        last = self._prev.text.rstrip("\n").rsplit("\n", 1)[-1]
        m = _RX_WRAPPED_TYPE.search(last) if "Error: " in last or "Exception: " in last else None
        if m is None:
            return found
        return _Found(
            replace(event, exception_type=m.group(1)), found.line_index, found.header_only
        )

    def _with_pinning(self, record: Record, found: _Found) -> _Found:
        """CUDA's bare ``out of memory`` a few lines after ComfyUI released an mmap or tried to
        pin RAM is host RAM being pinned (the rule alone sees only its own record)."""
        event = found.event
        if event.rule != "cuda-error-oom" or event.pool is Pool.RAM:
            return found
        near = [
            text
            for end, text in self._quiet
            if 0 <= record.line_no - end - 1 <= _PINNED_CONTEXT_LINES
        ]
        # (together with the record: an abort in it, the model moves just before it)
        if not near or not pinned_evidence("\n".join([*near, record.text])):
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
    if b.rule == "fairseq-oom-recover" and not a.recovered and a.pool is not Pool.KILLED_BY_OS:
        # fairseq's trainer announcing it will try to go on after the OOM it just printed
        return replace(cand, end_line_no=end)
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
    if (
        a.rule == b.rule == "cuda-error-oom"
        and a.message.startswith("THCudaCheck FAIL")
        and a.exception_type is None
        and b.exception_type is not None
        and not a.recovered
        and not b.recovered
        and a.pool is b.pool
    ):
        # a CUDA check's own line (THC's ``THCudaCheck FAIL ... error=2 : out of memory``),
        # then the traceback of the exception it raised: one failure, placed where the
        # exception ends it
        return Finding(cand.record, _combine(primary=b, secondary=a), new.line_no, end)
    if (
        a.rule == b.rule == "cuda-error-oom"
        and a.message.startswith("THCudaCheck FAIL")
        and b.message.lower().startswith("cuda runtime error (2)")
        and a.exception_type is None is b.exception_type
        and not a.recovered
        and not b.recovered
        and new.line_no - cand.end_line_no <= 1
    ):
        # the same check's failure raised by a caller without a type on the next line (Lua
        # torch's trepl: '.../init.lua:384: cuda runtime error (2) : out of memory at ...'):
        # one failure, placed at the check's own line
        return replace(cand, event=_combine(primary=a, secondary=b), end_line_no=end)
    if (
        a.rule == b.rule == "acestep-vram-preflight"
        and a.message.startswith("VRAM pre-flight failed")
        and new.line_no - cand.end_line_no <= 1
    ):
        # ACE-Step's warning of its refusal, then the refusal raised: one failure, placed where
        # it was raised
        return Finding(cand.record, _combine(primary=b, secondary=a), new.line_no, end)
    if (
        b.rule == "ggml-buffer-alloc"
        and a.pool is b.pool
        and not a.recovered
        and new.line_no - cand.end_line_no <= 1
        and not (a.rule == b.rule and a.message == b.message)
    ):
        # ggml's allocator, then its loader, reporting the buffer that the line before failed
        # to get ('cudaMalloc failed: out of memory', then 'ggml_gallocr_reserve_n: failed to
        # allocate CUDA0 buffer of size N', then 'unable to allocate CUDA0 buffer'): one
        # failure. The same line again is a repeat (``_same``).
        return replace(cand, event=_combine(primary=a, secondary=b), end_line_no=end)
    if (
        a.rule == b.rule == "windows-pagefile"
        and ("0x800705AF" in a.message) != ("0x800705AF" in b.message)
        and new.line_no - cand.end_line_no <= 1
    ):
        # Windows' text for the paging file, then the same error as its HRESULT in the
        # detail the caller appends (Docker's 'CreateComputeSystem ...: The paging file is too
        # small ...' then Hyper-V's '[Event Detail: ... (0x800705AF)]'): one failure
        return Finding(cand.record, _combine(primary=a, secondary=b), cand.line_no, end)
    if (
        a.rule == b.rule in _TOLD_TWICE
        and a.message != b.message  # (the same line again is a repeat: ``_same``)
        and new.line_no - cand.end_line_no <= 1
        and not _title_copy(cand, new)  # (a title copying the first line: counted below)
    ):
        # one failure told by two lines: ggml_vulkan's 'Device memory allocation of size N
        # failed.' then the Vulkan result it got; C++'s 'terminate called after throwing an
        # instance of 'std::bad_alloc'' then its 'what():  std::bad_alloc'
        return Finding(cand.record, _combine(primary=a, secondary=b), cand.line_no, end)
    if (
        a.rule == b.rule == "dxvk-alloc-failed"
        and a.requested_bytes is not None
        and b.requested_bytes is None
        and new.line_no - cand.end_line_no <= 1
    ):
        # DXVK logs the failed allocation's block, then the error it throws with the same
        # words and no figures: one failure (the next block is the next failure)
        return replace(cand, end_line_no=end)
    if (
        a.rule == b.rule == "v8-heap-oom"
        and "FatalProcessOutOfMemory(" in b.message
        and "FatalProcessOutOfMemory(" not in a.message
    ):
        # V8's message, then its native stack naming the OOM handler: the same failure's frames
        return replace(cand, end_line_no=end)
    if a.rule == b.rule == "unity-oom" and new.line_no - cand.end_line_no <= 1:
        # Unity's allocator tells one failure line by line: its four probes, 'DynamicHeapAllocator
        # out of memory', 'Could not allocate memory: System out of memory!' (a probe logged
        # twice is still the same probe)
        return Finding(cand.record, _combine(primary=a, secondary=b), cand.line_no, end)
    if (
        a.rule == "tf-bfc-oom"
        and b.rule == "xla-resource-exhausted"
        and b.pool is Pool.GPU
        and new.line_no - cand.end_line_no <= 2
    ):
        # BFC's refusal, its usage bar, then the runtime's RESOURCE_EXHAUSTED for the same
        # buffer: one failure, its exact size the runtime's (BFC's is rounded)
        merged = replace(_combine(primary=a, secondary=b), requested_bytes=b.requested_bytes)
        return Finding(cand.record, merged, cand.line_no, end)
    if a.rule == b.rule == "shell-killed" and not _title_copy(cand, new):
        return None  # each 'Killed' is the shell reporting one process's death (a title
        # copying the body's line is the user's copy of it: counted below)
    if a.pool is Pool.KILLED_BY_OS and b.pool is Pool.KILLED_BY_OS:
        if dict(a.extra).get("invoked_by") and dict(b.extra).get("invoked_by"):
            return None  # each 'X invoked oom-killer' opens an OOM of its own
        if _sigterm_then_shell_kill(a, b):
            return None  # the process lived through the SIGTERM: its 'Killed' is a later kill
        if a.killed_pid is None and b.killed_pid is None and _repeated_report(a, b):
            # the same report of an unnamed victim again (Colab's dialog as a title, then
            # quoted in the body): a repeat, counted like any other
            return replace(cand, event=replace(a, count=a.count + b.count), end_line_no=end)
        if (
            a.killed_pid is not None
            and b.killed_pid is None
            and (dict(b.extra).get("invoked_by") or _RX_KILL_CHOICE.match(b.message))
        ):
            # the kernel's next OOM after a finished kill: 'X invoked oom-killer', or the old
            # kernels' choice of the next victim ('Out of memory: Kill process N ... or
            # sacrifice child')
            return None
        if _is_title(cand) and a.killed_pid is None and b.killed_pid is not None:
            return None  # a title without the body's victim shows other facts: two
        if a.killed_pid is None or b.killed_pid is None or a.killed_pid == b.killed_pid:
            merged = _combine(primary=b if b.killer else a, secondary=a if b.killer else b)
            return Finding(cand.record, merged, cand.line_no, end)
        return None
    if _compatible(a, b) and _layered(cand, new):
        # one failure reported again by the layer above (a pack's 'Error during sampling: X',
        # then ComfyUI's '!!! Exception during processing !!! X'; an app's log line relaying
        # the exception it caught): not a repeat. The relay may lack the type: facts fill in.
        return replace(cand, event=_combine(primary=a, secondary=b), end_line_no=end)
    if (
        a.rule == b.rule == "cuda-exceed-allowed"
        and a.message.startswith("Requested")
        and new.line_no - cand.end_line_no <= 1
        and _compatible(replace(a, message=b.message), b)
    ):
        # cudaMallocAsync's table with its head cut by the paste, then the whole message again
        # (a console prints it twice): one failure, counted twice, its facts from the whole one
        merged = _combine(primary=b, secondary=a)
        return replace(cand, event=replace(merged, count=a.count + b.count), end_line_no=end)
    if (
        a.rule == b.rule == "tf-resource-exhausted"
        and a.pool is b.pool
        and not a.recovered
        and not b.recovered
        and _same_tensor(a.message, b.message)
    ):
        # TensorFlow reports one refused tensor several times, each naming its shape: the op
        # kernel's warning, the exception, session.run re-raising it, 'N root error(s) found'
        # restating it, an issue title copying one of them. One failure, shown that often.
        merged = _combine(primary=a, secondary=b)
        return replace(cand, event=replace(merged, count=a.count + b.count), end_line_no=end)
    if _title_copy(cand, new):
        # an issue title that is the message, then the body with it: one failure shown twice,
        # counted like a repeat (a title without the body's figures shows other facts: two)
        merged = replace(
            b,
            count=a.count + b.count,
            exception_type=_fuller_type(a.exception_type, b.exception_type),
        )
        return replace(cand, event=merged, end_line_no=end)
    if _same(a, b):
        count = a.count + b.count
        return replace(cand, event=replace(a, count=count), end_line_no=end)
    if (
        _compatible(a, b)
        and a.exception_type == b.exception_type
        and not _is_title(cand)
        and new.line_no - cand.end_line_no <= 1
    ):
        # the same line printed again right after, the message's next line (its figures)
        # following only the last copy (TensorRT's 'Error Code 2: OutOfMemory' twice, then
        # 'Requested amount of GPU memory (N bytes) ...'): a repeat, the figures its own. (A
        # copy without the type, or a title without the figures, shows other facts: two.)
        merged = _combine(primary=a, secondary=b)
        return replace(cand, event=replace(merged, count=a.count + b.count), end_line_no=end)
    return None


#: the old kernels' line choosing a victim, before the one that says it was killed
_RX_KILL_CHOICE = re.compile(r"(?:Memory cgroup )?[Oo]ut of memory: Kill process \d+ ")
#: what a layer that reports an exception it caught writes before the exception's own text:
#: 'Error during sampling: ', "An error occurred during video loading for '...': ", or
#: ComfyUI's exception header (a tqdm bar may be glued before either)
_RX_REPORT_LEAD = re.compile(
    r"(?:[^\n]*?(?:[Ee]rror|[Ff]ailed)[^\n]*?: |!!! Exception during processing !!! )$"
    # (or the relay names the failure in its own words right before the code: yuzu's 'Failed to
    # initialize GPU: Vulkan initialization error VK_ERROR_...')
    r"|[^\n]*?[Ff]ailed[^\n]*?: [^\n]*? error $"
)
_RX_DIGITS = re.compile(r"\d+")
#: how many lines may separate two layers' reports of one failure (a progress bar between)
_LAYER_GAP_LINES = 1


def _lead(finding: Finding) -> str | None:
    """The text before the event's message on its evidence line, without a log prefix."""
    lines = finding.record.text.split("\n")
    index = finding.line_no - finding.record.line_no
    if not 0 <= index < len(lines):
        return None
    line = split_prefix(lines[index]).message
    at = line.find(finding.event.message)
    return line[:at] if at > 0 else None


#: the refused tensor's shape in TensorFlow's 'OOM when allocating tensor with shape[...]'
_RX_TF_SHAPE = re.compile(r"with shape ?\[([\d,\s]*)\]", re.IGNORECASE)


def _same_tensor(one: str, two: str) -> bool:
    """Both of TensorFlow's messages name the same tensor shape (a scalar's ``shape[]`` says
    too little to tell two failures apart)."""
    a, b = _RX_TF_SHAPE.search(one), _RX_TF_SHAPE.search(two)
    return (
        a is not None
        and b is not None
        and a.group(1).strip() != ""
        and (a.group(1).replace(" ", "") == b.group(1).replace(" ", ""))
    )


def _is_title(finding: Finding) -> bool:
    """The event's line is a Markdown heading (an issue's title as the tracker pastes it)."""
    lines = finding.record.text.split("\n")
    index = finding.line_no - finding.record.line_no
    return 0 <= index < len(lines) and lines[index].startswith("# ")


def _title_copy(cand: Finding, new: Finding) -> bool:
    """``cand`` is an issue title that copies ``new``'s failure: the same rule, pool and
    facts, one message the start of the other (a title flattens the next console line onto
    the message, or cuts it), and at most the node that raised it missing (the body names it
    on the line before the message)."""
    a, b = cand.event, new.event
    if a.pool is not b.pool or not _is_title(cand):
        return False
    if not _one_starts_the_other(a, b) and not _title_holds_the_rest(a, b):
        return False
    if a.node_type is not None and a.node_type != b.node_type:
        return False
    if not _same_type(a.exception_type, b.exception_type):
        return False
    copy = replace(
        a,
        message=b.message,
        node_type=b.node_type,
        node_id=b.node_id,
        count=b.count,
        exception_type=b.exception_type,
    )
    return copy == b


def _title_holds_the_rest(title: OomEvent, body: OomEvent) -> bool:
    """The title copies the body's message without what the body's line had before it (c10's
    '[enforce fail at ...] data. ' before 'DefaultCPUAllocator: ...'): the same rule, and the
    title's message, without its heading mark and closing stop, the end of the body's."""
    if title.rule != body.rule:
        return False
    one = title.message.lstrip("# ").rstrip(_QUOTE_END)
    two = body.message.rstrip(_QUOTE_END)
    return len(one) >= 20 and len(two) > len(one) and two.endswith(one)


def _same_type(title: str | None, body: str | None) -> bool:
    """A title's exception type and the body's name the same exception: equal, the body's
    relay without the type ('!!! Exception during processing !!! Allocation on device'), or
    one without its module ('torch.OutOfMemoryError' in the title, a pack's 'OutOfMemoryError:'
    relaying it in the body)."""
    if title == body or body is None:
        return True
    if title is None:
        return False  # (the body shows a fact the title does not: two observations)
    return title.endswith("." + body) or body.endswith("." + title)


def _fuller_type(a: str | None, b: str | None) -> str | None:
    """Of two names of one exception type (``_same_type``), the one with its module."""
    if a is None or b is None:
        return a or b
    return a if len(a) >= len(b) else b


def _layered(cand: Finding, new: Finding) -> bool:
    """``new`` is the same failure as ``cand`` reported again by the layer that caught it:
    the two lines lead into the same message with different reporting words, each ending in
    ': ' or ComfyUI's header. A storm repeats its line whole (the same lead, or none), and a
    title (a Markdown heading) repeating its body is the user's copy: both stay counted."""
    if new.line_no - cand.end_line_no - 1 > _LAYER_GAP_LINES:
        return False
    a, b = _lead(cand), _lead(new)
    # (compared without their digits or the whitespace around them: a line repeated with a new
    # timestamp, or pasted once with an indent, is a repeat)
    if a is None or b is None or _RX_DIGITS.sub("", a).strip() == _RX_DIGITS.sub("", b).strip():
        return False
    if a.lstrip().startswith("#") or b.lstrip().startswith("#"):
        return False
    return bool(_RX_REPORT_LEAD.search(a)) and bool(_RX_REPORT_LEAD.search(b))


#: what a quoted or bolded message may end with: its quote, its bold marks, a full stop (and a
#: title the user's question mark: '# torch.OutOfMemoryError: CUDA out of memory ？')
_QUOTE_END = "\"'`*.\u201d ?\uff1f"


def _repeated_report(a: OomEvent, b: OomEvent) -> bool:
    """``b`` tells ``a``'s report of a kill with no victim named again: the same rule and
    facts, and one message the start of the other (a title's dialog text, then the body
    quoting it, each with its own closing quote or full stop)."""
    if not _one_starts_the_other(a, b):
        return False
    return replace(a, message="", count=1) == replace(b, message="", count=1)


def _one_starts_the_other(a: OomEvent, b: OomEvent) -> bool:
    """The same rule, and one message the start of the other once each loses its closing
    quote or full stop (a copy cut short, or with the next line flattened onto it)."""
    one, two = a.message.rstrip(_QUOTE_END), b.message.rstrip(_QUOTE_END)
    # (a title, rendered, collapses a console's padding: '# zsh: killed python export.py' for
    # 'zsh: killed     python export.py')
    one, two = " ".join(one.split()), " ".join(two.split())
    # (a title capitalises the line it copies: '# Terminate called after throwing ...')
    one, two = one[:1].lower() + one[1:], two[:1].lower() + two[1:]
    return a.rule == b.rule and (one.startswith(two) or two.startswith(one))


def _sigterm_then_shell_kill(a: OomEvent, b: OomEvent) -> bool:
    """A kill sent as SIGTERM (earlyoom's first try), then a shell's 'Killed' (SIGKILL's
    report): the program caught the SIGTERM and went on, and something else (the kernel,
    earlyoom's later SIGKILL) ended it."""
    return (
        dict(a.extra).get("signal") == "SIGTERM"
        and b.rule == "shell-killed"
        and b.killed_pid is None
    )


#: rules whose failure is printed over two lines, each of which a rule reads
_TOLD_TWICE = frozenset(
    {"vulkan-device-oom", "cxx-bad-alloc", "vulkan-out-of-device-memory", "gl-out-of-memory"}
)


def _compatible(a: OomEvent, b: OomEvent) -> bool:
    """The same rule, pool and message, and no fact the two both show differs (one may not
    show a fact the other does: a relay without the exception's type)."""
    if a.rule != b.rule or a.message != b.message or a.pool is not b.pool:
        return False
    if a.recovered != b.recovered:
        return False
    return all(
        unknown(getattr(a, name))
        or unknown(getattr(b, name))
        or getattr(a, name) == getattr(b, name)
        for name in MERGED_FIELDS
    )


def _same(a: OomEvent, b: OomEvent) -> bool:
    if a.rule != b.rule or a.message != b.message or a.pool is not b.pool:
        return False
    return a == replace(b, count=a.count)


def _add_extra(
    extra: tuple[tuple[str, Any], ...], key: str, value: Any
) -> tuple[tuple[str, Any], ...]:
    return (*((k, v) for k, v in extra if k != key), (key, value))


def _combine(primary: OomEvent, secondary: OomEvent) -> OomEvent:
    """Fields of ``primary``, with its unknowns (``MERGED_FIELDS``) filled from ``secondary``."""
    updates: dict[str, Any] = {
        name: getattr(secondary, name)
        for name in MERGED_FIELDS
        if unknown(getattr(primary, name)) and not unknown(getattr(secondary, name))
    }
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

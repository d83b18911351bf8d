"""Put log lines back together into the records ComfyUI wrote, so a traceback is classified whole.

ComfyUI logs a traceback, a ``Memory summary:`` table or a multi-line exception message as one
write; the files we read split it into lines. The classifier needs the whole record: the node
type sits in an Error Report header, the numbers of a cudaMallocAsync OOM sit on the lines
after ``Allocation on device 0 would exceed allowed memory``.

How a record ends (the next line decides):

* A line with a record-starting prefix (ComfyUI-Manager ``[2026-…] ``, ``/internal/logs``
  ``ISO - ``, Desktop electron-log, Python-logging launchers, ``ERROR:root:``, ``[INFO] ``;
  see logformat.py) always starts a new record.
* A bare line (no such prefix; per-line prefixes such as journald's are removed first)
  continues the pending record when it is blank, starts with whitespace, is a row of a memory
  summary table, sits inside a traceback (up to and including its final exception line), is
  one of the known continuation lines of a torch/ComfyUI message (``Currently allocated :``,
  ``TIPS:``, ``CUDA kernel errors might be…``), is the ``Traceback`` after a ``!!! Exception
  during processing !!!`` header or a chained exception, is the message line of an old UI
  dialog (``Error occurred when executing X:``), or belongs to a pasted ComfyUI Error Report
  (up to its ``## System Information``). Any other bare line starts a new record.
  The wrappers leave a multi-line write's continuation lines bare; the rules above cover the
  ones that matter (tracebacks, tables, torch's multi-line messages) without trusting that a
  whole file keeps one format, so a paste that mixes formats cannot swallow what follows.
* The caller ends the last record with ``flush()``: at end of file, or when a followed file has
  been idle for a moment (the log follower decides how long; a second or two is enough,
  ComfyUI writes a record in one go).

Memory is bounded: a record keeps its first ``head_lines`` lines and its last lines up to
``max_lines`` / ``max_bytes`` (256 KiB / 2,000 lines by default); the middle of a longer
record is dropped and counted. A record's offsets still span the whole record, so the caller
can commit offsets only up to ``pending_start_offset`` and a restart re-reads exactly the
record that was incomplete.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from oom_sentinel.daemon.logs.prefix import split_prefix

__all__ = [
    "DEFAULT_HEAD_LINES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_LINES",
    "MAX_LINE_CHARS",
    "Record",
    "RecordAssembler",
]

DEFAULT_MAX_BYTES = 256 * 1024
DEFAULT_MAX_LINES = 2000
DEFAULT_HEAD_LINES = 200
#: a longer line keeps its first and last halves
MAX_LINE_CHARS = 64 * 1024

# Lines that continue the message of the record before them (bare streams only).
_CONTINUATION = re.compile(
    r"(?:Currently allocated\s*:|Requested\s*:?\s*\d|Device limit\s*:?\s*\d|Free \(according to CUDA\)"
    r"|would exceed allowed memory"
    r"|PyTorch limit \(set by|This error means you ran out of memory|TIPS: "
    r"|CUDA kernel errors might|HIP kernel errors might|For debugging consider passing"
    r"|Compile with `TORCH_USE|Search for `(?:cuda|hip)Error|Exception raised from "
    r"|frame #\d|During handling of the above exception|The above exception was the direct"
    r"|Use PYTORCH_MPS_HIGH_WATERMARK|If reserved but unallocated|If reserved memory is >>"
    r"|See documentation for Memory|Stopped to avoid memory problems"
    r"|Ran out of memory \(used over "  # a host's reason under its 'Instance failed: <id>'
    r"|Memory on the node \(IP: "  # Ray's victim line under its memory monitor's kill
    r"|(?:radv/)?amdgpu: {2,}\w+ +: "  # Mesa's fields under 'Failed to allocate a buffer:'
    r"|(?:err: +)?(?:Size|Alignment|Mem flags|Mem types): +(?:0x)?[0-9a-fA-F]+\s*$"  # DXVK's
    r"|(?:err: +)?Heap \d+: \d+ MB allocated"  # (its heaps under the same failure)
    # Unreal's fatal error: the nested header, the thread's words, the allocator's refusal
    r"|Rendering thread exception:|LowLevelFatalError \[File:|Ran out of memory allocating \d"
    r"|exception thrown: abort\(OOM\)"  # Emscripten's abort under the runtime's bare 'OOM'
    r"|:\s*\d[\d.,]* ?[KMGT]i?B\b)"  # the PyTorch limit's value, its column spacing collapsed
)
#: the later sentences of torch's device and MPS messages: a line starting with one continues a
#: record that said "out of memory" (a message hard-wrapped, or re-wrapped at its sentences);
#: the CPU allocator's second clause ("...can't allocate memory: you / tried to allocate N
#: bytes") continues one that named the allocator, TensorRT's warning with the request its
#: allocator's error
_OOM_SENTENCE = re.compile(
    r"(?:Tried to allocate |tried to allocate \d|(?:\[\d\d/\d\d/\d{4}-[\d:]+\] )?(?:\[(?:W|TRT)\] ){0,2}Requested amount of GPU memory \(|Of the allocated memory |Including non-PyTorch memory"
    r"|GPU \d+ has a total capac|Process \d+ has "
    r"|(?:and )?\d[\d.,]* ?[KMGT]i?B (?:is )?(?:free|reserved|already|total capac))"
)
#: a console's width below which a line cut mid-word is taken as the user's own short line
_HARD_WRAP_MIN_CHARS = 80
#: the words a console's wrap is mended across when it cut them (``_wrap_cut_words``)
_WRAP_CUT_WORDS = ("the paging file is too small", "out of memory", "tried to allocate")  # (lower)
_SEAM_CHARS = 40
#: how a message's hard-wrapped rest begins: a lower-case word or a unit
_WRAPPED_ON = re.compile(r"(?:[a-z]|[KMGT]i?B\b|\d[\d.,]* ?[KMGT]i?B\b)")  # (or a figure)
#: what a line of torch's device message holds (the only message a console wrap is joined for)
_TORCH_FIGURE_MARKS = (
    "Tried to allocate",
    "total capac",
    "already allocated",
    "allocated memory",
    "allocated by PyTorch",
    "reserved in total",
    "reserved by PyTorch",
    "memory in use",
)
#: a line that ends a sentence or a message ('.', ')', ':', a full-width full stop, ...)
_SENTENCE_ENDED = re.compile(r"(?:[.)\]:;!?\u3002\uff09`\"']|_ALLOC_CONF)\s*$")
_EXCEPTION_LINE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)(?::|$)"
)
#: an exception type and its colon, alone on a line ('torch.cuda.OutOfMemoryError:')
_BARE_TYPE = re.compile(r"(?:(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception):\s*)+")
_TRACEBACK = "Traceback (most recent call last):"
_HEADER = "!!! Exception during processing !!!"
_REPORT = "# ComfyUI Error Report"
_REPORT_END = ("## System Information", "## Logs", "## Attached Workflow", "## Additional Context")
_DIALOG = "Error occurred when executing "


def _says_oom(message: str) -> bool:
    """The line says memory ran out, so the message's later sentences may follow on lines of
    their own (``_OOM_SENTENCE``): torch's words, the CPU allocator's, TensorRT's allocator."""
    return (
        "out of memory" in message
        or "CPUAllocator" in message
        or "[enforce fail at" in message
        or "Error Code 2: OutOfMemory" in message
    )


def wrap_cut_words(line: str, following: str) -> bool:
    """A console's fixed-width hard wrap cut a failure's own words in two: ``line`` is long,
    stops mid-word, and the words run on across the cut into ``following`` ('...
    CreateComputeSystem <id>: The paging fi' / 'le is too small for this operation ...').
    Only those words: a long line cut mid-word before some other line is left alone."""
    last = line.rstrip("\r\n")
    # (cut mid-word, or at a word's end with its blank kept: '... Resource exhausted: Out ' /
    # 'of memory while trying to allocate ...')
    if len(last) < _HARD_WRAP_MIN_CHARS or not last.rstrip(" ")[-1:].isalpha():
        return False
    seam = (last[-_SEAM_CHARS:] + following[:_SEAM_CHARS]).lower()
    cut = len(last[-_SEAM_CHARS:])
    for words in _WRAP_CUT_WORDS:
        at = seam.find(words)
        if 0 <= at < cut < at + len(words):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Record:
    """One logical log record: a line and its continuation lines (text without prefixes' removal).

    ``start_offset``/``end_offset`` are the byte offsets of the record in its file (end is
    exclusive, after the newline); ``timestamp`` is the prefix timestamp of its first line.
    """

    text: str
    start_offset: int
    end_offset: int
    timestamp: str | None
    #: 1-based line number of the first line, counting every line fed to the assembler
    line_no: int = 0
    #: how many lines the record had (dropped middle lines included)
    line_count: int = 1
    #: lines dropped from the middle because the record was over the cap
    dropped_lines: int = 0


class RecordAssembler:
    """Incremental record assembly with bounded memory. Not thread-safe; one per file."""

    # state of the pending record (reset by _reset_pending)
    _head: list[str]
    _head_bytes: int
    _tail: deque[str]
    _tail_bytes: int
    _count: int
    _dropped: int
    _start: int
    _end: int
    _timestamp: str | None
    _first_line_no: int
    _in_traceback: bool
    _after_exception: bool
    _report: bool
    _dialog_lines: int
    #: the last line that was not blank is an exception type alone ('torch.cuda.OutOfMemoryError:')
    _bare_type: bool
    _table: bool
    _header: bool
    _oom_said: bool

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_lines: int = DEFAULT_MAX_LINES,
        head_lines: int = DEFAULT_HEAD_LINES,
        first_line_no: int = 1,
    ) -> None:
        self._max_bytes = max(1024, max_bytes)
        self._max_lines = max(4, max_lines)
        self._head_cap = max(1, min(head_lines, self._max_lines // 2))
        self._next_line_no = first_line_no
        self._reset_pending()

    # -- public API -------------------------------------------------------------------------

    @property
    def pending_start_offset(self) -> int | None:
        """Byte offset where the pending (incomplete) record starts, or None when none is."""
        return self._start if self._count else None

    @property
    def pending_line_no(self) -> int | None:
        """Line number of the pending record's first line, or None when none is pending."""
        return self._first_line_no if self._count else None

    @property
    def next_line_no(self) -> int:
        return self._next_line_no

    def feed(self, text: str, start_offset: int = 0, end_offset: int = 0) -> list[Record]:
        """Feed one line (without its newline; several lines joined by ``\\n`` are split).

        Returns the records this line completed (usually none or one).
        """
        if "\n" not in text:
            return self._feed_line(text.rstrip("\r"), start_offset, max(end_offset, start_offset))
        out: list[Record] = []
        parts = text.split("\n")
        pos = start_offset
        for i, part in enumerate(parts):
            if i == len(parts) - 1:
                if part == "" and text.endswith("\n"):
                    break
                end = max(end_offset, pos)
            else:
                end = min(pos + len(part.encode("utf-8", "replace")) + 1, max(end_offset, pos))
            out.extend(self._feed_line(part.rstrip("\r"), pos, end))
            pos = end
        return out

    def feed_line(self, line: str, start_offset: int = 0, end_offset: int = 0) -> list[Record]:
        """``feed`` for text known to hold one line without its newline (the scanners' path)."""
        return self._feed_line(
            line.rstrip("\r") if line.endswith("\r") else line,
            start_offset,
            max(end_offset, start_offset),
        )

    def extend_indented(self, block: str, end_offset: int) -> bool:
        """Append ``block`` — lines joined by ``\\n``, each starting with a space or a tab — to
        the pending record, exactly as feeding them one by one would. The byte scanner's fast
        path for traceback bodies. Returns False (and changes nothing) when it cannot take the
        block: no pending record, or a line over ``MAX_LINE_CHARS``.
        """
        if not self._count:
            return False
        lines = block.split("\n")
        if "\r" in block:
            lines = [line.rstrip("\r") for line in lines]
        if len(block) > MAX_LINE_CHARS and max(map(len, lines)) > MAX_LINE_CHARS:
            return False
        n = len(lines)
        self._count += n
        self._next_line_no += n
        i = 0
        half = self._max_bytes // 2
        size = sum(map(len, lines)) + n
        if (
            len(self._head) + n <= self._head_cap
            and self._head_bytes + size - len(lines[-1]) - 1 < half
        ):
            # all of it fits in the head: the loop below would take every line
            self._head.extend(lines)
            self._head_bytes += size
            i = n
        while i < n and len(self._head) < self._head_cap and self._head_bytes < half:
            self._head.append(lines[i])
            self._head_bytes += len(lines[i]) + 1
            i += 1
        if i < n:
            rest = lines[i:] if i else lines
            self._tail.extend(rest)
            self._tail_bytes += sum(map(len, rest)) + len(rest)
            tail = self._tail
            while len(tail) > 1 and (
                len(self._head) + len(tail) > self._max_lines
                or self._head_bytes + self._tail_bytes > self._max_bytes
            ):
                self._tail_bytes -= len(tail.popleft()) + 1
                self._dropped += 1
        if (
            "summary:" in block
            or "status:" in block
            or ("|" in block and any(line.lstrip().startswith("|") for line in lines))
        ):
            self._table = True
        # the rest of the bare-stream state ``_append`` keeps: an indented line never starts
        # or ends a traceback, but it may say out of memory (a console's hard wrap may follow)
        # or be an exception type alone on its line
        if "out of memory" in block or "CPUAllocator" in block or "[enforce fail at" in block:
            self._oom_said = True
        for line in reversed(lines):
            if line.strip():
                self._bare_type = _BARE_TYPE.fullmatch(line.strip()) is not None
                break
        if self._dialog_lines:
            self._dialog_lines += sum(1 for line in lines if line.strip())
        self._end = max(self._end, end_offset)
        return True

    def skip_lines(self, count: int) -> None:
        """``count`` lines were not fed: each was a single-line record of its own that the caller
        dealt with (the byte scanner's plain-line runs). Only line numbering moves on; the
        pending record is ended by the next line fed, which must start a record."""
        self._next_line_no += count

    def flush(self) -> list[Record]:
        """End the pending record (end of file, or the file went idle)."""
        if not self._count:
            return []
        record = self._emit()
        self._reset_pending()
        return [record]

    # -- internals --------------------------------------------------------------------------

    def _reset_pending(self) -> None:
        self._head = []
        self._head_bytes = 0
        self._tail = deque()
        self._tail_bytes = 0
        self._count = 0
        self._dropped = 0
        self._start = 0
        self._end = 0
        self._timestamp = None
        self._first_line_no = 0
        # state of a bare-stream record
        self._in_traceback = False
        self._after_exception = False
        self._report = False
        self._dialog_lines = 0
        self._table = False
        self._header = False
        self._oom_said = False
        self._bare_type = False

    def _feed_line(self, line: str, start: int, end: int) -> list[Record]:
        if len(line) > MAX_LINE_CHARS:
            half = MAX_LINE_CHARS // 2
            line = f"{line[:half]} [...] {line[-half:]}"
        if self._count and line[:1] in (" ", "\t"):
            # hot path: an indented line always continues (no prefix starts with whitespace)
            self._next_line_no += 1
            self._append(line, line)
            self._end = max(self._end, end)
            return []
        split = split_prefix(line)
        line_no = self._next_line_no
        self._next_line_no += 1
        out: list[Record] = []
        if split.starts_record:
            if self._count:
                out.append(self._emit())
            self._begin(line, split.message, split.timestamp, start, line_no)
        elif self._count and self._continues(split.message):
            self._append(line, split.message)
        else:
            if self._count:
                out.append(self._emit())
            self._begin(line, split.message, split.timestamp, start, line_no)
        self._end = max(self._end, end)
        return out

    def _begin(
        self, raw: str, message: str, timestamp: str | None, start: int, line_no: int
    ) -> None:
        # every field of the pending record is set here (no _reset_pending first: a record
        # starts for most lines the scanners feed)
        self._start = start
        self._end = start
        self._timestamp = timestamp
        self._first_line_no = line_no
        self._head = [raw]
        self._head_bytes = len(raw) + 1
        self._count = 1
        if self._tail:
            self._tail = deque()
        self._tail_bytes = 0
        self._dropped = 0
        self._after_exception = False
        self._in_traceback = message.startswith(_TRACEBACK)
        # the Error Report's heading in any language: a Markdown H1 naming ComfyUI ("# ComfyUI
        # Error Report", "# ComfyUI 错误报告", "# Relatório de Erro do ComfyUI")
        self._report = (
            message.startswith(_REPORT)
            or (message.startswith("# ") and "ComfyUI" in message[:80])
            or message.startswith("## Error Details")  # a report pasted without its heading
        )
        # (the dialog's first line may be pasted inside inline-code backticks or bold)
        # (bold, inline code or a Markdown quote's '> ' around it)
        self._dialog_lines = 1 if message.lstrip("`*> ").startswith(_DIALOG) else 0
        self._table = "summary:" in message or "status:" in message
        self._header = message.startswith(_HEADER)
        self._oom_said = _says_oom(message)
        self._bare_type = _BARE_TYPE.fullmatch(message.strip()) is not None

    def _append(self, raw: str, message: str) -> None:
        self._count += 1
        if message.strip():  # (blank lines keep it: 'ResourceExhaustedError:', '', the message)
            self._bare_type = _BARE_TYPE.fullmatch(message.strip()) is not None
        if len(self._head) < self._head_cap and self._head_bytes < self._max_bytes // 2:
            self._head.append(raw)
            self._head_bytes += len(raw) + 1
        else:
            self._tail.append(raw)
            self._tail_bytes += len(raw) + 1
            while len(self._tail) > 1 and (
                len(self._head) + len(self._tail) > self._max_lines
                or self._head_bytes + self._tail_bytes > self._max_bytes
            ):
                dropped = self._tail.popleft()
                self._tail_bytes -= len(dropped) + 1
                self._dropped += 1
        # keep the bare-stream state current
        stripped = message.lstrip()
        if message.startswith(_TRACEBACK):
            self._in_traceback = True
            self._after_exception = False
            self._header = False
        elif (
            self._in_traceback
            and message
            and message == stripped
            and not message.startswith("^")
            and (_EXCEPTION_LINE.match(message) or not message.startswith(("File ", "[Previous")))
        ):
            # the first unindented line after the frames is the exception line: it ends the
            # traceback (pasted tracebacks that lost their indentation end early, harmlessly)
            self._in_traceback = False
            self._after_exception = True
        if _says_oom(message):
            self._oom_said = True
        if stripped.startswith("|"):
            self._table = True
        if "summary:" in message or "status:" in message:
            self._table = True
        if self._dialog_lines and message.strip():
            self._dialog_lines += 1

    def _continues(self, message: str) -> bool:
        """Does this bare line continue the pending record (bare streams only)?"""
        if not message or message.isspace():
            return True
        first = message[0]
        if first in " \t":
            return True
        if first == "E" and message.startswith(_DIALOG):
            return False  # a new dialog (a title that glued one onto a line, then the dialog)
        if self._bare_type:
            return True  # an exception type alone on its line, its message on the next
        if self._oom_said:
            last = self._tail[-1] if self._tail else self._head[-1]
            if last.endswith("[enforce fail at"):
                return True  # c10's enforce line wrapped right after its opening words
            if (
                message.startswith(("DefaultCPUAllocator: ", "CPUAllocator: "))
                and "alloc_cpu.cpp" in last
                and "CPUAllocator" not in last
            ):
                return True  # ... and its allocator's words wrapped onto a line of their own
        if self._report:
            if message.startswith(_REPORT_END):
                return False
            return (
                first in "#-`|"
                or message.startswith(('File "', "^"))
                or _CONTINUATION.match(message) is not None
            )
        if self._in_traceback:
            return True
        if first == "|" or (first == "=" and self._table):
            return True
        if message.startswith(_TRACEBACK):
            # a traceback right after ComfyUI's header, or a chained exception
            return self._header or self._after_exception
        if self._dialog_lines == 1:
            return True
        if first == "F" and self._dialog_lines and message.startswith('File "'):
            return True
        if first == "^" or first == "~":
            return True
        if self._oom_said and _OOM_SENTENCE.match(message) is not None:
            return True
        if (
            self._oom_said
            and _WRAPPED_ON.match(message) is not None
            and "out of memory" not in message  # (a wrapped rest never starts the message again)
        ):
            # a console's hard wrap inside the message: the line before stopped mid-sentence
            # ('... (GPU 0; 39.56' / 'GiB total capacity; ...', '... this ' / 'process has ...')
            last = self._tail[-1] if self._tail else self._head[-1]
            if (
                len(last) >= 60
                and _SENTENCE_ENDED.search(last) is None
                and any(mark in last for mark in _TORCH_FIGURE_MARKS)
            ):
                return True
        if first.islower() and self._wrap_cut_words(message):
            return True
        if first == "o" and message.startswith("out of memory"):
            # a driver's error string on the line after the program's lead for it
            # ('... State.hs:86 (unhandled): CUDA Exception:' / 'out of memory')
            last = (self._tail[-1] if self._tail else self._head[-1]).rstrip()
            if last.endswith(("Exception:", "Error:")):
                return True
        return _CONTINUATION.match(message) is not None

    def _wrap_cut_words(self, message: str) -> bool:
        """See ``wrap_cut_words``: the pending record's last line, then ``message``."""
        return wrap_cut_words(self._tail[-1] if self._tail else self._head[-1], message)

    def _emit(self) -> Record:
        lines = self._head
        if self._dropped:
            lines = [*lines, f"[... {self._dropped} lines dropped ...]"]
        if self._tail or self._dropped:
            text = "\n".join([*lines, *self._tail])
        else:
            text = lines[0] if len(lines) == 1 else "\n".join(lines)
        # positional: the fields in their declared order (a record is built for most lines)
        return Record(
            text,
            self._start,
            max(self._end, self._start),
            self._timestamp,
            self._first_line_no,
            self._count,
            self._dropped,
        )

"""The rules: one log record (or a ComfyUI ``execution_error``) in, the OOM event it shows out:
which pool ran out, on which backend, by how much, in which node, and whether ComfyUI
recovered.

Everything here is pure and never raises: the input is whatever a log, a user's paste or a
websocket handed us. The rules follow the texts the producers really print (comfyui-facts.md
§2 and §11, torch's allocator messages across versions, the kernel's and earlyoom's kill lines)
and are checked against a labelled corpus of excerpts users posted (tests/corpus/).

A rule fires on a *message structure*, never on the bare words "out of memory": prose such as
"it gets out of memory quick" or a node called ``OutOfMemoryGuard`` stays negative.

Every rule needs one of ``NEEDLES`` in the text. That is the cheap prefilter the file scanner
runs over raw bytes before anything is decoded or split into lines (classify/prefilter.py),
and because ``classify_record`` checks the same needles first, the prefilter can never hide
an event.

Units: torch (CUDA/HIP/XPU ``format_size``), MPS (``GB``/``MB`` computed with 1024), numpy
(``MiB``/``GiB``), the kernel (``kB``) and earlyoom (``MiB``) all print binary multiples, so
every K/M/G here is 1024-based (``units.size_bytes``, the project's one reading of a size).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from oom_sentinel.daemon.classify.events import Backend, OomEvent, OtherProcess, Pool
from oom_sentinel.daemon.core.units import KIB, MIB, size_bytes
from oom_sentinel.daemon.kernel.earlyoom import (
    EARLYOOM_GATES,
    EARLYOOM_KILL,
    EarlyoomKill,
    earlyoom_kill_of,
)
from oom_sentinel.daemon.kernel.lines import KernelOomLine, kernel_lines
from oom_sentinel.daemon.kernel.nohang import NOHANG_ACTION
from oom_sentinel.daemon.logs.prefix import split_prefix, strip_ansi
from oom_sentinel.daemon.logs.records import wrap_cut_words

#: Substrings at least one of which every detectable OOM text contains (see module docstring).
#: Chosen for the speed of ``bytes.find``: long or upper-case needles skip fastest.
NEEDLES: tuple[str, ...] = (
    "emory",  # out of memory, MemoryError, not enough memory, video memory, Memory cgroup
    "llocat",  # cudaMallocAsync's 'Allocation on device', 'Tried to allocate', 'Could not allocate'
    "_STATUS_",  # CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_NOT_ALLOCATED, ...
    "OOM",  # Got an OOM, OOMed, the OOM killer
    "Killed",  # bare Killed, Killed process
    "rror 1455",  # os error 1455, WinError 1455 (the paging file, in any language)
    "sending SIG",  # earlyoom
    "with signal ",  # earlyoom before 2019: 'killing process N "name" with signal 15: badness'
    "nvalid buffer",  # MPS: Invalid buffer size: 8.21 GB (no memory words at all)
    "oom-kill",  # the kernel: pt_main_thread invoked oom-killer, oom-kill:constraint=...
    "CUDA:",  # a check's CUDA error string, e.g. machine-translated: 'CUDA:没有记忆'
    "OUT_OF_",  # driver APIs' error names: CUDA_ERROR_OUT_OF_MEMORY, UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY
    "killed  ",  # zsh's job reports, padded: 'zsh: killed     python', '[1]    9301 killed     python'
    "reason=oom",  # Electron (ComfyUI Desktop's log): 'render-process-gone reason=oom'
    "已杀死",  # bash's 'Killed' in a zh_CN locale (glibc's strsignal(SIGKILL) there)
    "paging file",  # Windows' 'The paging file is too small ...' without its error number
    "too small for this operation",  # the same, a console's hard wrap cutting 'paging fi/le'
    "sufficient free VRAM",  # ACE-Step's pre-flight: 'Insufficient free VRAM: need ~1.1 GB'
    "all available RAM",  # Colab's 'Your session crashed after using all available RAM'
    "页面文件太小",  # Windows' zh-CN text of the paging-file error (1455), quoted without its number
    "0x800705AF",  # the same error as an HRESULT (.NET's COMException), in any language
    "0x8007000",  # ERROR_NOT_ENOUGH_MEMORY's and E_OUTOFMEMORY's HRESULTs (0x80070008, 0x8007000E)
    "bad_alloc",  # C++'s failed allocation: std::bad_alloc
    "of GPU resources",  # OpenVINO's GPU plugin: '[GPU] out of GPU resources'
    "mem_buffer != NULL",  # ggml's context allocation: 'GGML_ASSERT(ctx->mem_buffer != NULL) failed'
    "to the victim",  # nohang: 'Send SIGTERM to the victim; total response time: 13246 ms'
    "zsh: killed",  # zsh's job report retyped with one space: 'zsh: killed python export.py'
    "than buffer maximum",  # ggml-metal: "buffer 'data' size N is larger than buffer maximum of M"
    "GC overhead limit",  # the Java VM's heap: 'GC overhead limit exceeded' (a title without its type)
    "to cudaMalloc",  # faiss: 'Failed to cudaMalloc' (a title holding only its head)
    "oom_kill event",  # Slurm 21.08 on: 'Detected 1 oom_kill event in StepId=...' (a title)
    "Invoking oom killer",  # earlyoom's old -k mode, the kernel's killer asked: 'Invoking oom killer: done'
    "newBufferWith",  # Metal's debug layer refusing a buffer over its limit (iOS)
    "signal terminated program",  # gcc's report of a killed cc1plus in any locale ('Morto signal ...')
    "process oom",  # Electron: 'Renderer process oom - see https://www.electronjs.org/...'
    "reason: oom",  # Electron's render-process-gone details printed as an object
    "reason: 'oom'",  # (the same as Node's util.inspect quotes it)
    "OutOfMemory(",  # V8's fatal handler as a crash report's frame: 'V8::FatalProcessOutOfMemory('
    "mach_vm_map(",  # macOS's malloc: '*** mach_vm_map(size=193413120) failed (error code=3)'
    "errno=1455",  # Go's runtime on Windows: 'VirtualAlloc of N bytes failed with errno=1455'
    "; errno 12",  # InnoDB's buffer pool: 'InnoDB: mmap(N bytes) failed; errno 12'
    "RESOURCE_TYPE_MEMORY",  # iOS's per-app limit: 'EXC_RESOURCE (RESOURCE_TYPE_MEMORY: ...)'
    "536870904",  # Chromium's renderer OOM exit code in Electron's dialog ('code: -536870904')
    "collector is thrashing",  # Gradle's daemon: '... since the JVM garbage collector is thrashing'
    "out of heap space",  # MSVC: 'fatal error C1060: compiler is out of heap space'
    "Not enough RAM!",  # Photopea: 'Not enough RAM! (Need 3043MB )'
    "circuit_breaking_exception",  # Elasticsearch's breakers: '[circuit_breaking_exception] [parent]'
    "Data too large",  # (their message: '[parent] Data too large, data for [<http_request>] ...')
    "maximum array size",  # MATLAB: 'Requested 90816x90816 (61.4GB) array exceeds maximum array size'
    "Heap exhausted",  # GHC's runtime: 'prog: Heap exhausted;'
    "PBS: job killed",  # PBS: '=>> PBS: job killed: mem 38427376kb exceeded limit 33554432kb'
    "Insufficient VRAM",  # exllama: 'Insufficient VRAM for model and cache'
    "insufficient system resources",  # LM Studio's guardrail: 'Model loading was stopped due to ...'
)

_K = KIB
#: (up to numpy's absurd 'EiB')
_SIZE = r"(\d+(?:,\d{3})*(?:\.\d*)?)\s?(bytes|byte|[KMGTPE]i?B|kB|B)\b"


#: Set by the scanner's prefilter once it has built its Aho-Corasick automaton
#: (classify/prefilter.py, the ``fast`` extra): True when UTF-8 bytes hold a needle, in one
#: pass. The daemon, which never scans, never sets it and never loads the automaton.
_bytes_has_needle: Callable[[bytes], bool] | None = None
#: from this length on, one automaton pass over the encoded text beats ten ``in`` tests (a
#: traceback's frames, several KiB without a needle, cost ten full passes otherwise)
_AUTOMATON_MIN_CHARS = 1024


def has_needle(text: str) -> bool:
    """True when ``text`` could hold an OOM (the scanner's prefilter, on str)."""
    if _bytes_has_needle is not None and len(text) >= _AUTOMATON_MIN_CHARS:
        # the needles are ASCII and UTF-8 keeps every ASCII substring as it is (no multi-byte
        # sequence holds an ASCII byte): the answer is the same as the tests below
        return _bytes_has_needle(text.encode("utf-8", "surrogatepass"))
    return (  # spelled out: about three times faster than any() over NEEDLES
        "emory" in text
        or "OOM" in text
        or "Killed" in text
        or "llocat" in text
        or "_STATUS_" in text
        or "rror 1455" in text
        or "sending SIG" in text
        or "with signal " in text
        or "nvalid buffer" in text
        or "oom-kill" in text
        or "CUDA:" in text
        or "OUT_OF_" in text
        or "killed  " in text
        or "reason=oom" in text
        or "已杀死" in text
        or "paging file" in text
        or "too small for this operation" in text
        or "sufficient free VRAM" in text
        or "all available RAM" in text
        or "页面文件太小" in text
        or "0x800705AF" in text
        or "0x8007000" in text
        or "bad_alloc" in text
        or "of GPU resources" in text
        or "mem_buffer != NULL" in text
        or "to the victim" in text
        or "zsh: killed" in text
        or "than buffer maximum" in text
        or "GC overhead limit" in text
        or "to cudaMalloc" in text
        or "oom_kill event" in text
        or "Invoking oom killer" in text
        or "newBufferWith" in text
        or "signal terminated program" in text
        or "process oom" in text
        or "reason: oom" in text
        or "reason: 'oom'" in text
        or "OutOfMemory(" in text
        or "mach_vm_map(" in text
        or "errno=1455" in text
        or "; errno 12" in text
        or "RESOURCE_TYPE_MEMORY" in text
        or "536870904" in text
        or "collector is thrashing" in text
        or "out of heap space" in text
        or "Not enough RAM!" in text
        or "circuit_breaking_exception" in text
        or "Data too large" in text
        or "maximum array size" in text
        or "Heap exhausted" in text
        or "PBS: job killed" in text
        or "Insufficient VRAM" in text
        or "insufficient system resources" in text
    )


# --------------------------------------------------------------------------------------------
# message rules
# --------------------------------------------------------------------------------------------

_M = re.MULTILINE
_RX_OOMD = re.compile(
    r"\bKilled (/\S+) due to (?:memory|swap)"
    # (its own journal line, whatever follows the unit: a paste cut after it)
    r"|\bsystemd-oomd\[\d+\]: Killed (/\S+)"
)
#: oomd's older wording: its pressure line, then the pid it kills (the event starts at the
#: pressure line, where oomd's decision starts)
_RX_OOMD_ATTEMPT = re.compile(
    r"(?:systemd-oomd\[\d+\]: Memory pressure for \S+ is [\d.]+% > [\d.]+%[\s\S]{0,3000}?)?"
    r"\boomd attempting to kill (\d+) with (?:SIG)?(?:KILL|TERM)\b"
)
_RX_SYSTEMD_UNIT = re.compile(
    # (or first on its line, the journal's prefix and the unit dropped by the paste)
    r"(?:([\w@.\-]+): |^)A process of this unit has been killed by the OOM killer",
    _M,
)
#: systemd's verdict on the unit, the line after the one above or alone (a title quoting it):
#: the unit's cgroup saw an OOM kill. It names no killer: the kernel's and systemd-oomd's kills
#: end a unit the same way.
_RX_SYSTEMD_OOM_RESULT = re.compile(r"(?:([\w@.\-]+): )?\bFailed with result 'oom-kill'")
_RX_BASH_KILLED = re.compile(
    r"\bline \d+:\s+(\d+) Killed(?::\s*9)?(?:\s|$)", _M
)  # macOS bash: 'Killed: 9'
#: torch's DataLoader reporting a worker the OS SIGKILLed
_RX_WORKER_KILLED = re.compile(
    # (a title may generalise the pid: 'DataLoader worker (pid n) is killed ...')
    r"\bDataLoader worker (?:\(pid(?:\(s\))? (?:(\d+)|[A-Za-z]{1,3})\) )?is killed by signal: Killed\b"
)
#: Slurm's step daemon reporting the kernel's cgroup OOM killer in the job's cgroup
#: ('... in StepId=123.batch cgroup', older Slurm '... in step 123.batch cgroup')
_RX_SLURM_OOM = re.compile(
    r"\bDetected \d+ oom-kill event\(s\) in (?:step )?\S+ cgroup"
    # (Slurm 21.08 on: 'Detected 1 oom_kill event in StepId=440575.0. Some of the step tasks
    # have been OOM Killed.')
    # (its first sentence alone is a title's: '# slurmstepd: error: Detected 1 oom_kill event in
    # StepId=11300781.0.')
    r"|\bDetected \d+ oom_kill events? in StepId=\S+?(?:\.? Some of (?:the )?step tasks have been OOM"
    r" Killed|\.[ \t]*$)",
    _M,
)
#: flux's job shell relaying the kernel's cgroup OOM kill it read from memory.events
_RX_FLUX_SHELL_OOM = re.compile(
    r"\bflux-shell\[\d+\]: ERROR: oom: Memory cgroup out of memory: killed \d+ tasks?\b"
)
#: earlyoom before 1.0 run with -k: it asks the kernel's own killer to act (sysrq 'f')
_RX_EARLYOOM_SYSRQ = re.compile(r"^Invoking oom killer: done\b", _M)
#: Metal's debug layer refusing a buffer over the device's single-buffer limit (iOS, ggml):
#: "failed assertion `Buffer Validation' / 'newBufferWith*:length 0x6692c000 must not exceed
#: 1024 MB.'"
_RX_METAL_BUFFER_LIMIT = re.compile(
    r"\bnewBufferWith\*?\w*:length (0x[0-9a-fA-F]+|\d+) must not exceed \d+ MB\b"
)
#: Talos Linux's own userspace OOM controller killing a cgroup ('[talos] Sending SIGKILL to
#: cgroup {"component": "controller-runtime", "controller": "runtime.OOMController", ...}'):
#: none of the killers this watchdog names, so the event names none
_RX_TALOS_OOM = re.compile(
    r"\[talos\] Sending (SIG[A-Z]+) to cgroup\b[^\n]*?\bruntime\.OOMController\b"
)
#: the compiler's child killed by the OS while building an extension (a custom node's CUDA
#: kernels, flash-attn, a wheel from source): the same SIGKILL a shell reports as 'Killed'
_RX_COMPILER_KILLED = re.compile(
    r"\binternal compiler error: Killed \(program \w+\)|\bfatal error: Killed signal terminated program \w+"
    # (the signal's name is strsignal()'s, in the locale's language: pt_BR 'Morto', de 'Getötet')
    r"|\bfatal error: (?:Morto|Getötet|Tué|Ucciso|Matado|Завершено|已杀死) signal terminated program \w+"
    r"|致命错误[:：] ?(?:已杀死|Killed) signal terminated program \w+"  # (zh_CN's own 'fatal error')
    r"|\bcollect2: (?:fatal error: )?ld terminated with signal 9 \[Killed\]"  # the linker
)
#: ENOMEM where the build or the tool tried to start a process or take memory: Go's
#: 'fork/exec /usr/bin/gcc: cannot allocate memory', and BuildKit's report of a build step that
#: died of its memory limit ('failed to solve: ResourceExhausted: process "..." did not complete
#: successfully: cannot allocate memory')
_RX_FORK_ENOMEM = re.compile(r"\bfork/exec \S+: cannot allocate memory\b")
_RX_BUILDKIT_EXHAUSTED = re.compile(
    r"\bResourceExhausted: process \"[^\n]*?\" did not complete successfully: cannot allocate memory"
)
#: C++'s failed allocation: an uncaught std::bad_alloc ends the process ('terminate called after
#: throwing an instance of 'std::bad_alloc'', 'what():  std::bad_alloc')
_RX_BAD_ALLOC = re.compile(
    # (a title copies it with a capital: '# Terminate called after throwing ...')
    r"[Tt]erminate called after throwing an instance of 'std::bad_alloc'|\bwhat\(\):\s+std::bad_alloc\b"
    # (a library's status with the exception's what() after it: onnxruntime's 'Load model
    # from ... failed:std::bad_alloc')
    r"|\bthrew St9bad_alloc\b"  # (UNO's bridge relaying it: 'C++ code threw St9bad_alloc: ...')
    r"|\b(?:failed|FAILED_ALLOCATION|[A-Za-z]*Error): ?std::bad_alloc\b(?!: )"  # (TensorRT's FAILED_ALLOCATION:, XGBoostError:)
)
#: gcc's (libiberty's xmalloc) own words when an allocation fails while compiling
_RX_GCC_VM_EXHAUSTED = re.compile(r"\bvirtual memory exhausted: Cannot allocate memory\b")
#: Kubernetes' kubelet evicting a pod under node memory pressure ('The node was low on
#: resource: memory.', as `kubectl describe` shows the event)
_RX_KUBELET_EVICTION = re.compile(r"\bThe node was low on resource: memory\b")
#: Google Colab's dialog when the runtime ran out of RAM and was restarted (quoted, bolded or
#: as a title; the dialog's text is all a user can copy)
_RX_COLAB_RAM = re.compile(r"\bYour session crashed after using all available RAM\b")
#: srun's report of a job step's task that ran out of its memory limit (the killer unnamed)
_RX_SRUN_OOM = re.compile(r"\bsrun: error: \S+: tasks? [\d,\-\[\]]+: Out Of Memory\b")
#: zsh's job report: ``zsh: killed     python main.py`` (on macOS the usual trace of a run the
#: system killed for memory pressure; on Linux the OOM killer's SIGKILL)
#: the shell's 'Killed' in a zh_CN locale, alone on its line or glued after a progress bar
_RX_ZH_KILLED = re.compile(r"(?:^(?:\[\d+\][+-]?\s+)?|(?<=s\]|\ds)|(?<=\.\.\.))已杀死\s*$", _M)
_RX_ZSH_KILLED = re.compile(r"\bzsh: killed\s+\S|^\[\d+\]\s+[+-]?\s*(\d+) killed\s{2,}\S", _M)
_RX_BARE_KILLED = re.compile(
    # (or glued to the end of a progress bar: '... 3/4 [00:08<00:02,  2.83s/it]Killed')
    # (indented too: BuildKit's '#10 4604.5   Killed' once its step prefix is off)
    r"^[ \t]*(?:\[\d+\][+-]?\s+)?Killed(?::\s*9)?(?:\s{2,}\S.*)?[`*]{0,2}\s*$|(?:(?<=/it\])|(?<=/s\])|(?<=\.\.\. )|(?<=\.\.\.))Killed\s*$",
    _M,
)

#: MPS's words as printed: its figures, its full stop, or the line's end after them ('MPS
#: Backend out of Memory problem' in a title, 'MPS backend out of memory in Mac', is the user
#: naming the error, as torch's device words there are: ``_named_only``)
_RX_MPS = re.compile(r"MPS backend out of memory(?: \(MPS allocated|\.|\s*$)", _M)
#: CJK letters and full-width punctuation: a message glued into a Chinese, Japanese or Korean
#: sentence (no space, no word boundary between them)
_CJK = "\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef"
_CJK_OR_PUNCT = "\u3000-\u303f" + _CJK

_RX_TORCH_DEVICE = re.compile(
    # (a hand-retyped 'CUDA out of the memory. Tried to allocate ...' is the same message)
    r"(CUDA|HIP|XPU|NPU|MUSA) out of (?:the )?memory(?:[.,]?(?= ?Tried to allocate|\s*$)| (?=Tried to allocate \d))"
    # inside a CJK sentence ('一直显示CUDA out of memory，'), hyphenated or not: what the
    # user saw, named in the sentence; the full-width punctuation or CJK after it says so.
    # (Not in an English sentence: 'If you get CUDA out of memory errors, try --lowvram' is
    # a tip a node pack may print at start-up.)
    # (or its full stop, then the sentence goes on in CJK: '(에러) CUDA out of memory. 문의 드립니다.')
    rf"|(CUDA|HIP|XPU|NPU|MUSA) out[ -]of[ -]memory(?=[{_CJK_OR_PUNCT}]|\.\s*[{_CJK}])"
    rf"|(?<=[{_CJK}])(CUDA|HIP|XPU|NPU|MUSA) out[ -]of[ -]memory\b"
    # quoted, as the error's own words ('throwing exception: "CUDA out of memory" even ...')
    r"|(?<=[\"'`*\u201c])(CUDA|HIP|XPU|NPU|MUSA) out of memory\.?(?=[\"'`*\u201d])"
    # right after its exception type, wherever that is ('... 一直报torch.cuda.OutOfMemoryError: CUDA out of memory')
    r"|(?<=Error: )(CUDA|HIP|XPU|NPU|MUSA) out of memory\b",
    _M,
)
_RX_TORCH_DEVICE_LINE = re.compile(
    # (an issue title: a Markdown heading mark, a vendor's or a capitalised word before it)
    r"^(?:#+ )?(?:\[\w+\]:? ?)?(?:\S+Error: |!!! Exception during processing !!! |[A-Z][A-Za-z]{1,10} )?"
    r"(CUDA|HIP|XPU|NPU|MUSA) out of memory\b",
    _M,
)
#: Ray's memory monitor killing a task or an actor when its node runs low on RAM (a killer of
#: its own, like earlyoom), and the victim it names on the next line ('... pid=4331, memory
#: used=2.22GB) was running was 59.49GB / 62.58GB ...')
_RX_RAY_OOM_KILL = re.compile(
    r"\b(?:Task|Actor|Worker) was killed due to the node running low on memory\b"
    # the raylet's summary of its kills: '4 Workers (tasks / actors) killed due to memory
    # pressure (OOM), 0 Workers crashed due to other reasons at node ...'
    r"|\b\d+ Workers? \(tasks / actors\) killed due to memory pressure \(OOM\)"
)
_RX_RAY_VICTIM_PID = re.compile(r"\bwhere the (?:task|actor|worker) \([^()\n]*?\bpid=(\d+)")
#: Rust's default allocation-error handler, which aborts the process: 'memory allocation of
#: 176896 bytes failed' (rustc, cargo, and Rust tools and extensions)
_RX_RUST_ALLOC = re.compile(r"\bmemory allocation of (\d+) bytes failed\b")
#: Vulkan's result for host memory running out (ncnn's 'vkAllocateMemory failed -1', the C name)
_RX_VULKAN_HOST_OOM = re.compile(r"\bvkAllocateMemory failed -1\b|\bVK_ERROR_OUT_OF_HOST_MEMORY\b")
#: YOLOX's label assignment catching CUDA's OOM (its handler re-raises any other error) and
#: redoing the batch on the CPU: a recovered OOM
_RX_YOLOX_OOM = re.compile(
    r"\bOOM RuntimeError is raised due to the huge memory cost during label assignment\b"
)
#: CuPy's memory pool refusing a device allocation: 'out of memory to allocate N bytes (total M
#: bytes)' (older CuPy: M is what the pool holds), 'Out of memory allocating N bytes (allocated
#: so far: M bytes)'
_RX_CUPY_OOM = re.compile(
    r"\bout of memory to allocate (\d+) bytes(?: \(total (\d+) bytes\))?"
    r"|\bOut of memory allocating (\d+(?:,\d{3})*) bytes \(allocated so far: (\d+(?:,\d{3})*) bytes\)"
    r"|(?<=OutOfMemoryError: )out of memory to allocate\b"  # (its head alone, in a title)
)
#: faiss's GPU allocations failing with CUDA's error 2: 'failed to cudaMalloc N bytes (error 2
#: out of memory)', 'Failed to cudaMalloc N bytes on device D (error 2 out of memory)', and its
#: StandardGpuResources' '... alloc fail type T dev D space Device stream S size N bytes
#: (cudaMalloc error out of memory [2])'
_RX_FAISS_OOM = re.compile(
    r"\b[Ff]ailed to cudaMalloc (\d+) bytes(?: on device (\d+))? \(error 2 out of memory(?:\)|(?=\n)|$)"
    r"|\bfail type \w+ dev (\d+) space Device stream \S+ size (\d+) bytes"
    r" \(cudaMalloc error out of memory \[2\]\)"
    # (faiss 1.x's assertion: 'Faiss assertion 'cudaMalloc(p, size) == cudaSuccess' failed in
    # ... allocMemorySpace(...) at utils/MemorySpace.cpp:20; details: Failed to cudaMalloc N bytes')
    r"|\bcudaMalloc\(p, size\) == cudaSuccess' failed in [^\n]*?; details: Failed to cudaMalloc"
    r" (\d+) bytes\b"
)
#: the same as an issue's title, its head alone ('# Failed to cudaMalloc'): only faiss words it so
_RX_FAISS_TITLE = re.compile(r"^#+ [Ff]ailed to cudaMalloc\s*$", _M)
#: RMM (cuDF, cuML, cupoch) refusing device memory: 'std::bad_alloc: out_of_memory: CUDA error
#: at: .../cuda_memory_resource.hpp', its pool's 'RMM failure at: ... Maximum pool size exceeded'
_RX_RMM_OOM = re.compile(
    r"\bstd::bad_alloc: (?:out_of_memory: )?(?:CUDA error at\b|RMM failure at:[^\n]*?Maximum pool size exceeded)"
)
#: joblib's loky executor reporting a worker the OS SIGKILLed ('TerminatedWorkerError: A worker
#: process managed by the executor was unexpectedly terminated. ... The exit codes of the
#: workers are {SIGKILL(-9)}', the codes on the same line or a line or two below): its own
#: message names 'excessive memory usage' as the likely cause, and a SIGKILL is the kernel's
#: OOM killer's signal. A SIGSEGV(-11) there is a crash, not memory.
_RX_LOKY_SIGKILL = re.compile(
    r"\bTerminatedWorkerError: A worker process managed by the executor was unexpectedly"
    r" terminated\.[^\n]*(?:\n[^\n]*){0,2}?The exit codes of the workers are \{SIGKILL\(-9\)"
)
#: kraken2 (and its kin) failing to load a database into host RAM: 'Failed attempt to allocate
#: 32185178696bytes;' then 'you may not have enough free memory to load this database.'
_RX_DB_LOAD_ALLOC = re.compile(r"\bFailed attempt to allocate (\d+) ?bytes;")
#: RAPIDS Accelerator for Spark's handler of a failed RMM allocation, before it spills: 'Device
#: allocation of N bytes failed, device store has S bytes. Total RMM allocated is A bytes.'
_RX_SPARK_RMM_ALLOC = re.compile(
    r"\bDevice allocation of (\d+) bytes failed, device store has \d+ bytes\."
    r"(?: Total RMM allocated is (\d+) bytes\b)?"
)
#: Go's runtime failing to get memory from the OS (it aborts the program)
_RX_GO_RUNTIME_OOM = re.compile(r"\bfatal error: runtime: out of memory\b")
#: PostgreSQL's server refusing memory (SQLSTATE 53200), its detail naming the request: 'ERROR:
#: out of memory' / 'DETAIL: Failed on request of size 16 in memory context "..."' (or the
#: detail's label in the server's language: 'Подробности:', '详细：')
_RX_PG_OOM = re.compile(r"\bout of memory\b[^\n]{0,200}?\bFailed on request of size (\d+)\b")
#: the same without its detail (on a line of its own): the client's exception names PostgreSQL
_RX_PG_OOM_TYPED = re.compile(
    r"\b(?:PSQLException|PG::OutOfMemory|PostgreSQLSeverity\.\w+ 53200)\b[^\n]{0,40}?\bout of memory\b"
)
#: the exception a PostgreSQL client raises for it (JDBC's, Ruby pg's)
_RX_PG_TYPE = re.compile(r"((?:[A-Za-z_]\w*\.)+PSQLException|PG::OutOfMemory)\b")
#: MySQL's sort buffer (error 1038), as PDO relays it: 'SQLSTATE[HY001]: Memory allocation
#: error: 1038 Out of sort memory'
_RX_MYSQL_SORT_OOM = re.compile(r"\bMemory allocation error: 1038 Out of sort memory\b")
#: Blender Cycles' CUDA device running out of both pools
_RX_CYCLES_OOM = re.compile(r"\bSystem is out of GPU and shared host memory\b")
#: FlashInfer's workspace allocator: 'Failed to allocate memory for batch_prefill_tmp_v with
#: size 435814400 and alignment 16 in AlignedAllocator'
_RX_FLASHINFER_ALIGNED = re.compile(
    r"\bFailed to allocate memory for \w+ with size (\d+) and alignment \d+ in AlignedAllocator\b"
)
#: NVIDIA's video encoder refusing a session (FFmpeg's nvenc, Livepeer): 'OpenEncodeSessionEx
#: failed: out of memory (10)'
_RX_NVENC_OOM = re.compile(r"\bOpenEncodeSessionEx failed: out of memory\b")
#: ollama's scheduler failing to lay a model out over the GPU (and then system RAM): 'memory
#: layout cannot be allocated' as the server logs it, or the CLI relays its 500 after 'Error: '
#: (not a user's sentence quoting it after a comma)
_RX_OLLAMA_LAYOUT = re.compile(r"(?:^|: |=\")memory layout cannot be allocated\b", _M)
#: text-generation-inference's warmup refusing the prefill batch its GPU cannot hold, as the
#: router relays it without the RuntimeError ('Server error: Not enough memory to handle 256
#: prefill tokens. You need to decrease ...')
_RX_TGI_PREFILL = re.compile(r"\bNot enough memory to handle \d+ prefill tokens\b")
#: Mesa's RADV (the Vulkan driver for AMD GPUs) failing a buffer: 'radv/amdgpu: Failed to
#: allocate a buffer:', then its size on the next line ('radv/amdgpu:    size : N bytes')
_RX_RADV_BUFFER = re.compile(
    r"(?<![\w/])(?:radv/)?amdgpu: Failed to allocate a buffer:(?:[ \t]*\n[^\n]*?\bsize\s*: (\d+) bytes)?"
)
#: a ROCm backend's own allocations and launches refused for memory (antirez's ds4: 'ds4: ROCm
#: tensor alloc failed: out of memory', '... tensor fill f32 launch failed: out of memory')
_RX_ROCM_OWN_OOM = re.compile(r"\bROCm (?:[\w.]+ ){1,6}failed: out of memory\b")
#: Go's runtime on Windows when VirtualAlloc hits the commit limit (errno 1455,
#: ERROR_COMMITMENT_LIMIT: the paging file), before its 'fatal error: out of memory'
_RX_GO_VIRTUALALLOC_1455 = re.compile(
    r"\bruntime: VirtualAlloc of (\d+) bytes failed with errno=1455\b"
)
#: Redis refusing a write at its maxmemory cap (the client relays the server's words)
_RX_REDIS_MAXMEMORY = re.compile(r"\bOOM command not allowed when used memory > 'maxmemory'")
#: MySQL's ER_OUT_OF_RESOURCES / client 'Out of memory (Needed N bytes)' (the server's older
#: 'Out of memory; restart server and try again (needed N bytes)')
_RX_MYSQL_OOM = re.compile(
    r"\bOut of memory(?:; restart server and try again)? \([Nn]eeded (\d+) bytes\)"
)
#: InnoDB's large allocation for its buffer pool refused by the kernel (ENOMEM)
_RX_INNODB_MMAP = re.compile(r"\bInnoDB: mmap\((\d+) bytes\) failed; errno 12\b")
#: Mono (Unity's scripting runtime) failing to format an exception because the heap is gone
_RX_MONO_OOM_NESTED = re.compile(
    r"\banother exception of class '(OutOfMemoryException)' was thrown\b"
)
#: the Kotlin compiler daemon refusing to start for want of heap (the Gradle plugin's words)
_RX_KOTLIN_COMPILE_MEMORY = re.compile(r"\bNot enough memory to run compilation\b")
#: Chrome's crash page under 'Aw, Snap!' / 'Oops, something went wrong': 'Error code: Out of
#: Memory', pasted alone on its line (or as a title)
_RX_CHROME_PAGE_OOM = re.compile(r"^(?:#+ )?Error [Cc]ode: Out of [Mm]emory\b", _M)
#: NVIDIA Omniverse Kit's Vulkan layer (Isaac Sim, Isaac Lab): '[carb.graphics-vulkan.plugin]
#: Out of GPU memory allocating resource 'MemoryManager-allocate' [size: unknown]'
_RX_CARB_VULKAN_OOM = re.compile(r"\bOut of GPU memory allocating resource\b")
#: tiny-cuda-nn's GPU memory arena (instant-ngp, nerfstudio's tcnn): 'Could not allocate memory:
#: .../gpu_memory.h:112 cudaMalloc(&rawptr, ...) failed with error out of memory' (a paste may
#: cut its last word)
_RX_TCNN_ALLOC = re.compile(r"\bCould not allocate memory: [^\n]*?\bcudaMalloc\(")
#: Unreal Engine's dialog when the GPU cannot hold a rendering resource
_RX_UNREAL_VIDEO_MEMORY = re.compile(
    r"(?<![A-Za-z])[Oo]ut of video memory trying to allocate a (?:rendering resource|texture)\b"
)
#: PhysX's GPU allocator (Isaac Gym, Omniverse): 'PxgCudaDeviceMemoryAllocator fail to allocate
#: memory N bytes!! Result = 2' (2 is CUDA_ERROR_OUT_OF_MEMORY)
_RX_PHYSX_ALLOC = re.compile(
    r"\bPxgCudaDeviceMemoryAllocator fail to allocate memory (\d+) bytes!! Result = 2\b"
)
#: LAMMPS' GPU package: 'ERROR: Insufficient memory on accelerator (src/GPU/gpu_extra.h:38)'
_RX_ACCELERATOR_MEMORY = re.compile(r"\bInsufficient memory on accelerator\b")
#: CUDA programs' own check macros printing the runtime's error string: SPECFEM's 'CUDA error
#: !!!!! <out of memory> !!!!!', FASTDock's 'Error out of memory at .../cuda_grid_lig.cu:174'
_RX_CUDA_CHECK_OOM = re.compile(
    r"\bCUDA error !+ <out of memory> !+|\bError out of memory at \S+\.cuh?:\d+"
)
#: DirectDraw's DDERR_OUTOFVIDEOMEMORY (dxdiag, old games): 'HRESULT = 0x8876017c (Out of video
#: memory)'
_RX_DDRAW_VIDEO_MEMORY = re.compile(r"\b0x8876017[cC]\b|\bDDERR_OUTOFVIDEOMEMORY\b")
#: Wine's virtual memory manager refusing an allocation (a 32-bit prefix out of address space):
#: 'err:virtual:allocate_virtual_memory out of memory for allocation, base (nil) size 00670000'
_RX_WINE_VIRTUAL = re.compile(
    r"\ballocate_virtual_memory out of memory for allocation, base \S+ size ([0-9a-fA-F]+)\b"
)
#: vkd3d-proton's device allocation going on in system memory (a warning, the frame goes on)
_RX_VKD3D_FALLBACK = re.compile(r"\bMemory allocation failed, falling back to system memory\b")
#: Unity's heap allocator: 'DynamicHeapAllocator allocation probe 1 failed - Could not get memory
#: for large allocation N.' (four probes), then '... out of memory - ...' and 'Could not allocate
#: memory: System out of memory!': one failure told by its lines
_RX_UNITY_HEAP = re.compile(
    r"\bDynamicHeapAllocator (?:allocation probe \d+ failed|out of memory) - Could not get memory"
    r" for large allocation (\d+)\b"
)
#: iOS's memory limit for an app (jetsam's per-process limit, caught by the debugger): 'stop
#: reason = EXC_RESOURCE (RESOURCE_TYPE_MEMORY: high watermark memory limit exceeded)
#: (limit=1450 MB)', older 'EXC_RESOURCE RESOURCE_TYPE_MEMORY (limit=1450 MB, unused=0x0)'
_RX_IOS_EXC_RESOURCE = re.compile(
    r"\bEXC_RESOURCE \(?RESOURCE_TYPE_MEMORY\b[^\n]{0,80}?\(limit=(\d+) MB\b"
)
#: TensorRT's builder skipping a tactic whose workspace the device cannot hold (it goes on with
#: another): 'Tactic Device request: 4229MB Available: 2658MB. Device memory is insufficient to
#: use tactic.'
_RX_TRT_TACTIC_DEVICE = re.compile(
    r"\bTactic Device request: (\d+)MB Available: (\d+)MB\. Device memory is insufficient"
)
#: Heroku's router: a dyno over its memory quota (R14, swapping) and far over it (R15, killed)
_RX_HEROKU_R14 = re.compile(r"\bError R14 \(Memory quota exceeded\)")
_RX_HEROKU_R15 = re.compile(r"\bError R15 \(Memory quota vastly exceeded\)")
#: AWS Lambda's runtime killed at the function's memory size
_RX_LAMBDA_OOM = re.compile(r"\bError Type: Runtime\.OutOfMemory\b")
#: Amazon ECS's stopped reason for a container its memory limit killed
_RX_ECS_OOM = re.compile(r"\bOutOfMemoryError: Container killed due to memory usage\b")
#: IIS / Azure App Service recycling a worker at its memory limit: 'Worker Process requested
#: recycle due to 'Percent Memory' limit. Memory Used: N out of M available.'
_RX_IIS_RECYCLE = re.compile(
    r"\bWorker Process requested recycle due to 'Percent Memory' limit\.(?: Memory Used: (\d+) out of"
    r" (\d+) available\b)?"
)
#: Chromium's exit code for a renderer out of memory (0xE0000008 as a signed int) in Electron's
#: crash dialog (VS Code: 'The window terminated unexpectedly (reason: 'oom', code:
#: '-536870904')'), however it is retyped or translated
_RX_CHROMIUM_OOM_CODE = re.compile(r"\boom\b[^\n]{0,16}?(?:code|代码)\s*:\s*'?-?536870904\b")
#: Gradle's daemon giving up on a heap its garbage collector thrashes in (the build fails)
_RX_GRADLE_GC_THRASH = re.compile(
    r"\bThe Daemon will expire immediately since the JVM garbage collector is thrashing\b"
)
#: Qt's image allocation failing (it returns a null image and the program goes on)
_RX_QIMAGE_OOM = re.compile(r"\bQImage: out of memory, returning null image\b")
#: MSVC's compiler and linker out of heap: 'fatal error C1060: compiler is out of heap space'
#: (C1002 'in pass 2'), 'fatal error LNK1102: out of memory'; LLVM's 'LLVM error : out of memory'
_RX_TOOLCHAIN_HEAP = re.compile(
    r"(?:\bfatal error )?\bC10(?:60|02): compiler is out of heap space\b"
    r"|\bfatal error LNK1102: out of memory\b|\bLLVM (?:error|ERROR) ?: out of memory\b"
)
#: Bun's allocator failing (Zig's error.OutOfMemory unwrapped in a panic, or its crash report)
_RX_BUN_OOM = re.compile(
    r"\bpanic\([^)\n]*\): attempt to unwrap error: OutOfMemory\b|^Bun ran out of memory\b", _M
)
#: Xcode's debugger when iOS's jetsam ended the app for its memory
_RX_XCODE_MEMORY = re.compile(r"\bMessage from debugger: Terminated due to memory issue\b")
#: Safari's banner for a page WebKit reloaded at its memory limit
_RX_SAFARI_RELOAD = re.compile(
    r"\bThis webpage was reloaded because it was using significant memory\b"
)
#: Photopea's refusal: 'Not enough RAM! (Need 3043MB )'
_RX_PHOTOPEA_RAM = re.compile(r"\bNot enough RAM! \(Need (\d+) ?MB ?\)")
#: Kaggle's kernel restarted at the notebook's memory limit
_RX_KAGGLE_RESTART = re.compile(
    r"\bYour notebook tried to allocate more memory than is available\. It has restarted\b"
)
#: Google Cloud Run (and Cloud Functions) ending an instance at its memory limit: 'Memory limit
#: of 512 MiB exceeded with 516 MiB used' (older 'of 512M exceeded with 526M used')
_RX_CLOUD_RUN_LIMIT = re.compile(
    r"\bMemory limit of (\d+) ?(MiB|M) exceeded with (\d+) ?(MiB|M) used\b"
)
#: runc starting a container whose init the memory cgroup killed at once (ECS and Docker relay
#: it): 'container init was OOM-killed (memory limit too low?)'
_RX_RUNC_INIT_OOM = re.compile(r"\bcontainer init was OOM-killed\b")
#: the ECS agent's Docker client: 'process within container <id> (name: "...") died due to OOM'
_RX_ECS_AGENT_OOM = re.compile(
    r"\bprocess within container \S+ (?:\(name: \"[^\"\n]*\"\) )?died due to OOM\b"
)
#: Android's lmkd: 'lowmemorykiller ... Kill 'com.app' (15964), uid 10137, oom_score_adj 500 to
#: free 92212kB rss'
_RX_LMKD_KILL = re.compile(
    r"\blowmemorykiller\b[^\n]*?\bKill '([^'\n]+)' \((\d+)\), uid \d+, oom_score_adj -?\d+ to free"
    r" (\d+)kB rss\b"
)
#: Qualcomm's Adreno driver refusing a GPU buffer: '(IOCTL_KGSL_GPUOBJ_ALLOC) failed: errno 12 Out
#: of memory'
_RX_KGSL_ALLOC = re.compile(r"\bIOCTL_KGSL_GPUOBJ_ALLOC\) failed: errno 12\b")
#: Rockchip's RKNN runtime refusing NPU memory: 'failed to allocate handle, ret: -1, errno: 12'
_RX_RKNN_ALLOC = re.compile(r"\bfailed to allocate handle, ret: -1, errno: 12\b")
#: OpenCL's host-side allocation failure (a driver's build or enqueue)
_RX_CL_HOST_OOM = re.compile(r"\bCL_OUT_OF_HOST_MEMORY\b")
#: jetson-utils' mapped (zero-copy) allocation on Jetson's shared memory
_RX_JETSON_ALLOC_MAPPED = re.compile(r"\bcudaAllocMapped\(\) failed to allocate memory\b")
#: a size as data systems print it: '13.94 GiB', '40GB', '8.71MB', '64kB', '6.14G'
_DSIZE = r"(\d+(?:\.\d+)?) ?([KMGTPE]i?B|[KMGTPE]|kB|bytes)"
#: XLA on TPU: 'Ran out of memory in memory space hbm. Used 21.95G of 15.48G hbm.', 'Error
#: allocating device buffer: Attempting to allocate 196.00M. That was not possible. There are
#: 134.44M free.', 'Attempting to reserve 6.14G at the bottom of memory. That was not possible.'
_RX_XLA_TPU_OOM = re.compile(
    r"(?:\bRESOURCE_EXHAUSTED: (?:XLA:TPU compile permanent error\. )?)?"
    r"\bRan out of memory in memory space hbm\. Used " + _DSIZE + r" of " + _DSIZE + r" hbm\b"
    r"|(?:\bRESOURCE_EXHAUSTED: (?:Error allocating device buffer: )?)?\bAttempting to allocate "
    + _DSIZE
    + r"\. That was not possible\. There are "
    + _DSIZE
    + r" free\b"
    r"|\bAttempting to reserve " + _DSIZE + r" at the bottom of memory\. That was not possible\b"
)
#: AWS Neuron's runtime: the device driver's 'Failed to alloc DEVICE memory: N', the runtime's
#: 'nrt_tensor_allocate status=4 message="Allocation Failure"'
_RX_NEURON_OOM = re.compile(
    r"\bFailed to alloc DEVICE memory: (\d+)\b|\bnrt_\w+ status=4 message=\"Allocation Failure\""
)
#: Jittor's allocator going on in unified memory when the device's is full (a warning)
_RX_JITTOR_UNIFY = re.compile(r"\bUnable to alloc cuda device memory, use unify memory instead\b")
#: ClickHouse's memory tracker: 'Memory limit (total) exceeded: would use 13.94 GiB (attempt to
#: allocate chunk of 4235716 bytes), maximum: 13.94 GiB' (a title may cut it after 'exceeded')
_RX_CLICKHOUSE_LIMIT = re.compile(
    r"(?:\bMemory limit \((?:total|for query|for user)\) exceeded"
    r"|\((?:total|for query|for user)\) memory limit exceeded)\b(?:: would use "
    + _DSIZE
    + r"(?: \(attempt to allocate chunk of (\d+) bytes\))?(?:, current RSS: "
    + _DSIZE
    + r")?, maximum: "
    + _DSIZE
    + r")?"
)
#: Elasticsearch's circuit breakers: '[parent] Data too large, data for [<http_request>] would be
#: [1017560880/970.4mb], which is larger than the limit of [986061209/940.3mb]'
_RX_ES_BREAKER = re.compile(
    r"\bcircuit_breaking_exception\b|\bCircuitBreakingException\b"
    r"|\bData too large, data for \[[^\]\n]*\] would be\b"
)
_RX_ES_WOULD_BE = re.compile(r"\bwould be \[(\d+)/|\"bytes_wanted\":(\d+)")
_RX_ES_LIMIT = re.compile(r"\blarger than (?:the )?limit of \[(\d+)/|\"bytes_limit\":(\d+)")
#: the exception the breaker raised: Java's class, or the JSON error's type
_RX_ES_TYPE = re.compile(
    r"((?:[a-z]\w*\.)*CircuitBreakingException)\b|\b(circuit_breaking_exception)\b"
)
#: Trino's and Presto's memory limits: 'Query exceeded per-node memory limit of 40GB [Allocated:
#: 40.00GB, Delta: 8.71MB, ...' (GB binary: 25.80GB is exactly its default)
_RX_TRINO_LIMIT = re.compile(
    r"\bQuery exceeded (?:per-node|distributed|local) (?:user |total )?memory limit of "
    + _DSIZE
    + r"(?: \[Allocated: "
    + _DSIZE
    + r", Delta: "
    + _DSIZE
    + r")?"
)
#: DuckDB's buffer manager: 'Out of Memory Error: failed to allocate data of size 128.0 MiB (2.8
#: GiB/2.9 GiB used)', '... could not allocate block of 262144 bytes'
_RX_DUCKDB_OOM = re.compile(
    r"\bOut of Memory Error: (?:(?:F|f)ailed to allocate data of size "
    + _DSIZE
    + r"(?: \("
    + _DSIZE
    + r"/"
    + _DSIZE
    + r" used\))?"
    r"|(?:[Cc]ould not|Failed to) allocate block of (\d+) bytes)"
)
#: Hadoop YARN's NodeManager killing a container over its limit (Spark's executors): 'Container
#: killed by YARN for exceeding memory limits. 7.2 GB of 4.2 GB virtual memory used.'
_RX_YARN_KILL = re.compile(
    r"\bContainer killed by YARN for exceeding memory limits\b(?:\. "
    + _DSIZE
    + r" of "
    + _DSIZE
    + r" (?:virtual|physical) memory used)?"
)
#: MongoDB's blocking sort over its limit: 'Sort exceeded memory limit of 104857600 bytes'
_RX_MONGO_SORT = re.compile(r"\bSort exceeded memory limit of (\d+) bytes\b")
#: BigQuery's slot memory: 'The query could not be executed in the allotted memory'
_RX_BIGQUERY_MEMORY = re.compile(r"\bThe query could not be executed in the allotted memory\b")
#: SQL Server's error 701: 'There is insufficient system memory in resource pool 'default' to
#: run this query'
_RX_MSSQL_701 = re.compile(r"\bThere is insufficient system memory in resource pool\b")
#: Ray's plasma store full: 'Failed to put object <id> in object store because it is full.
#: Object size is N bytes.'
_RX_RAY_STORE_FULL = re.compile(
    r"\bin object store because it is full\.(?: Object size is (\d+) bytes\b)?"
)
#: Apache Arrow's memory pool: 'ArrowMemoryError: realloc of size 2172846080 failed'
_RX_ARROW_ALLOC = re.compile(r"\bArrowMemoryError: (?:realloc|malloc) of size (\d+) failed\b")
#: exllamav2/v3's loader finding the model and its cache do not fit the cards
_RX_EXLLAMA_VRAM = re.compile(r"\bInsufficient VRAM (?:in split )?for model and cache\b")
#: LM Studio's guardrail refusing a load: 'Model loading was stopped due to insufficient system
#: resources'
_RX_LMSTUDIO_GUARD = re.compile(
    r"(?<![\"\u201c])\bModel loading was stopped due to insufficient system resources\b"  # (not quoted)
)
#: MindSpore's data pipeline pinning its arena: 'cudaHostAlloc failed, ret[2], out of memory'
_RX_MS_HOST_ALLOC = re.compile(r"\bcudaHostAlloc failed, ret\[2\], out of memory\b")
#: Oracle's memory errors: ORA-27102 'out of memory', ORA-04030 'out of process memory when
#: trying to allocate N bytes', ORA-04031 'unable to allocate N bytes of shared memory'
_RX_ORACLE_OOM = re.compile(
    r"\bORA-27102: out of memory\b"
    r"|\bORA-04030: out of process memory when trying to allocate (\d+) bytes\b"
    r"|\bORA-04031: unable to allocate (\d+) bytes of shared memory\b"
)
#: Neo4j's own words for a transaction its heap cannot hold
_RX_NEO4J_MEMORY = re.compile(r"\bThere is not enough memory to perform the current task\b")
#: onnxruntime's node failure relaying MSVC's std::bad_alloc ('bad allocation')
_RX_ORT_BAD_ALLOCATION = re.compile(r"\bStatus Message: bad allocation\b")
#: PHP's memory_limit ('Allowed memory size of N bytes exhausted (tried to allocate M bytes)') and
#: its allocator's own refusal ('Out of memory (allocated N) (tried to allocate M bytes)')
_RX_PHP_LIMIT = re.compile(
    r"\bAllowed memory size of (\d+) bytes exhausted\b(?:[^\n]{0,40}?\(tried to allocate (\d+) bytes\))?"
)
_RX_PHP_OOM = re.compile(
    r"\bOut of memory \(allocated (\d+)\)(?: \(tried to allocate (\d+) bytes\))?"
)
#: Julia's OutOfMemoryError(), printed with its parentheses
_RX_JULIA_OOM = re.compile(r"\b(OutOfMemoryError)\(\)")
#: MATLAB: 'Out of memory. Type HELP MEMORY for your options.' ('help memory' since R2013),
#: 'Requested 90816x90816 (61.4GB) array exceeds maximum array size preference'
_RX_MATLAB_OOM = re.compile(
    r"\bOut of memory\. (?:Type|For more information, type) (?:HELP MEMORY|\"help memory\")"
    r"|\bRequested (?:\d+x)+\d+ \((\d+(?:\.\d+)?)\s?([KMGT]B)\) array exceed(?:s|ed) (?:the )?"
    r"(?:preset )?maximum array size\b"
)
#: GHC's runtime at its -M heap cap: 'prog: Heap exhausted;'
_RX_GHC_HEAP = re.compile(r": Heap exhausted;")
#: OCaml's runtime: 'Fatal error: out of memory.' on a line of its own (or as a title)
_RX_OCAML_OOM = re.compile(r"^(?:#+ )?Fatal error: out of memory\.?[ \t]*$", _M)
#: the Erlang VM's allocators: 'eheap_alloc: Cannot allocate N bytes of memory (of type "heap")'
_RX_ERLANG_ALLOC = re.compile(r"\b[a-z_]+_alloc: Cannot allocate (\d+) bytes of memory\b")
#: Ruby's NoMemoryError ('failed to allocate memory (NoMemoryError)', 'NoMemoryError: failed to
#: allocate memory')
_RX_RUBY_OOM = re.compile(
    r"\b(NoMemoryError): failed to allocate memory\b|\bfailed to allocate memory \((NoMemoryError)\)"
)
#: Lua's allocator: 'lua atpanic: Lua VM crashed, reason: not enough memory', 'PANIC: unprotected
#: error in call to Lua API (not enough memory)'
_RX_LUA_OOM = re.compile(
    r"\bLua VM crashed, reason: not enough memory\b|\bin call to Lua API \(not enough memory\)"
)
#: Zig's error.OutOfMemory as its build prints it, alone on a line
_RX_ZIG_OOM = re.compile(r"^error: OutOfMemory[ \t]*$", _M)
#: the Dart VM's heap: 'Exhausted heap space, trying to allocate 240 bytes.'
_RX_DART_HEAP = re.compile(r"\bExhausted heap space, trying to allocate (\d+) bytes\b")
#: HPC schedulers killing a job at its memory limit: PBS's '=>> PBS: job killed: mem 38427376kb
#: exceeded limit 33554432kb' ('mem job total N kb'), Torque's 'Job exceeded a memory resource
#: limit', LSF's 'TERM_MEMLIMIT: job killed after reaching LSF memory usage limit', HTCondor's
#: 'Job has gone over memory limit of 4096 megabytes. Peak usage: 4088 megabytes', Slurm's
#: 'Job 42664148 exceeded memory limit (10889240 > 4194304), being killed' (KiB)
_RX_PBS_KILL = re.compile(
    r"\bPBS: job killed: mem (?:job total )?(\d+) ?kb exceeded limit (\d+) ?kb\b"
)
_RX_SCHEDULER_KILL = re.compile(
    r"\bJob exceeded a memory resource limit\b|\bTERM_MEMLIMIT: job killed after reaching LSF memory"
    r" usage limit\b"
)
_RX_CONDOR_KILL = re.compile(
    r"\bJob has gone over memory limit of (\d+) megabytes\.(?: Peak usage: (\d+) megabytes)?"
)
_RX_SLURM_STEP_KILL = re.compile(
    r"\b(?:Job|Step) [\d.]+ exceeded memory limit \((\d+) > (\d+)\), being killed\b"
)
#: JavaScript engines out of memory for an ArrayBuffer or a WebAssembly memory: 'RangeError:
#: Array buffer allocation failed', 'WebAssembly.Memory(): could not allocate memory',
#: 'WebAssembly.instantiate(): Out of memory: wasm memory', '... Unable to grow instance memory'
_RX_JS_BUFFER_OOM = re.compile(
    r"\bArray buffer allocation failed\b|\bWebAssembly\.\w+(?:\.\w+)?\(\): (?:could not allocate"
    r" memory|Out of memory: wasm memory|Unable to grow instance memory)\b"
)
#: WebLLM's WebGPU device lost while loading (its own words name memory as the likely cause)
_RX_WEBLLM_DEVICE_LOST = re.compile(
    r"\bDevice was lost during reload\. This can happen due to insufficient memory\b"
)
#: onnxruntime-web's WebGPU device error 2 (GPUOutOfMemoryError)
_RX_WEBGPU_DEVICE_OOM = re.compile(r"\bWebGPU device error\(2\): Out of memory\b")
#: OpenGL's GL_OUT_OF_MEMORY (WebGL in Chrome and Electron: '[.WebGL-...] GL_OUT_OF_MEMORY: Error
#: allocating Texture2D. HRESULT: 0x8007000E'): the GPU's memory, whatever ANGLE's HRESULT says
_RX_GL_OOM = re.compile(r"\bGL_OUT_OF_MEMORY\b")
#: TensorFlow's and XLA's BFC allocator failing an allocation: 'Allocator (GPU_0_bfc) ran out of
#: memory trying to allocate 47.20GiB (rounded to 50677266944)requested by op' (its warning that
#: says 'the caller indicates that this is not a failure' is worded otherwise); a host BFC
#: (xla_gpu_host_bfc, gpu_host_bfc) is pinned host RAM
_RX_TF_BFC_ROUNDED = re.compile(
    r"\bAllocator \((\w+)\) ran out of memory trying to allocate "
    + _SIZE
    + r" \(rounded to (\d+)\)\s*requested by op\b"
)
#: Source 2's renderer (Counter-Strike 2, Dota 2) on Vulkan: its device-local allocation failed
#: and it goes on in system memory ('vmaAllocateMemory failed for DEVICE_LOCAL memory indicating
#: video memory is full, trying again in system memory as a fallback.')
_RX_SOURCE2_VRAM_FALLBACK = re.compile(
    r"\bvmaAllocateMemory failed for DEVICE_LOCAL memory indicating video memory is full, trying"
    r" again in system memory\b"
)
#: DXVK's allocator (Wine and Proton's Direct3D over Vulkan): 'DxvkMemoryAllocator: Memory
#: allocation failed', then its 'Size:', 'Mem flags:' (0x1, device-local: VRAM; without that bit
#: host memory) and one 'Heap N: ... M MB total' line per heap
_RX_DXVK_ALLOC = re.compile(r"\bDxvkMemoryAllocator: Memory allocation failed\b")
_RX_DXVK_SIZE = re.compile(r"^(?:err: +)?Size: +(\d+)\s*$", _M)
_RX_DXVK_FLAGS = re.compile(r"^(?:err: +)?Mem flags: +0x([0-9a-fA-F]+)\s*$", _M)
_RX_DXVK_HEAP = re.compile(r"^(?:err: +)?Heap \d+: [^\n]*?, (\d+) MB total\s*$", _M)
#: Unity's allocator: 'Could not allocate memory: System out of memory!'
_RX_UNITY_OOM = re.compile(r"\bCould not allocate memory: System out of memory!")
#: a Vulkan program's own words for VK_ERROR_OUT_OF_DEVICE_MEMORY (the result's description:
#: Tempest's 'std::system_error(Out of device memory)', vkd3d's '... : Out of device memory'),
#: after a bracket, a colon or alone on its line (not a user's 'I get out of device memory')
_RX_OUT_OF_DEVICE_MEMORY = re.compile(
    r"(?:^|(?<=\()|(?<=: ))Out of device memory\b"
    # (vkd3d-proton's line before its 'hresult_from_vk_result: Out of device memory.': vr -2 is
    # VK_ERROR_OUT_OF_DEVICE_MEMORY)
    r"|\bvkd3d_allocate_device_memory: Failed to allocate device memory, vr -2\b",
    _M,
)
_RX_CXX_SYSTEM_ERROR = re.compile(r"\b(std::system_error)\(Out of device memory\)")
#: GLib's g_malloc aborting ('(gimp:6970): GLib-ERROR **: ...: gmem.c:105: failed to allocate N
#: bytes'): host RAM, or a bogus size asked of it
_RX_GLIB_ALLOC = re.compile(r"\bgmem\.c:\d+: failed to allocate (\d+) bytes\b")
#: Unreal Engine's allocator: 'Ran out of memory allocating N bytes with alignment A' (after a
#: 'LogWindows: Error: ' or under its 'Fatal error: [File:...] [Line: N]' header), 'Last error
#: msg:' naming the paging file when Windows' commit limit refused it
_RX_UNREAL_OOM = re.compile(
    r"(?:(?:LowLevelFatalError|Fatal error:) \[File:[^\]\n]*\] \[Line: \d+\][^\n]*\n"
    r"(?:[^\n]*\n){0,2}?)?"
    r"Ran out of memory allocating (\d+)(?: \([\d.]+ [KMGT]i?B\))? bytes with alignment \d+\b"
)
#: macOS's malloc failing to map a region: 'malloc: *** mach_vm_map(size=193413120) failed
#: (error code=3)' then '*** error: can't allocate region'; a title may hold the second alone
_RX_MACH_VM_MAP = re.compile(
    r"\bmalloc: \*\*\* mach_vm_map\(size=(\d+)\) failed \(error code=3\)"
    r"|^#+ error: can't allocate region\b",
    _M,
)
#: dask's nanny restarting a worker past its memory budget (a killer of its own, like earlyoom;
#: two blanks before 'Restarting' in some versions, or a console's wrap inside it)
_RX_DASK_NANNY = re.compile(r"\bWorker exceeded \d+% memory budget\.\s+Restart")
#: Windows' Resource-Exhaustion-Detector's list of the programs that held the most commit
_RX_WIN_LOW_VIRTUAL_CONSUMER = re.compile(r"([^\s,:]+) \((\d+)\)\s+consumed\s+(\d+) bytes")
#: SGLang's refusal to start when the weights leave the KV cache nothing
_RX_SGLANG_NO_KV = re.compile(r"\bLoaded weights leave no GPU memory for the KV cache\b")
#: vLLM's start-up check: less free memory on the card than gpu_memory_utilization asks for
#: ('Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less than desired GPU memory
#: utilization (0.9, 19.84 GiB)'; 'xpu:0' on Intel's build); the card is shared, or the fraction
#: too high
_RX_VLLM_STARTUP_FREE = re.compile(
    r"\b[Ff]ree memory on device(?: (?:cuda|(xpu)):(\d+))? \((\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) GiB\) on startup"
    r" is less than desired GPU memory utilization \((?:\d+(?:\.\d+)?), (\d+(?:\.\d+)?) GiB\)"
)
#: the C library's ENOMEM as Python raises it ('OSError: [Errno 12] Cannot allocate memory': a
#: fork() for DataLoader workers, an mmap, a read): the host refused memory
_RX_ERRNO_ENOMEM = re.compile(r"\[Errno 12\] Cannot allocate memory\b")
#: FFmpeg's libraries returning AVERROR(ENOMEM), as the caller prints it after the function's
#: name ('avcodec_send_packet: Out of memory'): the host process's (or wasm heap's) memory
_RX_FFMPEG_ENOMEM = re.compile(
    r"\b(?:avcodec|avformat|avfilter|sws|swr|av)_\w+(?:\(\))?: Out of memory\b"
)
#: Windows' Resource-Exhaustion-Detector (event 2004) when the commit limit is nearly reached:
#: the paging file's pool, whatever the program that asked for memory printed
_RX_WIN_LOW_VIRTUAL = re.compile(
    r"\bWindows successfully diagnosed a low virtual memory condition\b"
)
#: Emscripten's heap (a WebAssembly build in the browser or Node): host RAM as far as it knows
_RX_EMSCRIPTEN_OOM = re.compile(
    r"\bCannot enlarge memory arrays to size (\d+) bytes \(OOM\)"
    # its abort without assertions: 'exception thrown: abort(OOM). Build with -s ASSERTIONS=1',
    # the runtime's bare 'OOM' printed on the line before it
    r"|(?m:^)OOM\n(?=[^\n]*\babort\(OOM\))|\babort\(OOM\)"
    # (its newer 'Aborted(OOM)', 'abort(out of memory)', and the older heap message without a size)
    r"|\bAborted\(OOM\)|\babort\(out of memory\)|\bCannot enlarge memory arrays\. Either\b"
)
#: PaddlePaddle's GPU allocator: 'Out of memory error on GPU 0. Cannot allocate 98.000244MB memory
#: on GPU 0, 6.000000GB memory has been allocated and available memory is only 0.000000B.'
_RX_PADDLE_OOM = re.compile(
    # (glued to the user's Chinese: '提示错误Out of memory error on GPU 0.')
    r"(?<![A-Za-z0-9_])Out of memory error on GPU (\d+)\. Cannot allocate "
    + _SIZE
    + r" memory on GPU \d+"
    r"(?:, "
    + _SIZE
    + r" memory has been allocated)?(?:(?: and|,) available memory is only\s+"
    + _SIZE
    + r")?"  # (a title keeps only the first sentence)
)
#: Paddle's message cut after its first words, first on a line (a title: 'Out of memory error on
#: GPU 0 gitee上拉的paddle2.0rc1 代码'): the head's own capitalised words and index, then the
#: user's text or the line's end. In a sentence ('I got Out of memory error on GPU 0') it is
#: not read: Paddle's words stand first on their line.
_RX_PADDLE_HEAD = re.compile(r"^(?:#+ )?Out of memory error on GPU (\d+)(?![\d.])", _M)
#: fairseq's trainer catching an OOM and trying the next batch (whether it did is not said)
_RX_FAIRSEQ_RECOVER = re.compile(r"\battempting to recover from OOM in (?:forward|backward)")
#: Tenstorrent's (tt-metal) DRAM allocator
_RX_TT_DRAM = re.compile(
    r"\bOut of Memory: Not enough space to allocate (\d+) B (?:DRAM|L1) buffer"
)
#: a hosted runtime stopping the container at its memory limit (Hugging Face Spaces: 'Runtime
#: error Memory limit exceeded (16Gi)', older 'CPU Memory limit exceeded (16GB)')
_RX_CONTAINER_LIMIT = re.compile(
    r"\b(?:CPU )?Memory limit exceeded \((\d+(?:\.\d+)?) ?(Gi|GiB|GB|G|Mi|MiB|MB)\)"
    r"|(?<=[\"'`])(?:CPU )?Memory limit exceeded(?=[\"'`])"  # quoted, its size left out
)
#: macOS's kernel killing for memory pressure (memorystatus, "jetsam")
_RX_MEMORYSTATUS = re.compile(
    r"\bmemorystatus: killing (?:largest compressed )?process (\S+) \[(\d+)\]"
)
#: ggml's Metal backend refusing a buffer (llama.cpp, whisper.cpp on Apple silicon)
#: ('failed to allocate buffer', or an older one naming the buffer: "failed to allocate 'data
#: ' buffer, size = 19283.21 MiB")
_RX_GGML_METAL = re.compile(
    r"\bggml_(?:backend_)?metal\w*: error: failed to allocate (?:'[^'\n]{0,40}' )?buffer"
    r"(?:, size = " + _SIZE + r")?"
)
#: ggml-metal refusing to map a buffer over the device's largest single Metal buffer
#: ("ggml_metal_add_buffer: buffer 'data' size 18300780544 is larger than buffer maximum of
#: 17179869184"): the model's weights do not fit one unified-memory buffer
_RX_GGML_METAL_MAX = re.compile(
    r"\bggml_metal_add_buffer: (?:error: )?buffer '[^'\n]{0,40}' size (\d+) is larger than buffer"
    r" maximum of (\d+)\b"
)
#: Metal refusing a command buffer for want of memory (MLX, and any Metal program on Apple
#: silicon): '[METAL] Command buffer execution failed: Insufficient Memory (...kIOGPU...)'
_RX_METAL_OOM = re.compile(
    r"\bkIOGPUCommandBufferCallbackErrorOutOfMemory\b"
    r"|\bMTLCommandBufferErrorDomain Code=8 \"Insufficient Memory"  # Swift's MetalExecutionError
    # MLX over Metal's buffer limit ('[metal::malloc] Attempting to allocate N bytes ...'; before
    # that tag, libc++abi's 'std::runtime_error: Attempting to allocate N bytes which is greater
    # than the maximum allowed buffer size of M bytes.')
    r"|(?:\[metal::malloc\]|std::runtime_error:(?= Attempting to allocate \d+ bytes which is greater"
    r" than the maximum allowed buffer size\b)) Attempting to allocate (\d+) bytes"
    r"|\[METAL\] Command buffer execution failed: Insufficient Memory\b"  # (its code cut off)
)
_RX_SWIFT_ERROR_TYPE = re.compile(r"\b([A-Za-z_]\w*Error): Error Domain=MTL")
#: libc++abi's last words for an uncaught C++ exception (macOS)
_RX_LIBCXXABI_TYPE = re.compile(r"uncaught exception of type ([A-Za-z_]\w*(?:::\w+)*)")
_RX_EXCEED = re.compile(r"Allocation on device (\d+)\s+would exceed allowed memory")
#: the same table's lines flattened into a title, its first sentence cut: 'out of memory,
#: Requested : 8.01 GiB Device limit : 15.70 GiB'
_RX_EXCEED_FRAGMENT = re.compile(
    r"out of memory\)?,? Requested\s*: ?"
    + _SIZE
    + r"\s+Device limit\s*: ?"
    + _SIZE
    + r"|\bexceed allowed memory\.? \(out of memory\)"  # a title keeping the message's tail
    # the table alone, its head cut by the paste: only this message prints these three rows
    + r"|^Requested\s*: ?"
    + _SIZE
    + r"\s*\n\s*Device limit\s*: ?"
    + _SIZE
    + r"\s*\n\s*Free \(according to CUDA\)\s*:",
    _M,
)
_RX_ALLOC_ON_DEVICE = re.compile(
    r"(?:^|OutOfMemoryError: |!!! |\*\* |: |^#+ |(?<=\S) |(?<=\w:)|(?<=\uff1a))Allocation on device"
    # (at the line's end, before a dash, before Rich's right-hand 'execution.py:430' column, or
    # before the next record's timestamp glued on by a print without a newline, as ComfyUI's
    # /internal/logs form shows it: '... Allocation on device 2025-03-21T16:15:34.544348 - ')
    r"(?:\s*$|(?=\s*[-\u2013\u2014])|(?=\s{2,}[\w.-]+\.py:\d+\s*$)|(?=\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+ - ))"
    r"|OutOfMemoryError:? Allocation on device\b"
    # (a title or a line that starts with the toast, the user's sentence glued on after a comma)
    r"|^(?:#+ )?Allocation on device(?=, )",
    _M,
)
_RX_CUDA_ERROR_OOM = re.compile(
    r"\b(CUDA|HIP|ROCm) (?:driver |runtime )?[Ee]rror: ?out of memory|\b(cuda|hip)ErrorMemoryAllocation\b|hipErrorOutOfMemory|\bHIP_ERROR_OutOfMemory\b|\bhipError_t\(1002\)"
    # the driver API's name (Triton, CuPy, numba, ...), not source comparing a result with it
    r"|(?<![A-Za-z0-9_])(CUDA)_ERROR_OUT_OF_MEMORY(?![A-Za-z0-9_])"
    # a check macro naming the runtime call, then the runtime's error string (camp, RAJA:
    # 'campHipErrchk(hipStreamCreate(&s)) out of memory .../resource/hip.hpp:154')
    r"|\b(cuda|hip)[A-Z]\w*\((?:[^()\n]|\([^()\n]*\))*\)\)? out of memory\b"
)
#: CUDA's error 2 (cudaErrorMemoryAllocation) as torch 0.x and C++ frameworks print it:
#: ``cuda runtime error (2) : out of memory at ...`` (THC's exception, spaces optional),
#: ``THCudaCheck FAIL file=... error=2 : out of memory``, glog's ``Check failed: error ==
#: cudaSuccess (2 vs. 0)  out of memory`` (Caffe) or ``cudaSuccess == cudaStat (0 vs. 2)``
_RX_CUDA_LEGACY_OOM = re.compile(
    r"\bcuda runtime error ?\(2\) ?: ?out of memory"
    r"|\bTHCudaCheck FAIL\b[^\n]*?\berror=2 : out of memory"
    r"|\bcudaSuccess\b[^\n]{0,40}?\((?:2 vs\. 0|0 vs\. 2)\)[^\n]{0,40}?out of memory"
    # the runtime's error string as CUDA programs' own checks print it: the samples'
    # ``GPUassert: out of memory <file> <line>``, miners' ``Cuda error in func "..." at line
    # N: out of memory``, spconv/tensorview's ``cuda failed with error 2 out of memory``
    r"|\bGPUassert: out of memory\b"
    r"|\bError Code \d+: Cuda Runtime \(out of memory\)"  # TensorRT's allocator
    r"|\bcuda error in func\b[^\n]{0,80}?: ?out of memory\b"
    r"|\bcuda failed with error (?:2\W{0,3})?out of memory\b"  # (CTranslate2: no number)
    # Haskell's accelerate-cuda: '... CUDA/State.hs:86 (unhandled): CUDA Exception:' and the
    # driver's string on the line after it
    r"|\bCUDA Exception: ?\n?out of memory\b"
    r"|\bCUDA failure 2: ?out of memory\b"  # onnxruntime's CUDA provider (CudaCall)
    r"|\bCUDA error at\b[^\n]{0,200}? - out of memory\b"  # COLMAP's CUDA_SAFE_CALL
    r"|\bCuda Error in \w+: 2 \(out of memory\)"  # TensorRT 7's safe runtime
    # ggml's CUDA backend (llama.cpp, and the GGUF loaders built on it)
    r"|\bcudaMalloc\w* failed: ?out of memory\b"
    r"|\bCUDA error 2 at \S+: out of memory\b"
    r"|\bCUDA Error 2, out of memory\b"  # tinygrad's CUDA runtime (exo)
    r"|\bOut of memory in cu[A-Z]\w*\("  # a driver API call's failure (Blender Cycles)
    # ZLUDA's and users' 'CUDA: out of memory' (not a sentence's 'CUDA: Out of memory error in
    # a ...': no program prints 'memory error' after those words, a user naming one does)
    r"|\bCUDA ?: ?out of memory\b(?!\s+error\b)",
    re.IGNORECASE,
)
#: torch's DataLoader re-raising what failed in its pinning thread (page-locking host RAM)
_RX_PIN_THREAD = re.compile(r"\bCaught (\w+Error) in pin memory thread\b")
#: Intel's Level Zero / Unified Runtime refusing a device allocation (torch XPU, IPEX)
_RX_XPU_DEVICE_OOM = re.compile(
    r"\b(?:UR_RESULT|ZE_RESULT|PI)_ERROR_OUT_OF_DEVICE_MEMORY(?![A-Za-z0-9_])"
)
#: Vulkan's result for device memory running out (ggml_vulkan, stable-diffusion.cpp, ncnn):
#: the C name, or vulkan.hpp's enumerator as ggml prints it. Vulkan is none of the backends
#: this watchdog names, so the backend stays unknown.
_RX_VULKAN_DEVICE_OOM = re.compile(
    # (ggml_vulkan's 'No suitable memory type found: ErrorOutOfDeviceMemory' is a request for a
    # memory type the device lacks, HostCached on a Raspberry Pi: nothing ran out)
    r"\bVK_ERROR_OUT_OF_DEVICE_MEMORY\b"
    r"|(?<![A-Za-z0-9_])(?<!No suitable memory type found: )e?ErrorOutOfDeviceMemory\b"
    # ggml_vulkan's own line for it, with the size it asked for
    # (a title may paste it without the 'ggml_vulkan: ' it was logged under)
    r"|\b(?:ggml_vulkan: )?Device memory allocation of size (\d+) failed\b"
    # ncnn's: the result code itself (-2 is VK_ERROR_OUT_OF_DEVICE_MEMORY)
    r"|\bvkAllocateMemory failed -2\b"
)
#: OpenVINO's GPU plugin (Intel GPUs) when OpenCL could not get device resources: its
#: '[GPU] CL_OUT_OF_RESOURCES exception', or its message for the same after a driver error
#: ('... GPU plugin can't finish correctly. Please try to update the driver or reduce memory
#: consumption ... to avoid CL_OUT_OF_RESOURCES exception')
_RX_OPENVINO_GPU_OOM = re.compile(
    r"\[GPU\] CL_OUT_OF_RESOURCES\b|\bCL_OUT_OF_RESOURCES exception\b|\[GPU\] out of GPU resources\b"
    r"|GPU plugin can't finish correctly\. Please try to update the driver or reduce memory consumption"
)
#: the amdgpu kernel driver refusing a command submission for want of VRAM (or GTT); newer
#: kernels prefix the device instead of the function ('amdgpu 0000:03:00.0: [drm] *ERROR* ...')
_RX_AMDGPU_CS_NOMEM = re.compile(
    r"(?:\[drm:amdgpu_cs_ioctl \[amdgpu\]\]|\bamdgpu [0-9a-f:.]+: \[drm\]) \*ERROR\* Not enough"
    r" memory for command submission"
)
#: ... and the same runtimes out of host RAM (oneAPI's allocations on the host side)
_RX_XPU_HOST_OOM = re.compile(
    r"\b(?:UR_RESULT|ZE_RESULT|PI)_ERROR_OUT_OF_HOST_MEMORY(?![A-Za-z0-9_])"
)
#: how much a CUDA runtime failure asked for, where the program says: ggml's ``allocating
#: 30649.55 MiB on device 0: cudaMalloc failed``, TensorFlow's ``failed to alloc 374391296 bytes
#: on host``
_RX_CUDA_ERROR_REQUEST = re.compile(
    r"\ballocating "
    + _SIZE
    + r" on device (\d+): cudaMalloc|\bfailed to alloc (\d+) bytes (?:on |unified memory)"
    r"|\bfailed to allocate \S+ \((\d+) bytes\) from device"  # TensorFlow's stream executor
    r"|\bRequested amount of GPU memory \((\d+) bytes\)"  # TensorRT
    r"|\bfailed to allocate (\d+(?:\.\d+)?)([KMGT]) from device"  # TensorFlow, 2^10 units
    r"|\bfailed to allocate buffer of length (\d+)"  # IREE's HIP/CUDA allocator
)
#: torch's device message pasted from its second sentence on (the first one, ``CUDA out of
#: memory.``, cut off): the torch <= 2.0 shape ``Tried to allocate X (GPU N; Y total capacity;``
#: or the newer ``Tried to allocate X. GPU N has a total capacity of``; which backend is not said
_RX_TORCH_BODY = re.compile(
    r"(?:^|(?<=[\s:'\"`(]))Tried to allocate "
    + _SIZE
    + r"(?:\s+\(GPU \d+;\s+"
    + _SIZE
    + r" total capacity|\. GPU \d+\s+has a total capacity of )",
    _M,
)
#: CUDA's "out of memory" error string translated (a browser's or a machine translation of a
#: pasted check or title): the error name's colon, then the translation. A word list, so it
#: only adds to the rules above; the Chinese literal '没有记忆' is a real machine translation.
#: One needle, 'CUDA:', gates it (each needle is one more pass of the stdlib prefilter).
_RX_CUDA_TRANSLATED_OOM = re.compile(
    r"CUDA ?: ?(?:没有记忆|内存不足|显存不足|記憶體不足|メモリ不足|メモリが不足|메모리 부족"
    r"|недостаточно памяти|нехватка памяти|sin memoria|memoria insuficiente|sem memória"
    r"|mémoire insuffisante|nicht genügend Speicher)"
)
_RX_LIB_ALLOC = re.compile(
    r"\b(CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT|HIPBLAS|ROCBLAS|MIOPEN|HIPSOLVER)_STATUS_(?:ALLOC_FAILED|NOT_ALLOCATED)\b",
    re.IGNORECASE,
)
_RX_DIRECTML = re.compile(
    r"(?:Could not allocate tensor with (\d+) bytes\. )?There is not enough GPU video memory available"
    # its first sentence alone (a title), the size a user replaced: 'with XXXXXXXX bytes'
    r"|Could not allocate tensor with (?:(\d+)|[\dXx]*[Xx][\dXx]*) bytes"
    r"|\bDML allocator out of memory"  # torch-directml's heap allocator
    r"|(?i:\bDirectML out of memory\b)"
)


def _wrap_tolerant(text: str) -> str:
    """``text`` as a pattern that still matches where a console's fixed-width hard wrap put a
    newline between any two of its characters (the width, not the words, decides where)."""
    return "\r?\n?".join(re.escape(ch) for ch in text)


#: a bare 'Error 1455' (a title, a sentence): Windows' ERROR_COMMITMENT_LIMIT, the paging file
_RX_ERROR_1455 = re.compile(r"\bError 1455\b")
_RX_PAGEFILE_TYPE = re.compile(
    r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*Error): \[WinError 1455\]"
    r"|((?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception)): [^\n]*\(0x800705AF\)"
)
_RX_PAGEFILE = re.compile(
    r"(?:[Oo][Ss] ?[Ee]rror|WinError) 1455\b"  # ('OS Error 1455' in a title)
    # or Windows' text for it alone, as a line or an exception's message (a title)
    # (after an exception's type, its HRESULT, a tool's lead ending in ': ' such as OpenJ9's
    # 'JVMJ9VM011W Unable to load j9gc29: ', or a tool's tag: '[NBug] '; not after a
    # 'Traceback: ', which no program prints: a user's paraphrase in a sentence)
    # (or an issue title that is the text, under its heading mark)
    # (a console's hard wrap may cut it anywhere, mid-word: 'The paging fi' / 'le is too small')
    # (or after Java's 'CreateProcess error=1455, ')
    r"|(?:^|^#+ |(?<=: )(?<!Traceback: )|(?<=\] )|(?<=1455, ))"
    + _wrap_tolerant("The paging file is too small for this operation to complete")
    + r"\b"
    # Windows' own text for it in a zh-CN install, wherever it is quoted (no number with it)
    r"|页面文件太小，?无法完成操作"
    # its HRESULT (HRESULT_FROM_WIN32(1455)), the same in every language: .NET's COMException
    r"|\(0x800705AF\)"
    # (retyped by a user with a 'to' for 'too', after the type they kept)
    r"|(?<=: )The paging file is to small for this operation to complete\b",
    _M,
)
#: c10's host allocator, and the TH one before it (torch 0.x and Lua Torch7 print
#: ``$ Torch: not enough memory: you tried to (re)allocate 11GB. Buy new RAM!``, GB = 2^30)
_RX_CPU_ALLOC = re.compile(
    r"(?:(?:Default)?CPUAllocator|\$ Torch) ?: (?:can't allocate memory|not enough memory)(?::\s+you\s+[Tt]ried to (?:re)?allocate (\d+) ?(bytes|GB))?"
    # torch 1.1's allocator, before its message had words: posix_memalign's errno 12 (ENOMEM)
    r"|\[enforce fail at [^\]\n]*CPUAllocator\.cpp:\d+\] posix_memalign\(&data, gAlignment, nbytes\) == 0\. 12 vs 0\b"
)
#: A1111's sub-quadratic attention's own check (GB = 2^30, as every figure here)
_RX_NEED_HAVE = re.compile(r"Need: ?([\d.]+) ?GB free, Have: ?([\d.]+) ?GB free")
#: dlib's CHECK_CUDA: 'Error while calling cudaMalloc(&data, n) in file .../gpu_data.cpp:181.
#: code: 2, reason: out of memory' (code 2 is cudaErrorMemoryAllocation)
_RX_DLIB_CUDA_OOM = re.compile(
    r"\bError while calling (cuda\w+)\([^\n]{0,300}?\) in file [^\n]{0,300}?\. code: 2, reason: out of memory"
)
#: ggml's CUDA backend refused page-locked host RAM (cudaMallocHost); it goes on with an
#: ordinary host buffer, so the failure is recovered
_RX_GGML_PINNED = re.compile(  # (its reason is CUDA's error string: a driver's is no OOM)
    # (before ggml named the function, 2023: 'WARNING: failed to allocate 1024.00 MB of pinned
    # memory: out of memory')
    r"(?:\bggml_cuda_host_malloc: |^WARNING: )failed to allocate " + _SIZE + r" of pinned memory"
    r"(?!: (?!out of memory))",
    _M,
)
#: host libraries' own allocators: OpenCV's (cv::OutOfMemoryError, CV_StsNoMem = -4, in
#: alloc.cpp) and Intel MKL's (under numpy and CTranslate2, even when the model runs on CUDA)
_RX_HOST_LIB_ALLOC = re.compile(
    r"\(-4:Insufficient memory\) Failed to allocate (\d+) bytes|\bmkl_malloc: failed to allocate memory\b"
    r"|\boneapi::mkl::[\w:]*: cannot allocate memory on host\b"  # oneMKL's (SYCL builds)
)
#: Electron's renderer (ComfyUI Desktop's window) killed for running out of memory
_RX_RENDERER_OOM = re.compile(
    r"\brender-process-gone\b[^\n]*\breason=oom\b"
    r"|\bRenderer process oom\b"  # (electron-log's line for the same event)
    # (its details object printed: '{ ... exitCode: -536870904, reason: oom }', the key alone
    # on its line)
    r"|^[ \t]*reason: ['\"]?oom['\"]?,?[ \t]*$",
    _M,
)
#: Windows' E_OUTOFMEMORY message (DirectML's devices and the host's heap both raise it)
_RX_WIN_OUTOFMEMORY = re.compile(  # (ERROR_OUTOFMEMORY's text, and ERROR_NOT_ENOUGH_MEMORY's)
    r"Not enough memory resources are available to (?:complete this operation|process this command)"
    # or their HRESULTs (HRESULT_FROM_WIN32(8), E_OUTOFMEMORY), the same in every language:
    # .NET's '内存资源不足，无法处理此命令。 (异常来自 HRESULT:0x80070008)'
    r"|\bHRESULT:? ?0x8007000[8Ee]\b"
)
#: TensorFlow's op kernels: 'Resource exhausted: OOM when allocating tensor with shape[...]'
#: the device TensorFlow names in its OOM ('... on /job:localhost/replica:0/task:0/device:GPU:0')
_RX_TF_DEVICE = re.compile(r"/device:GPU:(\d+)\b")
#: ... or its BFC allocator's name for that GPU, and the size BFC failed to find
_RX_TF_BFC_GPU = re.compile(r"\bAllocator \(GPU_(\d+)_bfc\) ran out of memory")
_RX_TF_BFC_FAILED = re.compile(
    r"ran out of memory trying to allocate " + _SIZE + r"\.\s+Current allocation summary follows"
)
_RX_TF_EXHAUSTED_TYPE = re.compile(
    r"((?:[A-Za-z_][A-Za-z0-9_]*\.)*ResourceExhaustedError)(?: \(see above for traceback\))? ?: ?"
    r"OOM(?: when allocating tensor|[ \t]*$)",
    _M,
)
#: XLA's device allocator (JAX, TensorFlow with XLA) refusing a buffer: 'RESOURCE_EXHAUSTED: Out
#: of memory while trying to allocate 7406166528 bytes.', older '... Out of memory allocating N
#: bytes.', the BFC's 'RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB (3206250496B)
#: on device ordinal 0'. The device is an accelerator; which runtime, the text must say.
_RX_XLA_OOM = re.compile(
    # (a console's wrap may cut it after 'Out ', the record keeping both lines)
    # (a title may put the user's '*' for the figure)
    r"\b(?:RESOURCE_EXHAUSTED|Resource exhausted|ResourceExhaustedError): (?:Out ?\n?of memory (?:while trying to allocate|allocating) (?:(\d+)|\*) bytes\b"
    r"|Failed to allocate request for [\d.]+ ?[KMGT]i?B \((\d+)B\) on device ordinal (\d+))"
    # (a title holding the type and the message's head alone: '# RuntimeError: Resource exhausted')
    r"|(?m:^)#+ (?:[\w.]*Error: )?(?:RESOURCE_EXHAUSTED|Resource exhausted)(?=\s*$)"
)
#: Intel Extension for TensorFlow's BFC allocator on an Intel GPU, at error level and with the
#: exact request: 'E itex/core/devices/bfc_allocator.cc:101] Allocator ran out of memory trying
#: to allocate 10529419660 Bytes (rounded to 10529419776 Bytes)'
_RX_ITEX_BFC = re.compile(
    r"\bitex/core/devices/bfc_allocator\.cc:\d+\] Allocator ran out of memory trying to allocate (\d+) Bytes"
)
_RX_TF_EXHAUSTED = re.compile(  # (or its exception's name, a space before the colon as retyped)
    r"Resource exhausted: OOM when allocating tensor"
    # (TF 1.x's final error: 'ResourceExhaustedError (see above for traceback): OOM when ...')
    r"|ResourceExhaustedError(?: \(see above for traceback\))? ?: ?OOM when allocating tensor"
    r"|^OOM when allocating tensor with shape"  # (the message alone on its line, as TF 2 prints it)
    r"|^# (?:[A-Za-z_]\w*\.)*ResourceExhaustedError ?: ?OOM[ \t]*$"  # (a title: its head alone)
    # BFC's failing allocation (its warning that says 'this is not a failure' is not one)
    r"|\bAllocator \(\w+\) ran out of memory trying to allocate [\d.]+\s?[KMGT]i?B\.\s+Current allocation summary follows",
    _M,
)
#: numpy's MemoryError text itself (no type on the line: ComfyUI's exception header)
_RX_NUMPY_ARRAY_MEMORY = re.compile(r"\bcannot allocate array memory\b")
#: numpy 1.16-1.17's wording, before it printed the size: 'Unable to allocate array with shape
#: (93849, 1, 52300) and data type float64'
_RX_NUMPY_SHAPED = re.compile(
    r"\b[Uu]nable to allocate array with shape \([\d, ]*\) and data type \w"
)
#: ONNX Runtime's arena allocator (insightface, ReActor, DWPose and rembg run on it): the arena
#: of the execution provider in use, the CUDA one in ComfyUI's case unless the text says CPU
_RX_ONNX_ARENA = re.compile(
    r"Failed to allocate memory for requested buffer of size (\d+)"
    r"|(?<=AllocateRawInternal )Failed to alloc(?:ate)?(?: [a-z ]{0,30})?$"  # (a title cut there)
    # (newer ORT prints the signature: 'AllocateRawInternal(size_t, bool, ...) Failed to alloc')
    r"|\bAllocateRawInternal\([^)\n]{0,200}\) Failed to alloc(?:ate)?(?: [a-z ]{0,30})?$",
    _M,
)
#: the CPU allocator's message machine-translated, every word but the names (``DefaultCPUAllocator
#: ：内存不足：您尝试分配 96153108480 字节``): the name, a colon, then text in another script. No
#: word list: the allocator names itself, and its only figure is the request in bytes
_RX_CPU_ALLOC_TRANSLATED = re.compile(
    r"(?:Default)?CPUAllocator\s?[:\uff1a]\s?[^\x00-\x7f](?:[^\n]{0,80}?(?<!\d)(\d{4,})(?!\d))?"
)
#: the CPU allocator's message from its second clause on (an issue title)
_RX_CPU_ALLOC_TAIL = re.compile(  # (at a line's start or quoted; a retyped unit, '0BG', drops the size)
    r"(?:^|(?<=[\"'`\u201c])|(?<=Allocator: ))not enough memory: you tried to allocate (\d+) ?(?:(bytes|GB)\b)?"
    # (an issue title copying it capitalises its first word)
    r"|(?<=^# )Not enough memory: you tried to allocate (\d+) ?(?:(bytes|GB)\b)?",
    _M,
)
#: the exception type of the CPU allocator's enforce line, wherever it is quoted
_RX_ENFORCE_TYPE = re.compile(r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*Error): \[enforce fail at ")
_RX_MMAP = re.compile(  # (the size and path may be a user's '...')
    r"unable to mmap (?:(\d+) bytes from file )?[\s\S]{0,400}?Cannot allocate memory"
    r"|\bMemory mapping file failed: Cannot allocate memory"  # numpy's memmap, Arrow's
)
_RX_NUMPY = re.compile(
    r"[Uu]nable to allocate (\d+(?:\.\d*)?) ?([KMGTPE]?i?B|bytes) for (?:an )?array"
)
_RX_GOT_OOM = re.compile(r"Got an OOM, unloading all loaded models")
_RX_TIPS = re.compile(r"This error means you ran out of memory on your GPU")
#: MPSAllocator's refusal of a single buffer over the device's limit; torch formats the size
#: with two decimals (``8.21 GB``; newer torch ``19.38 GiB``), which keeps other programs'
#: "invalid buffer size: 64" out
_RX_MPS_BUFFER = re.compile(
    r"(?:\b([A-Za-z_]\w*Error): ?)?Invalid buffer size: ?(?:(\d+\.\d\d)|[#xX]+) ?([KMG]i?B)\b"
)
#: an uncatchable C++ exception ending the process (``terminate called after throwing an
#: instance of 'c10::AcceleratorError'``)
_RX_CXX_TERMINATE = re.compile(r"instance of '([\w:]+)'")
#: a C++ exception an emulator's thread reports thrown ('RSX: class std::runtime_error thrown:')
_RX_CXX_THROWN = re.compile(r"\bclass (std::\w+) thrown\b")
#: custom-node packs' own OOM stops and hints, worded as their sources print them (the pack's
#: text is often all a paste has: VideoHelperSuite raises it instead of a torch message, and
#: SUPIR prints its hint before re-raising, so a cut traceback may end before torch's line)
_RX_VHS_LIMIT = re.compile(
    r"Memory limit hit after loading (\d+) frames|Meta Batch set to (\d+) frames but only (\d+) can fit in memory"
)
#: libraries that refuse before host RAM runs out: imageio's memtest (``imageio.mimread() has
#: read over 256 MiB of image data.`` / ``Stopped to avoid memory problems.``) and Ollama's
#: ``model requires more system memory (164.8 GiB) than is available (13.4 GiB)``
_RX_LIB_RAM_GUARD = re.compile(
    r"\bmimread\(\) has read over \d+ MiB of image data|^Stopped to avoid memory problems"
    r"|model requires more system memory \(" + _SIZE + r"\) than is available \(" + _SIZE + r"\)"
    r"|\bit is likely that you have (?:un|in)sufficient RAM\b",  # Wan2GP (mmgp's pinning)
    _M,
)
_RX_SUPIR_HINT = re.compile(r"too large of an image or batch_size for SUPIR was used")
#: ACE-Step 1.5's own VRAM pre-flight refusal: its WARNING 'VRAM pre-flight failed:
#: Insufficient free VRAM: need ~1.1 GB, only 0.0 GB available.', and the same refusal raised
#: (ComfyUI's exception header, or an exception line) when the caller does not catch it. The
#: two together are one failure (classify/fold.py places it at the raise).
_RX_ACESTEP_PREFLIGHT = re.compile(
    r"(?:!!! Exception during processing !!! |^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*Error: "
    r"|\bVRAM pre-flight failed: )"
    r"(?:[^\n]*?: )?Insufficient free VRAM: need ~?" + _SIZE + r", only " + _SIZE + r" available",
    _M,
)
#: ggml's allocators refusing a backend buffer (llama.cpp, whisper.cpp, stable-diffusion.cpp,
#: koboldcpp, ollama): 'ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size N',
#: 'alloc_tensor_range: ...', the CPU backend's 'ggml_backend_cpu_buffer_type_alloc_buffer:
#: failed to allocate buffer of size N', the loader's 'unable to allocate ROCm0 buffer', and
#: ggml's context allocation ('GGML_ASSERT(ctx->mem_buffer != NULL) failed', host RAM). The
#: buffer's backend names the pool. (A paste may glue the name to the line before: no \b.)
_RX_GGML_BUFFER = re.compile(
    r"\bfailed to allocate (CUDA|ROCm|Vulkan|CPU|SYCL|MUSA)\d* buffer of size (\d+)"
    r"|ggml_backend_(cpu|cuda|vulkan|sycl)_buffer_type_alloc_buffer: failed to allocate buffer of size (\d+)"
    r"|\bunable to allocate (CUDA|ROCm|Vulkan|CPU|SYCL|MUSA)\d* buffer\b"
    r"|\bGGML_ASSERT\(ctx->mem_buffer != NULL\) failed"
)
_GGML_BUFFER_BACKENDS = {
    "cuda": Backend.CUDA,
    "rocm": Backend.ROCM,
    "sycl": Backend.XPU,
    "cpu": Backend.CPU,
}
#: vLLM's engine finding no GPU memory left for its KV cache after loading the model
_RX_VLLM_NO_CACHE = re.compile(  # (not its raise line's source: 'raise ValueError("No ...')
    r"(?<!\(\")\bNo available memory for the cache blocks\b"
)
_RX_VLLM_NO_CACHE_TYPE = re.compile(
    r"\b((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*Error): No available memory for"
)
#: the NVIDIA toolchain's (the driver's JIT, ptxas, nvlink) own failed host allocation:
#: 'fatal   : Memory allocation failure' (a title collapses its spaces)
_RX_NV_FATAL_ALLOC = re.compile(r"^(?:#+ )?fatal\s+: (Memory allocation failure)\b", _M)
#: comfy-aimdo's VRAM allocator (ComfyUI's dynamic VRAM loading) out of its device range: a
#: MemoryError, but of VRAM ('MemoryError: VBAR OOM'). (Its 'VBAR allocation failed' is no
#: memory running out: the virtual address space for the range could not be reserved, a
#: driver's or a vGPU's limit; every label of it in the corpus reads so.)
_RX_VBAR_OOM = re.compile(r"MemoryError: VBAR OOM\b")
#: NCCL's own CUDA check (torch.distributed's collectives): 'include/alloc.h:178 NCCL WARN Cuda
#: failure 'out of memory''. (Its next line, 'Failed to CUDA calloc N bytes', holds no needle.)
_RX_NCCL_CUDA_OOM = re.compile(  # (NCCL 2.0-2.3 wrote 'init.cu:218 WARN Cuda failure ...')
    r"\b(?:NCCL WARN|\.cu:\d+ WARN) Cuda failure '?out of memory'?"
)
#: a hosting platform's own report of the memory limit it stopped a service at (Render:
#: 'Ran out of memory (used over 512MB) while running your code.')
_RX_HOSTED_LIMIT = re.compile(  # (the event starts at its 'Instance failed: <id>' line)
    r"(?:^Instance failed: \S+\s*\n)?Ran out of memory \(used over \d+ ?[MG]i?B\) while running your code",
    _M,
)
#: SwarmUI's words when its ComfyUI backend died with the host's memory nearly full
_RX_SWARMUI_OVERLOAD = re.compile(
    r"\bYour system memory usage exceeded [\d.]+% just before the backend process failed"
)
#: TensorRT's builder refusing one tactic's scratch memory: 'resizePhysical::154] Error Code 2:
#: OutOfMemory (Requested size was N bytes.)'. The builder skips that tactic and goes on, so
#: it is recovered (a build that then finds no tactic at all says so in an error of its own).
_RX_TRT_RESIZE = re.compile(
    r"\bresizePhysical::\d+\] Error Code 2: OutOfMemory\b(?: \(Requested size was (\d+) bytes)?"
)
#: macOS's dialog when the system runs out of application memory (RAM and swap both taken)
_RX_MACOS_APP_MEMORY = re.compile(r"\bYour system has run out of application memory\b")
#: V8 (Node.js: the frontend's builds, Electron) at its heap limit: 'FATAL ERROR: Reached heap
#: limit Allocation failed - JavaScript heap out of memory' (a limit of its own, not the host's)
_RX_V8_HEAP = re.compile(
    r"(?m)\bAllocation failed - JavaScript heap out of memory\b"
    # (a title cut at GitHub's limit or by the user before ' - JavaScript heap out of memory')
    # (its message read from 'Allocation failed', as in the body's copy, so the two fold)
    r"|(?:(?<=^# FATAL ERROR: Reached heap limit )"
    r"|(?<=^# FATAL ERROR: Ineffective mark-compacts near heap limit ))Allocation failed(?=\s*$)"
    r"|\bv8::internal::V8::FatalProcessOutOfMemory\("  # (a crash report's frame: V8's OOM handler)
    # (newer V8, Deno's banner: 'Fatal JavaScript out of memory: Reached heap limit'; and
    # V8's own allocations failing: '# Fatal process out of memory: Oilpan: CagedHeap ...')
    r"|\bFatal JavaScript out of memory: |\bFatal process out of memory: "
)
#: the Java virtual machine's heap running out: HotSpot's 'java.lang.OutOfMemoryError: Java
#: heap space' / 'GC overhead limit exceeded', Android's 'Failed to allocate a N byte
#: allocation with M free bytes' (ART logs it as 'Throwing OutOfMemoryError "Failed ..."')
_RX_JAVA_OOM = re.compile(
    r"\b(java\.lang\.OutOfMemoryError): (?:Java heap space|GC overhead limit exceeded|Metaspace)\b"
    r"|(?:\b(java\.lang\.OutOfMemoryError): |\bThrowing (OutOfMemoryError) \")"
    r"Failed to allocate a (\d+) byte allocation with (\d+) free bytes"
    r"(?:[^\n\"]{0,80}?, max allowed footprint (\d+))?"
    r"(?:[^\n\"]{0,80}?, growth limit (\d+))?"  # (the heap's cap, the total the corpus reads)
    # (NIO's direct buffers: 'Cannot reserve N bytes of direct buffer memory (allocated: A,
    # limit: L)', or 'Direct buffer memory'; the VM's 'Requested array size exceeds VM limit')
    r"|\b(java\.lang\.OutOfMemoryError): (?:Cannot reserve (\d+) bytes of direct buffer memory"
    r"(?: \(allocated: (\d+), limit: (\d+)\))?|Direct buffer memory\b|Requested array size exceeds VM limit\b)"
)
#: MLX's Metal allocator on Apple silicon: '[malloc_or_wait] Unable to allocate N bytes.' (also
#: '[metal::malloc]'): the unified memory's Metal budget
#: the Java VM's message as an issue's title without its type ('# GC overhead limit exceeded')
_RX_JAVA_GC_TITLE = re.compile(r"^#+ GC overhead limit exceeded\s*$", _M)
_RX_MLX_MALLOC = re.compile(r"\[malloc_or_wait\] Unable to allocate (\d+) bytes\b")
#: .NET's OutOfMemoryException (the CLR's heap, or a native allocation it wraps): host memory
_RX_DOTNET_OOM = re.compile(r"\bSystem\.OutOfMemoryException\b")
#: the same raised with its message ('System.OutOfMemoryException: Insufficient memory ...')
_RX_DOTNET_OOM_TYPED = re.compile(r"\bSystem\.OutOfMemoryException: ")
#: a GPU driver's own words for an application asking for more device memory than there is
#: (NVIDIA's OpenGL driver's crash dialog, hard-wrapped as the dialog shows it)
_RX_DRIVER_GPU_MEMORY = re.compile(
    r"\bAn application has requested more GPU memory than is(?:\s+available in the system\b|\s*$)",
    _M,
)
#: MIOpen's HIP handle refusing a device buffer ('MIOpen Error: .../handlehip.cpp:70: Memory
#: not available to allocate buffer: 655360000')
_RX_MIOPEN_BUFFER = re.compile(r"\bMemory not available to allocate buffer: (\d+)\b")
#: rule → the pack that printed it
_NODE_PACK_RULES = {
    "vhs-memory-limit": "ComfyUI-VideoHelperSuite",
    "supir-oom-hint": "ComfyUI-SUPIR",
    "acestep-vram-preflight": "ACE-Step",
    "swarmui-memory-overload": "SwarmUI",
}
#: an exception whose own message says memory ran out, whatever its type (a custom node's
#: ``RuntimeError: Out of memory, try a smaller tile size``, ``ValueError: not enough GPU
#: memory for ...``): raised, not prose. Which pool its words name decides (``_RX_RAM_WORDS``).
#: (the type at a line's start, after a backtick, or after an issue title's tag: '[Bug]: ')
_RX_EXC_OOM_WORDS = re.compile(  # the type in its printed case: a lower-cased paste is restored
    r"(?:^|(?<=`)|(?<=\]: ))((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*Error|(?:[A-Za-z_]\w*)?Exception)):[ \t]?[^\n]*?"
    r"(?i:\b(?:"
    r"(?:out of|not enough|insufficient) (?:gpu |video |cuda |device |system |host )?"
    r"(?:memory|vram|ram)|oom)\b)",
    _M,
)
_RX_RAM_WORDS = re.compile(r"\b(?:system|host|cpu) (?:memory|ram)\b|\bram\b", re.IGNORECASE)
#: a traceback frame in a custom node pack's folder (``custom_nodes/<pack>/...``)
_RX_PACK_FRAME = re.compile(r"custom_nodes[/\\]+([^/\\\s\"']+)[/\\]")


def _raising_pack(lines: list[str]) -> str | None:
    """The custom node pack of the traceback's innermost frame in a pack, if any: the pack
    that raised an exception whose own words say memory ran out."""
    for line in reversed(lines):
        if "custom_nodes" in line and (m := _RX_PACK_FRAME.search(line)) is not None:
            return m.group(1)
    return None


#: Intel's IPEX refusing one allocation over 4 GB (not an OOM, though torch's figures follow)
_RX_XPU_4GB = re.compile(r"can NOT allocate memory block with size larger than 4GB")

#: detectron2's and mmdetection's ``retry_if_cuda_oom`` moving a call to the CPU after torch's
#: OOM: 'Attempting to copy inputs of <function paste_masks_in_image at 0x7f..> to CPU due to
#: CUDA OOM' (a recovery: the call is retried there)
_RX_COPY_INPUTS_TO_CPU = re.compile(
    r"Attempting to copy inputs (?:of [^\n]{0,400}? )?to CPU due to CUDA OOM"
)
#: the logger that printed it names the library: detectron2's 'd2.utils.memory', mmdet's
#: 'mmengine' (its AvoidOOM helper logs through MMEngine's logger)
_RX_COPY_INPUTS_PACK = (
    (re.compile(r"\bd2\.utils\.memory\b"), "detectron2"),
    (re.compile(r"\bmm(?:engine|det)\b"), "mmdetection"),
)

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
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*Error|(?:[A-Za-z_]\w*)?Exception))(?::[ \t]?(.*))?$", _M
)
#: the same, after an issue form's bracketed prefix ('[Bug]: MemoryError: ...'): OOM types only
_RX_OOM_EXC_LINE = re.compile(
    # (or glued to the end of a CJK sentence, in a title: '# 一直报错MemoryError: bad allocation')
    # (its identifiers ASCII: '执行demo报torch.cuda.OutOfMemoryError' is no type 'demo报torch...')
    rf"^(?:\[\w+\]: ?|#{{1,6}} [{_CJK}]*?(?<=[{_CJK}]))?((?:[A-Za-z_][A-Za-z0-9_]*\.)*(?:[A-Za-z_][A-Za-z0-9_]*)?MemoryError)(?::[ \t]?(.*))?$",
    _M,
)
#: a field of ComfyUI's Error Report in any language: ``- **<label>:** <value>``, one per line
#: or, in a paste that lost its newlines, one after another on a line
_RX_ANY_FIELD = re.compile(
    r"(?:^|\s)-\s*\*\*([^*\n]{1,40}?):\*\*[ \t]*(.*?)(?=\s+-\s*\*\*[^*\n]{1,40}?:\*\*|\s+##|$)", _M
)
_RX_EXC_TYPE_VALUE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)$")
_RX_NODE_ID_VALUE = re.compile(r"^\d+(?::\d+)*$")
#: ComfyUI's old error dialog: the node on its own line, or (an issue title) the message after it
_RX_DIALOG = re.compile(  # (pasted inside inline code or bold)
    # (or quoted in Markdown: '> Error occurred when executing CCSR_Upscale:')
    r"^(?:> ?)?[`*]{0,2}Error occurred when executing ([^:\n*`]+?):(?:[ \t`*]|$|(?=[A-Z]))",
    _M,
)
#: the dialog's whole first line, its name up to the colon that ends the line
_RX_DIALOG_LINE = re.compile(
    r"^(?:> ?)?[`*]{0,2}Error occurred when executing ([^\n]+?):[`*]{0,2}[ \t]*$", _M
)
_RX_NODE_COLON = re.compile(r"^([A-Za-z][\w\-]{1,80}) : ")
#: a Windows program's own lead after PowerShell's 'Command : ' ('docker.exe: ')
_RX_EXE_LEAD = re.compile(r"[\w.\-]+\.exe: ", re.IGNORECASE)
_RX_NODE_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{2,80}$")
_NOT_NODES = frozenset(
    {"Traceback", "Killed", "Exception", "Error", "Warning", "Logs", "Details", "Other"}
)
_HEADER = "!!! Exception during processing !!!"
_QUOTES = frozenset("\"'`")

# numbers in torch's allocator messages (new style since torch 2.1, old style before, XPU both)
_RX_TRIED = re.compile(r"Tried to allocate\s" + _SIZE)  # (a hard wrap may follow the words)
_RX_GPU_INDEX = re.compile(r"\b[GN]PU\s+(\d+)\b")  # (torch_npu writes NPU N)
#: onnxruntime's CUDA provider's failure line: 'CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ;
#: GPU=0 ; hostname=... ; file=... ; expr=cublasCreate(&cublas_handle_);'
_RX_ORT_GPU = re.compile(r"\bCU[A-Z]* failure \d+: [^;\n]* ; GPU=(\d+) ;")
_RX_TOTAL = re.compile(  # (a paste's stray blank may split the word: '4.00 GiB to tal capacity')
    r"total capac(?:i)?ty ?of " + _SIZE + r"|" + _SIZE + r" ?to ?tal ?capacity"
)
#: (``;`` then the figure; a hard wrap with a Markdown quote or heading mark may sit between)
_RX_FREE = re.compile(
    r"of\s+which " + _SIZE + r"\s+is free|;\s+(?:[#>]+\s+)?" + _SIZE + r" free[;)]"
)
#: (a wrapped console may paste a run of blanks between the figure and its unit)
_RX_PROCESS = re.compile(
    r"Process (\d+) has " + _SIZE.replace(r")\s?(", r")\s*(") + r" memory in use"
)
_RX_THIS_PROCESS = re.compile(r"this\s+process has " + _SIZE + r" memory in use")
#: a figure whose unit the paste cut after its first letters, at the end of a line
#: ('Of the allocated memory 20.58 Gi')
_SIZE_CUT = r"(\d+(?:\.\d*)?) ?([KMGT]i)(?=\n|$)"
_RX_ALLOCATED = re.compile(
    r"Of the allocated memory (?:"
    + _SIZE
    + r"|"
    + _SIZE_CUT
    + r")|"
    + _SIZE
    + r"\s+already\s+allocated|"  # (or wrapped by the console between its words)
    + _SIZE
    + r"\s+is allocated by PyTorch"
)
#: _RX_ALLOCATED's alternatives, each with the literal it cannot match without (``_find_first``)
_ALLOCATED_BRANCHES = (
    # ('Of the allocated memory' only ever introduces it: a message cut after the figure,
    # 'Of the allocated memory 37.21 GiB is allo', still gives it; and a line whose head was
    # cut, '49.39 GiB is allocated by PyTorch, and ...', too)
    (
        re.compile(r"Of the allocated memory (?:" + _SIZE + r"|" + _SIZE_CUT + r")"),
        "Of the allocated memory",
    ),
    (re.compile(_SIZE + r"\s+already\s+allocated"), "already"),
    (re.compile(_SIZE + r"\s+is allocated by PyTorch"), "is allocated by PyTorch"),
)
_RX_PRIVATE = re.compile(r"with " + _SIZE + r" allocated in private pools")
_RX_RESERVED_UNALLOC = re.compile(
    # torch>=2.1 says "and X is reserved by PyTorch but unallocated"; "is reserv" only ever
    # introduces that figure, so a message cut right after it (or inside the word, at the
    # end of its line) still gives it
    # (torch 1.0-1.3's '; X cached)', its closing bracket cut off with the paste's end)
    r"and " + _SIZE + r" is reserv(?:ed\b|e?$)|;\s*" + _SIZE + r" cached(?:\)|[ \t]*$)"
    # (a console's hard wrap inside 'bytes': 'and 0 b' / 'ytes is reserved by PyTorch ...')
    r"|and (\d+) (b)\r?\nytes is reserv",
    _M,
)
_RESERVED_UNALLOC_BRANCHES = (
    (re.compile(r"and " + _SIZE + r" is reserv(?:ed\b|e?$)", _M), "is reserv"),
    (re.compile(r";\s*" + _SIZE + r" cached(?:\)|[ \t]*$)", _M), " cached"),
    (re.compile(r"and (\d+) (b)\r?\nytes is reserv"), "ytes is reserv"),
)
_RX_RESERVED = re.compile(_SIZE + r"\s+reserved\s+in total\b")  # \s+: a message hard-wrapped here
_RX_ALLOWED = re.compile(r"[;.] " + _SIZE + r" allowed;")  # torch>=2.1: "... is free. X allowed;"
_RX_EX_ALLOCATED = re.compile(r"Currently allocated\s*:\s*" + _SIZE)
_RX_EX_REQUESTED = re.compile(r"Requested\s*:?\s*" + _SIZE)  # (a paste may drop the colons)
_RX_EX_LIMIT = re.compile(r"Device limit\s*:?\s*" + _SIZE)
_RX_EX_FREE = re.compile(r"Free \(according to CUDA\)\s*:\s*" + _SIZE)
_RX_MPS_ALLOCATED = re.compile(r"MPS allocated: " + _SIZE)
_RX_MPS_OTHER = re.compile(r"other allocations: " + _SIZE)
_RX_MPS_MAX = re.compile(r"max allowed: " + _SIZE)
#: the MPS message's middle sentence alone (an issue title): only MPS says "on private pool"
_RX_MPS_FRAGMENT = re.compile(
    r"^Tried to allocate " + _SIZE + r" on (?:private|shared) pool\b"
    # or only the tail of its watermark hint, the rest cut by the user ('Music generation
    # failed: .....disable upper limit for memory allocations (may cause system failure).')
    r"|(?:^|(?<=\.\.)\s*)disable upper limit for memory allocations \(may cause system failure\)",
    _M,
)
_RX_MPS_TRIED = re.compile(r"Tried to allocate " + _SIZE + r" on (?:private|shared) pool")

#: another process holds at least this much GPU memory → "other processes named" (see events)
_OTHERS_MIN_BYTES = 512 * _K**2


def _size(m: re.Match[str] | None, group: int = 1) -> int | None:
    """Size from the first matched (number, unit) group pair at or after ``group``."""
    if m is None:
        return None
    groups = m.groups()
    for i in range(group - 1, len(groups) - 1, 2):
        if groups[i] is not None and groups[i + 1] is not None:
            return size_bytes(groups[i], groups[i + 1])
    return None


@dataclass(frozen=True, slots=True)
class _Found:
    event: OomEvent
    #: index of the line (within the record) that carries the evidence
    line_index: int
    #: the record is ComfyUI's one-line ``!!! Exception during processing !!!`` header only
    header_only: bool = False


#: a Markdown code fence and its language tag ('```Shell'): not a line of the log
_RX_FENCE = re.compile(r"```[\w+-]*\s*")


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
        if msg[:1] in _QUOTES and not _RX_FENCE.fullmatch(msg):  # (a fence's tag is no text)
            msg = msg.lstrip("\"'`").lstrip()
        elif msg[:2] == "**" and msg[2:3].isalpha():  # a line in Markdown bold: '**OSError: ...**'
            msg = msg[2:]
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


_RX_IPYTHON_HEADER = re.compile(
    r"(?:[A-Za-z_]\w*\.)*\w*OutOfMemoryError\s{2,}Traceback \(most recent"
)
#: an OOM type with a lower-case word glued before it: Python's types are CamelCase, so the
#: word is the user's prose run into the pasted message
_RX_ASCII_TYPE_TAIL = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*$")
_RX_PROSE_GLUED_TYPE = re.compile(r"[a-z]+((?:OutOf)?MemoryError)")
_RX_DUNDER_GLUED = re.compile(r"^__\w+?__(?=[A-Za-z])")
_DEVICE_OOM_RULES = frozenset({"cuda-oom", "hip-oom", "xpu-oom", "npu-oom", "musa-oom"})


#: what follows the phrase where a lower-cased paste of torch's message ends its first sentence
_RX_SENTENCE_END = re.compile(r"\s*(?:$|[.,;:!)\]\"'`*]|[Tt]ried)", _M)


def _lowered_message(body: str, original: str) -> bool:
    """``body`` (``original`` with its case restored, same positions) holds a device OOM that
    reads as the message: one not typed all in lower case (a title's 'Cuda Out of Memory' copies
    the error's name), or one in the message's own shape: followed by ``Tried to allocate`` or
    ending its sentence (group 1), after its exception type (group 5), or on a line of its own
    that ends there."""
    for m in _RX_TORCH_DEVICE.finditer(body):
        if m.group(1) or m.group(5) or not original[m.start() : m.end()].islower():
            return True
    for m in _RX_TORCH_DEVICE_LINE.finditer(body):
        span = original[m.start() : m.end()]
        if _RX_SENTENCE_END.match(body, m.end()) or not span.islower():
            return True
    return False


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
    frames = "\n".join([lines[i] for i in indented]) if indented else ""
    # (or an indented line where a pack says it went on after the OOM: cudaMallocAsync's
    # table ends indented, ' : 17179869184.00 GiB); falling back to plain video ...')
    if indented and (has_needle(frames) or "falling back" in frames):
        # (and an indented line that carries a torch message's figures: a message
        # hard-wrapped with an indent, ' # 0 bytes free; 9.23 GiB reserved in total by PyTorch)',
        # or retyped one clause per line, ' (GPU 0; 6.00 GiB total capacity; ', ' 363.12 MiB free; ')
        focus = sorted(
            focus
            + [
                i
                for i in indented
                if has_needle(lines[i])
                or "by PyTorch" in lines[i]
                or "oomd " in lines[i]
                or "total capacity" in lines[i]
                or "B free" in lines[i]
                or "bytes free" in lines[i]
                or "falling back" in lines[i]
            ]
        )
    if "current device: " in frames:
        # ggml's CUDA check names the device and the call that failed on the two indented lines
        # under 'CUDA error: out of memory' ('  current device: 0, in function alloc at ...',
        # '  hipMalloc((void **) &ptr, look_ahead_size)'): the device and, for a ROCm build, HIP
        seen = set(focus)
        for i in indented:
            if _RX_GGML_DEVICE.match(lines[i]):
                seen.update((i, i + 1) if i + 1 in indented else (i,))
        focus = sorted(seen)
    flines = [lines[i] for i in focus]
    body = "\n".join(flines)
    starts = [0]
    for line in flines[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    # a pasted Error Report is parsed once, for the rules and for its fields
    report = _report(body)
    rule, pool, backend, pos, recovered = _detect(body, report)
    if rule is None and "Tried to allocate" in body and "\n" in body:
        # torch's figures broken over lines of their own (retyped from a dialog, one clause per
        # line): read as one line. Same length, so every position and line start still holds
        flat = body.replace("\n", " ")
        rule, pool, backend, pos, recovered = _detect(flat, report)
        if rule is not None:
            body = flat
    if rule is None:
        restored = _restore_case(body)
        if restored is None:
            return None
        report = _report(restored)
        rule, pool, backend, pos, recovered = _detect(restored, report)
        if rule is None or (rule in _DEVICE_OOM_RULES and not _lowered_message(restored, body)):
            # (a lower-cased 'cuda out of memory' in a sentence, quoted in one or glued into a
            # CJK one, is the user's typing; the error's own words, copied, keep their case)
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
    if exc_type is None:
        exc_type = _type_before(flines[fidx], pos - starts[fidx])
    if rule == "ecs-container-oom":
        exc_type = None  # (ECS's stopped reason names a status code, not an exception raised)
    if exc_type and exc_type[:1] == "_" and "." not in exc_type and exc_type[1:2].isupper():
        exc_type = exc_type[1:]  # Markdown italics opened on the type: '_RuntimeError: ..._'
    if exc_type and not exc_type.isascii() and (tail := _RX_ASCII_TYPE_TAIL.search(exc_type)):
        exc_type = tail.group(0)  # glued to CJK text before it: '读取unlabel数据时出现OSError'
    if exc_type and (glued := _RX_PROSE_GLUED_TYPE.fullmatch(exc_type)):
        # the user's words run into the type: 'could not solveMemoryError'
        exc_type = glued.group(1)
    if exc_type and exc_type.startswith("__"):  # a frame's '__deepcopy__' glued on (no newline)
        exc_type = _RX_DUNDER_GLUED.sub("", exc_type) or exc_type
    node_type = node_id = None
    if report is not None:
        node_type, node_id, exc_type = report.node_type, report.node_id, report.exception_type
    if node_type is None and (toast := _RX_FLAT_TOAST.match(lines[idx])):
        exc_type = exc_type or toast.group(1)
        node_id, node_type = toast.group(2), toast.group(3)
    if node_type is None:
        node_type = _dialog_node(body) or _colon_node(lines[idx])
    if node_type is None and "OutOfMemoryError" in lines[idx]:
        m = _RX_TITLE_NODE.search(lines[idx])
        node_type = (m.group(1) or m.group(2) or m.group(3)) if m else None
    if node_type is None and (glued := _RX_TOAST_TITLE_NODE.match(lines[idx])):
        node_type = glued.group(1) if _is_node_ident(glued.group(1)) else None
    if node_type is None and idx > 0 and not lines[idx - 1].lstrip().startswith("```"):
        prev = lines[idx - 1].strip().strip("*`_")  # a node line inside Markdown bold/code
        if _is_node_ident(prev):
            node_type = prev

    report_msg = report.message if report is not None else None
    line = lines[idx]
    if idx + 1 < len(lines) and wrap_cut_words(line, lines[idx + 1]):
        line += lines[idx + 1]  # (the record mended a console's wrap of the message's words)
    message = _message_of(line, pos - starts[fidx], exc_msg, report_msg)
    if backend is Backend.UNKNOWN:
        backend = _backend_from_text(body, report_msg)
    if (
        not recovered
        and pool is Pool.GPU
        and "falling back" in body
        and _RX_FELL_BACK.search(body, pos)
    ):
        recovered = True  # a pack caught it and went on ('...); falling back to plain video')
    if not recovered and _RX_IGNORED_LEAD.search(flines[fidx], 0, max(pos - starts[fidx], 0)):
        recovered = True  # a wrapper caught it, said so and went on (GGUF's 'ignoring 'copy_'')
    if rule in ("cuda-error-oom", "dlib-cuda-oom") and pinned_evidence("\n".join(lines)):
        pool = Pool.RAM
        extra.append(("host_memory", "pinned"))
    elif rule in ("pin-memory-thread", "ggml-pinned-host"):
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
    # (torch says 'this process has 0 bytes memory in use' where it cannot see its own use, in
    # a container or a worker process: no outside figure can be derived from that)
    if not named and total is not None and free is not None and used:
        outside = total - free - used
        if outside >= _OTHERS_MIN_BYTES:
            named = True
            extra.append(("outside_process_bytes", outside))
    # (or the line glued to another message: a title that flattened two log lines)
    if rule == "comfy-got-oom" or "Got an OOM, unloading all loaded models" in body:
        extra.append(("comfy_unloaded_models", True))
    if rule in _NODE_PACK_RULES:
        extra.insert(0, ("node_pack", _NODE_PACK_RULES[rule]))
    elif rule == "exception-oom-words" and (pack := _raising_pack(lines)) is not None:
        extra.insert(0, ("node_pack", pack))
    elif rule == "soft-copy-inputs-to-cpu":
        for rx, library in _RX_COPY_INPUTS_PACK:
            if rx.search(body):
                extra.insert(0, ("node_pack", library))
                break
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
    "MemoryError",
    "Could not allocate tensor",
    "Resource exhausted: OOM when allocating tensor",  # TensorFlow's, lower-cased in a title
    "device:GPU:",
)
_RX_CASED_WORDS = re.compile("|".join(re.escape(w) for w in _CASED_WORDS), re.IGNORECASE)
_CASED = {w.lower(): w for w in _CASED_WORDS}
_RX_LOWER_UNIT_OR_GPU = re.compile(r"(?<=\d)( ?)([kmgtp])(i?)b\b|\bgpu(?= \d)")
#: a lower-cased record holds one of these
_LOWER_SIGNS = (
    "out of memory",
    "allocation on device",
    "invalid buffer size",
    "outofmemory",
    "memoryerror",
    "defaultcpuallocator",
    "could not allocate tensor",
    "unable to allocate",  # numpy's 'Unable to allocate 10.0 GiB for an array ...'
    "resource exhausted: oom",
)


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


#: the kB fields of a kill line that an event carries (as ``<field>_bytes``)
_KERNEL_RSS_FIELDS = ("total-vm", "anon-rss", "file-rss", "shmem-rss")
#: which kernel line places the event, after a kill line naming its scope (rank 0)
_KERNEL_EVIDENCE_RANK = {"killed": 1, "summary": 2, "invoked": 3}


@functools.lru_cache(maxsize=4)
def _kernel_records(body: str) -> tuple[tuple[int, KernelOomLine], ...]:
    """``kernel_lines(body)``, kept for the record at hand: placing the event (``_detect``)
    and reading its facts (``_numbers``) read the same lines."""
    return tuple(kernel_lines(body))


def _first(records: list[KernelOomLine], kind: str) -> KernelOomLine | None:
    return next((k for k in records if k.kind == kind), None)


def _kernel_evidence(body: str) -> int | None:
    """Where in ``body`` the kernel's evidence of a kill starts (kernel/lines.py reads the
    lines), or None: a kill line that names its scope, else any ``Killed process``, else the
    ``oom-kill:`` summary naming the victim, else the ``invoked oom-killer`` line."""
    best: tuple[int, int] | None = None  # (rank, position)
    for at, k in _kernel_records(body):
        if k.kind in ("killed", "chosen") and k.scope is not None:
            rank = 0
        elif k.kind == "summary" and k.pid is None:
            continue
        else:
            rank = _KERNEL_EVIDENCE_RANK.get(k.kind, 9)
        if rank < 9 and (best is None or rank < best[0]):
            best = (rank, at + k.start)
    return None if best is None else best[1]


def _kernel_facts(
    records: list[KernelOomLine], fields: dict[str, Any], extra: list[tuple[str, Any]]
) -> None:
    """The facts of a record's kernel OOM lines: the victim (``Killed process``, else the
    summary's task) or, with neither, the invoking task; and the scope only where a line says
    it. The name is a thread's (``pt_main_thread`` for torch's main thread): the pid is what
    ties a kill to ComfyUI. An older kernel's ``Kill process N … or sacrifice child`` names no
    victim (a child may die instead, in the ``Killed process`` line that follows): giving it
    N would keep the two lines of one kill from folding into one event."""
    kill = _first(records, "killed")
    summary = next((k for k in records if k.kind == "summary" and k.pid is not None), None)
    if kill is not None:
        fields["killed_pid"] = kill.pid
        extra.append(("process_name", kill.comm))
        for key, kib in kill.kib:
            if key in _KERNEL_RSS_FIELDS:
                extra.append((key.replace("-", "_") + "_bytes", kib * _K))
    elif summary is not None:
        fields["killed_pid"] = summary.pid
        extra.append(("process_name", summary.comm))
    elif (invoked := _first(records, "invoked")) is not None:
        extra.append(("invoked_by", invoked.comm))
    scopes = {k.scope for k in records}
    if "memcg" in scopes:
        extra.append(("scope", "cgroup"))
    elif "global" in scopes:
        extra.append(("scope", "system"))
    fields["killer"] = "kernel"


def _find_first(
    rx: re.Pattern[str], body: str, branches: tuple[tuple[re.Pattern[str], str], ...]
) -> re.Match[str] | None:
    """``rx.search(body)``, where ``rx`` is the alternation of ``branches`` (pattern, the literal
    it cannot match without), in order.

    An alternative that begins with a number (``_SIZE``) has no literal prefix: the regex
    engine tries it at every position of the body. Searched alone, each alternative runs only
    when its own literal is there (torch's new message never holds the old one's), and ``rx``
    is then matched once, at the leftmost start any alternative found: no earlier position
    matches any of them, and at that one ``rx`` prefers its alternatives in the same order,
    so the match (and its groups) is ``rx.search``'s.
    """
    start = -1
    for branch, gate in branches:
        if gate in body:
            m = branch.search(body)
            if m is not None and (start < 0 or m.start() < start):
                start = m.start()
    return rx.match(body, start) if start >= 0 else None


#: 'OOMKilled' (Kubernetes' reason for a container the kernel's OOM killer ended), 'OOM killed'
_RX_OOM_KILLED = re.compile(
    r"\bOOM[- ]?[Kk]illed\b(?![\"']?\s*[:=]?\s*(?i:false)\b)"
)  # (not docker's '"OOMKilled": false', Python's "'OOMKilled': False", a table's 'OOMKilled  False')
#: the kernel's killer named as the one that killed: 'oom-killer kills the comfyui process'
_RX_OOM_KILLER_SAID = re.compile(r"(?i)\boom[- ]killer (?:kills|killed|has killed)\b")
#: what ``_detect`` answers: (rule, pool, backend, match position, recovered)
_Detected = tuple[str, Pool, Backend, int, bool]
_Check = Callable[[str, "_Report | None"], "_Detected | None"]


@dataclass(frozen=True, slots=True)
class _Rule:
    """A rule that is only its patterns: the first pattern that matches (each run only when
    one of its literal gates is in the body, ``_find``) places the event; pool, backend and
    recovered are the rule's own."""

    name: str
    pool: Pool
    backend: Backend
    patterns: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...]
    recovered: bool = False

    def __call__(self, body: str, report: _Report | None) -> _Detected | None:
        for rx, gates in self.patterns:
            m = _find(rx, body, *gates)
            if m:
                return self.name, self.pool, self.backend, m.start(), self.recovered
        return None


def _rule(
    name: str,
    pool: Pool,
    backend: Backend,
    *patterns: tuple[re.Pattern[str], tuple[str, ...]],
    recovered: bool = False,
) -> _Rule:
    return _Rule(name, pool, backend, patterns, recovered)


_KILLED, _GPU, _RAM, _MPS = Pool.KILLED_BY_OS, Pool.GPU, Pool.RAM, Pool.UNIFIED_MPS
_CPU, _UNKNOWN = Backend.CPU, Backend.UNKNOWN


def _oom_killed_said(body: str, report: _Report | None) -> _Detected | None:
    """'OOMKilled' as a program printed it: Kubernetes' reason after a field's colon or equals
    sign ('Reason: OOMKilled', 'reason=OOMKilled'), in a quote ('"OOMKilled": true'), in a
    table's column (kubectl's STATUS, two spaces or a tab before it) or first on its line. A
    user's sentence ('Seeing OOMKilled', 'the container gets OOM-killed', a title's
    '(OOMKilled)') is the user's words, as rounds 8-17 of the corpus label it."""
    if "OOM" not in body:
        return None
    for m in _RX_OOM_KILLED.finditer(body):
        at = m.start()
        lead = body[max(0, at - 2) : at]
        if at == 0 or lead[-1:] in ("\n", "\t", '"', "'", "`") or lead == "  ":
            return "oom-killed-said", _KILLED, _CPU, at, False
        gap = body[max(0, at - 8) : at].rstrip(" ")
        if gap[-1:] in (":", "=") or gap[-1:] == "\n":
            return "oom-killed-said", _KILLED, _CPU, at, False
    return None


def _earlyoom_matches(body: str) -> Iterator[tuple[re.Match[str], EarlyoomKill]]:
    """earlyoom's kill lines in ``body`` (kernel/earlyoom.py's reading; not its self-test)."""
    if not any(gate in body for gate in EARLYOOM_GATES):
        return
    for m in EARLYOOM_KILL.finditer(body):
        kill = earlyoom_kill_of(m, m.group(0))
        if kill is not None:
            yield m, kill


def _earlyoom_in(body: str) -> EarlyoomKill | None:
    return next((kill for _, kill in _earlyoom_matches(body)), None)


def _earlyoom_kill(body: str, report: _Report | None) -> _Detected | None:
    for m, _ in _earlyoom_matches(body):
        return "earlyoom-kill", _KILLED, _CPU, m.start(), False
    return None


def _kernel_kill(body: str, report: _Report | None) -> _Detected | None:
    if "Kill" in body or "oom-kill" in body:
        at = _kernel_evidence(body)
        if at is not None:
            return "kernel-oom-kill", _KILLED, _CPU, at, False
    return None


def _torch_device(body: str, report: _Report | None) -> _Detected | None:
    """torch's ``CUDA/HIP/XPU out of memory``: the device word names the backend."""
    found = _printed_device_oom(body)
    if found is None:
        return None
    m, group = found
    dev = m.group(group)
    # (torch_npu's Ascend NPU and torch_musa's Moore Threads GPU keep torch's message; neither is a
    # backend named here)
    backend = {
        "CUDA": Backend.CUDA,
        "HIP": Backend.ROCM,
        "XPU": Backend.XPU,
        "NPU": _UNKNOWN,
        "MUSA": _UNKNOWN,
    }[dev]
    return f"{dev.lower()}-oom", _GPU, backend, m.start(group), False


#: what right before the words says a program printed them: an exception type, a logger's
#: 'error:' (or a retyped 'Error - '), ComfyUI's exception banner
_RX_PRINTED_BEFORE = re.compile(r"(?i:error)(?::| -) ?|!!! Exception")
#: what after them says so: the message's own full stop (not one inside the user's quotes), its
#: figures, its hint's sentence
_RX_PRINTED_AFTER = re.compile(
    r"\.(?![\"'`\u201d])|,? ?(?:Tried to allocate|See documentation for Memory)\b"
)
#: the words end their line (trailing blanks at most)
_RX_ENDS_LINE = re.compile(r"[ \t\r]*(?:\n|$)")
#: a title's tag before them ('[Bug]: ', '[Feature Request] '): an issue's, not a logger's
_RX_TITLE_TAG = re.compile(r"\[(?i:bug|feature[\w ]*|question|issue|help)\]:?$")
#: how far back on their line the words' lead is read (a type, a banner, a log prefix)
_LEAD_CHARS = 160


def _named_only(body: str, m: re.Match[str], dev: int) -> bool:
    """True when the device OOM ``m`` (its device word in group ``dev``) is the error's name in
    the user's words, not a message a program printed.

    Printed: its exception type, a logger's 'error:' or ComfyUI's banner right before it, its
    full stop or figures after it, or the words ending a line that holds nothing before them
    but a log line's lead (a timestamp, a level, '[rank0]: ', an Error Report's field: whatever
    ends in ':', ']', '|', '>' or '-'). Anything else is a title or a sentence naming the
    error: 'CUDA out of memory error with 3.1.1', 'it says "CUDA out of memory"',
    '一直显示CUDA out of memory，', a Markdown heading. Rounds 8-17 of the corpus label those the
    user's words (rounds 3-7 were relabelled to the same reading): a sentence summarising a
    failure is not a second failure.

    Only ``_LEAD_CHARS`` before the words are read, so a long line with many mentions costs
    linear time.
    """
    start = m.start(dev)
    after = start + len(m.group(dev)) + len(" out of memory")
    if _RX_PRINTED_AFTER.match(body, after):
        return False
    low = max(0, start - _LEAD_CHARS)
    nl = body.rfind("\n", low, start)
    before = body[nl + 1 if nl >= 0 else low : start]
    if _RX_PRINTED_BEFORE.search(before):
        return False
    if not _RX_ENDS_LINE.match(body, after):
        return True  # the sentence goes on after the words
    if nl < 0 and low > 0:
        return True  # more than a log line's lead before them
    lead = before.rstrip().rstrip("*`").rstrip()
    if not lead:
        return before.strip() != ""  # (a line in bold: the user's emphasis)
    if lead.startswith("#") or _RX_TITLE_TAG.search(lead):
        return True  # a Markdown heading, an issue's tag
    return lead[-1] not in ":]|>-"


def _printed_device_oom(body: str) -> tuple[re.Match[str], int] | None:
    """The first device OOM in ``body`` a program printed (see ``_named_only``), and the group
    holding its device word."""
    if (
        " out of memory" not in body
        and " out-of-memory" not in body
        and " out of the memory" not in body
    ):
        return None
    for rx in (_RX_TORCH_DEVICE, _RX_TORCH_DEVICE_LINE):
        for m in rx.finditer(body):
            dev = next(g for g in range(1, rx.groups + 1) if m.group(g))
            if not _named_only(body, m, dev):
                return m, dev
    return None


def _torch_body(body: str, report: _Report | None) -> _Detected | None:
    m = _find(_RX_TORCH_BODY, body, "Tried to allocate")
    if m and not _find(_RX_XPU_4GB, body, "NOT allocate memory block"):
        # (IPEX's single-allocation limit prints torch's figures after its own sentence: a
        # refused block over 4 GB, not memory running out)
        return "cuda-oom-cut", _GPU, _UNKNOWN, m.start(), False
    return None


def _alloc_on_device(body: str, report: _Report | None) -> _Detected | None:
    m = _find(_RX_ALLOC_ON_DEVICE, body, "Allocation on device")
    if not m:
        return None
    pos = body.find("Allocation on device", m.start())
    return "cuda-alloc-on-device", _GPU, Backend.CUDA, pos, False


#: ggml's CUDA check's indented lines under its error: the device, then the call that failed
_RX_GGML_DEVICE = re.compile(r"\s+current device: (\d+), in function \w+ at ")
_RX_GGML_HIP_CALL = re.compile(r"^\s+current device: \d+, in function .*\n\s+hip[A-Z]\w*\(", _M)


def _cuda_error(body: str, report: _Report | None) -> _Detected | None:
    m = _find(
        _RX_CUDA_ERROR_OOM,
        body,
        "error: out of memory",
        "Error: out of memory",
        "error:out of memory",
        "ErrorMemoryAllocation",
        "ErrorOutOfMemory",
        "_ERROR_OutOfMemory",
        "hipError_t(1002)",
        "_ERROR_OUT_OF_MEMORY",
        ") out of memory",
    )
    while m is not None and (
        (
            (m.group(2) or m.group(3))
            and (_name_ends_title(body, m) or _name_starts_title_prose(body, m))
        )
        or (m.group(1) is None and m.group(4) is None and _name_quoted_in_prose(body, m))
        or ((m.group(2) or m.group(3)) and _in_source(body, m.start()))
    ):
        m = _RX_CUDA_ERROR_OOM.search(body, m.end())
    if m:
        # (ggml's ROCm build names its backend: 'ROCm error: out of memory')
        rocm = (m.group(1) or m.group(2) or m.group(3) or m.group(4) or "hip").lower() in (
            "hip",
            "rocm",
        )
        rocm = rocm or "`hipError" in body  # ROCm's torch keeps CUDA's words, its hint says HIP
        # (ggml's ROCm build too: the call it names under the error is HIP's)
        rocm = rocm or ("current device: " in body and _RX_GGML_HIP_CALL.search(body) is not None)
        start = m.start()
        if "terminate called" in body:  # the abort's first line is where the failure shows
            t = _RX_TERMINATE_WHAT.search(body, max(0, start - 300), start)
            start = t.start() if t else start
        return "cuda-error-oom", _GPU, Backend.ROCM if rocm else Backend.CUDA, start, False
    m = _find(
        _RX_CUDA_LEGACY_OOM, body, "out of memory", "Out of memory in cu", "UDA: ", "uda: "
    ) or _find(_RX_CUDA_TRANSLATED_OOM, body, "CUDA:", "CUDA :")
    if m:
        return "cuda-error-oom", _GPU, Backend.CUDA, m.start(), False
    return None


#: source code naming an error code: compared with, returned, a switch's case, or inside the
#: string literal of a statement that prints it ('if (ret == CUDA_ERROR_OUT_OF_MEMORY) {',
#: 'return cudaErrorMemoryAllocation;', 'std::cerr << "... CUDA_ERROR_OUT_OF_MEMORY ..."')
_RX_SOURCE_BEFORE = re.compile(
    r"(?:(?:\breturn|==|!=|\bcase)\s*\(?"
    r"|(?:<<|\b(?:f?printf|puts|fputs|perror|print|LOG\w*)\()[^\"\n]*\"[^\"\n]*)$"
)


def _in_source(body: str, pos: int) -> bool:
    """The error's name at ``pos`` is source code a pull request quotes, not a line the
    program printed (a log never holds a comparison, a return or a print statement)."""
    line = body[body.rfind("\n", 0, pos) + 1 : pos]
    return _RX_SOURCE_BEFORE.search(line) is not None


def _title_start(body: str, pos: int) -> int | None:
    """Where the line holding ``pos`` starts, when that line is an issue title (``# ``)."""
    line_start = body.rfind("\n", 0, pos) + 1
    return line_start if body.startswith("# ", line_start) else None


def _name_ends_title(body: str, m: re.Match[str]) -> bool:
    """An error's name ending an issue title after the user's own words ('# enable_eager_execution
    持续报出 CUDA_ERROR_OUT_OF_MEMORY', '... keeps reporting X'): the user naming the failure,
    as a title naming torch's type is (``_type_printed``). After a colon, an equals sign, a
    bracket or a quote, or alone under the heading mark, it is the printed name."""
    line_start = _title_start(body, m.start())
    if line_start is None or not (
        _RX_TYPE_ENDS_LINE.match(body, m.end()) or _RX_USER_NOUN_ENDS_LINE.match(body, m.end())
    ):
        return False
    lead = body[line_start + 2 : m.start()].rstrip(" ")
    return bool(lead) and lead[-1] not in ":=([{'\"`"


#: an error's name in inline code, then the sentence going on with a word
_RX_QUOTED_NAME_GOES_ON = re.compile(r"` +[a-z~(]")


#: the user's words going on after an error's name ('... on multiple and single GPU set up')
#: the user's noun after an error's name ending a title ('... causing CUDA_ERROR_OUT_OF_MEMORY
#: issues')
_RX_USER_NOUN_ENDS_LINE = re.compile(r" (?:issues?|errors?|problems?)[^\S\n]*(?:\n|$)")
#: a tracker's tag opening a title ('[BUG] ', '[Bug]: '), or nothing
_RX_TITLE_LEAD_TAG = re.compile(r"(?:\[[\w -]{1,20}\]:? )?")
_RX_PROSE_GOES_ON = re.compile(
    r"(?: \(\d+\))?(?: (?:issues?|errors?|problems?))? +(?:on|in|when|with|while|after|for|during)\b"
)


def _name_starts_title_prose(body: str, m: re.Match[str]) -> bool:
    """A driver error's name opening an issue title that goes on in the user's words
    ('# CUDA_ERROR_OUT_OF_MEMORY on multiple and single GPU set up (1080Ti)'): the user naming
    the failure, as the name ending such a title is (``_name_ends_title``)."""
    start = _title_start(body, m.start())
    if start is None or _RX_PROSE_GOES_ON.match(body, m.end()) is None:
        return False
    # (after the heading mark, or a tracker's tag: '# [BUG] cudaErrorMemoryAllocation with ...')
    return _RX_TITLE_LEAD_TAG.fullmatch(body, start + 2, m.start()) is not None


def _name_quoted_in_prose(body: str, m: re.Match[str]) -> bool:
    """An error's name alone in inline code inside the user's sentence or title ('we start
    getting `hipErrorOutOfMemory` after ~300 kernels'): the user naming it, as a title naming
    torch's type is (``_type_printed``). A message in inline code keeps its words after the
    name ('`hipErrorOutOfMemory: out of memory`')."""
    return (
        m.start() > 0
        and body[m.start() - 1] == "`"
        and _RX_QUOTED_NAME_GOES_ON.match(body, m.end()) is not None
    )


#: C++'s abort for an uncaught exception, right before its what() message
_RX_TERMINATE_WHAT = re.compile(
    r"terminate called after throwing an instance of '[^'\n]+'\n[ \t]*what\(\):[ \t]*$"
)


def _vllm_startup_free(body: str, report: _Report | None) -> _Detected | None:
    """vLLM's start-up check (``_RX_VLLM_STARTUP_FREE``); a device named 'cuda:N' is CUDA's."""
    m = _find(_RX_VLLM_STARTUP_FREE, body, "on startup is less than")
    if m is None:
        return None
    backend = Backend.XPU if m.group(1) else Backend.CUDA if m.group(2) else _UNKNOWN
    return "vllm-startup-free-memory", _GPU, backend, m.start(), False


def _ray_kill(body: str, report: _Report | None) -> _Detected | None:
    """Ray's memory monitor killing a task, or the raylet's summary of its kills; the task's
    words as a title without their full stop are the user's naming them."""
    m = _find(_RX_RAY_OOM_KILL, body, "running low on memory", "killed due to memory pressure")
    while (
        m is not None
        and _title_start(body, m.start()) is not None
        and not body.startswith(".", m.end())
    ):
        m = _RX_RAY_OOM_KILL.search(body, m.end())
    return ("ray-memory-monitor-kill", _KILLED, _CPU, m.start(), False) if m else None


def _vulkan_device(body: str, report: _Report | None) -> _Detected | None:
    """Vulkan's device-memory result (``_RX_VULKAN_DEVICE_OOM``); its name ending a title after
    the user's words ('# Vulkan on linux always gives ErrorOutOfDeviceMemory') is the user
    naming it, as a driver error's name there is (``_name_ends_title``)."""
    m = _find(
        _RX_VULKAN_DEVICE_OOM,
        body,
        "_OUT_OF_DEVICE_MEMORY",
        "ErrorOutOfDeviceMemory",
        "Device memory allocation of size",
        "vkAllocateMemory failed",
    )
    while m is not None and m.group(1) is None and _name_ends_title(body, m):
        m = _RX_VULKAN_DEVICE_OOM.search(body, m.end())
    if m is None:
        return None
    start = m.start()
    if "terminate called" in body:  # the abort's first line is where the failure shows
        t = _RX_TERMINATE_WHAT.search(body, max(0, start - 300), start)
        start = t.start() if t else start
    return "vulkan-device-oom", _GPU, _UNKNOWN, start, False


def _dxvk_alloc(body: str, report: _Report | None) -> _Detected | None:
    """DXVK's failed allocation (``_RX_DXVK_ALLOC``): device memory when its flags ask for
    device-local memory (or do not show), host memory when they do not (a 32-bit game out of
    address space, mapped memory)."""
    m = _find(_RX_DXVK_ALLOC, body, "Memory allocation failed")
    if m is None:
        return None
    flags = _RX_DXVK_FLAGS.search(body, m.end())
    host = flags is not None and not int(flags.group(1), 16) & 1
    return "dxvk-alloc-failed", _RAM if host else _GPU, _CPU if host else _UNKNOWN, m.start(), False


def _unreal_oom(body: str, report: _Report | None) -> _Detected | None:
    """Unreal Engine's allocator refused (``_RX_UNREAL_OOM``), placed at its fatal-error header
    when the record holds it: the paging file when Windows' last error names it, else RAM."""
    m = _find(_RX_UNREAL_OOM, body, "Ran out of memory allocating")
    if m is None:
        return None
    end = body.find("\n", m.end())
    rest = body[m.end() : end if end >= 0 else None]  # (the refusal's line: its 'Last error msg')
    if "paging file is too small" in rest:
        return "unreal-oom", Pool.SWAP_PAGEFILE, _CPU, m.start(), False
    return "unreal-oom", _RAM, _CPU, m.start(), False


def _library_alloc(body: str, report: _Report | None) -> _Detected | None:
    """cuBLAS/cuDNN/hipBLAS/MIOpen ``*_STATUS_ALLOC_FAILED``: the library names the rule."""
    m = _find(_RX_LIB_ALLOC, body, "_STATUS_", "_status_", "_Status_")
    if not m:
        return None
    lib = m.group(1).upper()
    backend = Backend.ROCM if lib.startswith(("HIP", "ROC", "MIOPEN")) else Backend.CUDA
    return f"{lib.lower()}-alloc-failed", _GPU, backend, m.start(), False


def _ggml_buffer(body: str, report: _Report | None) -> _Detected | None:
    """ggml's refused buffer (``_RX_GGML_BUFFER``): device memory unless the CPU's."""
    m = _find(_RX_GGML_BUFFER, body, "allocate", "mem_buffer != NULL")
    if m is None:
        return None
    name = (m.group(1) or m.group(3) or m.group(5) or "cpu").lower()
    backend = _GGML_BUFFER_BACKENDS.get(name, _UNKNOWN)
    pool = _RAM if backend is Backend.CPU else _GPU
    return "ggml-buffer-alloc", pool, backend, m.start(), False


def _nv_fatal_alloc(body: str, report: _Report | None) -> _Detected | None:
    """The NVIDIA toolchain's failed allocation, placed at its message (a title that
    collapsed the spaces before it is the same message)."""
    m = _find(_RX_NV_FATAL_ALLOC, body, "Memory allocation failure")
    return ("nv-fatal-alloc", _RAM, _UNKNOWN, m.start(1), False) if m else None


def _pagefile(body: str, report: _Report | None) -> _Detected | None:
    m = _find(
        _RX_PAGEFILE,
        body,
        "rror 1455",
        "paging file",
        "too small for this operation",
        "页面文件太小",
        "0x800705AF",
    )
    while m is not None and _code_named_in_title(body, m):
        m = _RX_PAGEFILE.search(body, m.end())
    if m is None and "rror 1455" in body:
        m = _RX_ERROR_1455.search(body)
        while m is not None and _code_named_in_title(body, m):
            m = _RX_ERROR_1455.search(body, m.end())
    return ("windows-pagefile", Pool.SWAP_PAGEFILE, _CPU, m.start(), False) if m else None


#: what follows Windows' error code where the program printed it: its text, a quote's or a
#: bracket's end, or nothing
_RX_CODE_PRINTED_AFTER = re.compile(r"\]?[\"'`]?[ \t]*(?:$|The paging file|页面文件)", _M)


def _code_named_in_title(body: str, m: re.Match[str]) -> bool:
    """An issue title that names the error code among the user's own words ('# [WinError 1455]
    model train has an error', '# Unexpected error 1455 in ...'): no exception type before it
    and Windows' text not after it, so it is the user naming the failure, as a title naming
    torch's type is (``_type_printed``)."""
    if "1455" not in m.group(0):
        return False  # (Windows' text, not its code)
    line_start = _title_start(body, m.start())
    if line_start is None or _RX_TYPE_BEFORE_CODE.search(body, line_start, m.start()):
        return False
    return _RX_CODE_PRINTED_AFTER.match(body, m.end()) is None


#: an exception type right before the code ('OSError: [', '"OSError: ')
_RX_TYPE_BEFORE_CODE = re.compile(r"(?:Error|Exception):?\s*\[?$")


def _cpu_allocator(body: str, report: _Report | None) -> _Detected | None:
    m = (
        _find(_RX_CPU_ALLOC, body, "CPUAllocator", "$ Torch")
        or _find(
            _RX_CPU_ALLOC_TAIL, body, "not enough memory: you tried", "Not enough memory: you tried"
        )
        or _find(_RX_CPU_ALLOC_TRANSLATED, body, "CPUAllocator")
    )
    if not m:
        return None
    # (c10's enforce line wrapped by a console: the failure starts at '[enforce fail at')
    enforce = body.rfind("[enforce fail at", max(0, m.start() - 400), m.start())
    return "cpu-allocator", _RAM, _CPU, m.start() if enforce < 0 else enforce, False


def _windows_outofmemory(body: str, report: _Report | None) -> _Detected | None:
    """Windows' E_OUTOFMEMORY text: DirectML's when the text names it, else the host's."""
    m = _find(_RX_WIN_OUTOFMEMORY, body, "Not enough memory resources", "0x8007000")
    if not m:
        return None
    # (or onnxruntime's DirectML provider: 'DmlExecutionProvider', its BucketizedBufferAllocator)
    dml = (
        "DirectML" in body
        or "DML" in body
        or "Direct ML" in body
        or "DmlExecutionProvider" in body
        or "BucketizedBufferAllocator" in body
    )
    pool, backend = (_GPU, Backend.DIRECTML) if dml else (_RAM, _CPU)
    return "windows-outofmemory", pool, backend, m.start(), False


#: Android's crash header: the record's first line when the app died of the exception
_RX_ANDROID_FATAL = re.compile(r"^[^\n]*\bFATAL EXCEPTION: [^\n]*\n(?:[ \t]+[^\n]*\n)*?", _M)


def _java_heap(body: str, report: _Report | None) -> _Detected | None:
    """The Java VM's heap (``_RX_JAVA_OOM``, or the GC-overhead title), placed at Android's
    'FATAL EXCEPTION' header when the record opens with it (the stack lines are indented)."""
    m = _find(_RX_JAVA_OOM, body, "OutOfMemoryError") or _find(
        _RX_JAVA_GC_TITLE, body, "GC overhead limit"
    )
    if m is None:
        return None
    start = m.start()
    if "FATAL EXCEPTION: " in body:
        for h in _RX_ANDROID_FATAL.finditer(body, 0, start + 1):
            if h.end() >= body.rfind("\n", 0, start) + 1 and h.start() < start:
                start = h.start()
    return "java-heap-oom", _RAM, _CPU, start, False


def _tf_bfc_rounded(body: str, report: _Report | None) -> _Detected | None:
    """BFC's failed allocation (``_RX_TF_BFC_ROUNDED``): a host allocator's is pinned RAM."""
    m = _find(_RX_TF_BFC_ROUNDED, body, "requested by op")
    if m is None:
        return None
    if "host" in m.group(1).lower():
        return "tf-bfc-host-oom", _RAM, Backend.CUDA, m.start(), False
    return "tf-bfc-oom", _GPU, _UNKNOWN, m.start(), False


def _tf_exhausted(body: str, report: _Report | None) -> _Detected | None:
    """TensorFlow's allocator; tensorflow-directml's kernels are named dml_*."""
    m = _find(
        _RX_TF_EXHAUSTED,
        body,
        "Resource exhausted: OOM",
        "OOM when allocating tensor",
        "allocation summary follows",
        "ResourceExhaustedError: OOM",
    )
    if not m:
        return None
    if "dml_" in body or "DmlAllocator" in body or "device:DML:" in body:
        backend = Backend.DIRECTML
    elif "cudnn" in body or "/cuda/" in body or "\\cuda\\" in body or "CUDA_ERROR" in body:
        # (TensorFlow's CUDA build named: its cuDNN kernels, stream_executor/cuda)
        backend = Backend.CUDA
    else:
        backend = _UNKNOWN  # TensorFlow's 'GPU' device is CUDA's or ROCm's: the text names neither
    return "tf-resource-exhausted", _GPU, backend, m.start(), False


def _onnx_arena(body: str, report: _Report | None) -> _Detected | None:
    m = _find(_RX_ONNX_ARENA, body, "requested buffer of size", "AllocateRawInternal")
    if not m:
        return None
    # the CPU provider named, or its NCHWc layout's node names ('347_nchwc')
    cpu = "CPUExecutionProvider" in body or "CpuExecutionProvider" in body or "_nchwc'" in body
    pool, backend = (_RAM, _CPU) if cpu else (_GPU, _UNKNOWN)
    return "onnx-arena-oom", pool, backend, m.start(), False


def _numpy_message(body: str) -> re.Match[str] | None:
    """numpy's allocation message, its type aside ('Unable to allocate 1.00 GiB for an array
    ...', 'cannot allocate array memory')."""
    return (
        _find(_RX_NUMPY, body, "for an array", "for array")
        or _find(_RX_NUMPY_ARRAY_MEMORY, body, "array memory")
        or _find(_RX_NUMPY_SHAPED, body, "array with shape")
    )


def _numpy_untyped(body: str, report: _Report | None) -> _Detected | None:
    """numpy's message without its type (ComfyUI's exception header prints str(e))."""
    if "MemoryError" in body:
        return None  # (an exception line places it, or not: _oom_exception)
    m = _numpy_message(body)
    return ("numpy-alloc", _RAM, _CPU, m.start(), False) if m else None


def _oom_exception(body: str, report: _Report | None) -> _Detected | None:
    """An exception line (or an Error Report's type field) of an OOM type."""
    exc = _oom_exception_line(body) if "MemoryError" in body else None
    if exc is not None:
        type_name, start = exc
        if type_name.lower().endswith("outofmemoryerror"):  # (a user's 'OutofMemoryError')
            return "oom-exception", _GPU, _UNKNOWN, start, False
        if _RX_VBAR_OOM.match(body, start):
            return "aimdo-vbar-oom", _GPU, Backend.CUDA, start, False
        if "VBAR allocation failed" in body[start : start + 120]:
            # aimdo could not reserve the address space: no memory ran out (the type's line,
            # or an Error Report's type field above its message)
            return None
        if _find(_RX_NUMPY, body, "Unable to allocate"):
            return "numpy-alloc", _RAM, _CPU, start, False
        return "memory-error", _RAM, _CPU, start, False
    if "MemoryError" in body:
        # no exception line holds the type (a title glued it to the user's words): numpy's
        # message is read without it
        m = _numpy_message(body)
        if m:
            return "numpy-alloc", _RAM, _CPU, m.start(), False
    if report is not None and report.exception_type.endswith(("OutOfMemoryError", "MemoryError")):
        if "VBAR allocation failed" in (report.message or "")[:40]:
            return None  # (aimdo's address-space reservation, as above)
        type_name, start = report.exception_type, report.position
        if type_name.endswith("OutOfMemoryError"):
            return "oom-exception", _GPU, _UNKNOWN, start, False
        return "memory-error", _RAM, _CPU, start, False
    return None


def _oom_type_named(body: str, report: _Report | None) -> _Detected | None:
    """The type named in a title or a sentence ('torch.OutOfMemoryError in KSampler')."""
    m = _find(_RX_OOM_TYPE_NAMED, body, "OutOfMemoryError")
    while m is not None:
        if not _RX_IPYTHON_HEADER.match(body, m.start()) and _type_printed(body, m):
            return "oom-type-named", _GPU, _UNKNOWN, m.start(), False
        # (IPython's 'OutOfMemoryError    Traceback (most recent call last)' header)
        m = _RX_OOM_TYPE_NAMED.search(body, m.end())
    return None


#: what before a type that ends its line says a program printed the line: a task's name and a
#: colon (A1111's ``errors.display``: 'generating image for xyz plot: OutOfMemoryError'), a
#: toast's parts joined by a bar ('Allocation on device | torch.OutOfMemoryError')
_RX_TYPE_PRINTED_BEFORE = re.compile(r"(?:^(?:#+ )?|: | \| )$")
#: a type ends its line: a colon after it at most, and blanks
_RX_TYPE_ENDS_LINE = re.compile(r"[^\S\n]*:?[^\S\n]*(?:\n|$)")


def _type_printed(body: str, m: re.Match[str]) -> bool:
    """True when the type ``m`` names is a printed line's, not the user's words: it ends its line
    (a colon after it at most) after nothing, a task's colon or a bar. In a sentence or a title
    that goes on ('torch.OutOfMemoryError in KSampler Node During Sampling', 'always
    OutOfMemoryError:', '... step。torch.OutOfMemoryError') it names the failure the way rounds
    8-17 of the corpus label the user's words (rounds 3-7 relabelled to the same reading).

    Both sides are read in bounded spans (``_LEAD_CHARS`` back, an anchored match forward), so
    a long line with many mentions costs linear time."""
    if not _RX_TYPE_ENDS_LINE.match(body, m.end()):
        return False
    start = m.start()
    low = max(0, start - _LEAD_CHARS)
    nl = body.rfind("\n", low, start)
    if nl < 0 and low > 0:
        # more than a lead before it: only a task's colon or a bar can still say printed
        return body.endswith((": ", " | "), low, start)
    return _RX_TYPE_PRINTED_BEFORE.search(body[nl + 1 if nl >= 0 else 0 : start]) is not None


def _exception_oom_words(body: str, report: _Report | None) -> _Detected | None:
    m = _find(_RX_EXC_OOM_WORDS, body, "emory", "OOM", "oom", "RAM", "ram")
    if m is None or body[m.end() : m.end() + 1] == "?":
        return None  # (a guess, 'It might have run out of memory? (exitcode 2)', is no failure)
    ram = _RX_RAM_WORDS.search(body, m.start(), m.end() + 200) is not None
    pool, backend = (_RAM, _CPU) if ram else (_GPU, _UNKNOWN)
    return "exception-oom-words", pool, backend, m.start(), False


#: a quoted warning's closing quote, then the sentence going on with a word: the warning's
#: words used as a noun ('the "Ran out of memory ... decoding" path in comfy/sd.py')
_RX_CITED_AFTER = re.compile(r"[.!]?[\"'`\u201d] [a-z]")
_OPENING_QUOTES = "\"'`\u201c"


def _cited(body: str, m: re.Match[str]) -> bool:
    """The warning ``m`` is named inside the user's sentence, not reported as printed: in
    quotes that the sentence goes on after ('the "..." path'). A quoted warning the user says
    they saw ('it will show "Ran out of memory ..."', a line's end after it) stays printed."""
    start = m.start()
    return (
        start > 0
        and body[start - 1] in _OPENING_QUOTES
        and _RX_CITED_AFTER.match(body, m.end()) is not None
    )


def _soft_oom(body: str, report: _Report | None) -> _Detected | None:
    """ComfyUI's and its packs' recovered OOMs (tiled-VAE retry, split attention, ...)."""
    if "out of memory" in body or "OOMed" in body:
        for name, rx in _RX_SOFT:
            for m in rx.finditer(body):
                if not _cited(body, m):
                    return name, _GPU, _UNKNOWN, m.start(), True
    return None


#: Every rule, strongest first: the first that matches a record decides it. The order is the
#: design: a kernel kill line before the words in it, a device's own message before the
#: generic patterns that also match it, the exception line before a type merely named, the
#: user-worded and soft forms last.
_CHECKS: tuple[_Check, ...] = (
    _kernel_kill,
    _earlyoom_kill,
    _rule("nohang-kill", _KILLED, _CPU, (NOHANG_ACTION, ("to the victim",))),
    _rule(
        "systemd-oomd-kill",
        _KILLED,
        _CPU,
        (_RX_OOMD, ("Killed /",)),
        (_RX_OOMD_ATTEMPT, ("oomd attempting to kill",)),
    ),
    _rule("systemd-oom-kill", _KILLED, _CPU, (_RX_SYSTEMD_UNIT, ("OOM killer",))),
    _rule("systemd-oom-result", _KILLED, _CPU, (_RX_SYSTEMD_OOM_RESULT, ("oom-kill'",))),
    _rule(
        "mps-oom",
        _MPS,
        Backend.MPS,
        (_RX_MPS, ("MPS backend out of memory", "MPS Backend", "mps backend")),
        (_RX_MPS_FRAGMENT, ("Tried to allocate", "upper limit for memory")),
    ),
    _rule(
        "paddle-gpu-oom",
        _GPU,
        Backend.CUDA,
        (_RX_PADDLE_OOM, ("Out of memory error on GPU",)),
        (_RX_PADDLE_HEAD, ("Out of memory error on GPU",)),
    ),
    _rule("tt-dram-oom", _GPU, _UNKNOWN, (_RX_TT_DRAM, ("DRAM buffer", "L1 buffer"))),
    _rule(
        "fairseq-oom-recover",
        _GPU,
        _UNKNOWN,
        (_RX_FAIRSEQ_RECOVER, ("attempting to recover from OOM",)),
    ),
    _rule("macos-memorystatus-kill", _KILLED, _CPU, (_RX_MEMORYSTATUS, ("memorystatus: killing",))),
    _rule(
        "container-memory-limit", _KILLED, _CPU, (_RX_CONTAINER_LIMIT, ("Memory limit exceeded",))
    ),
    _rule("ggml-metal-alloc", _MPS, Backend.MPS, (_RX_GGML_METAL, ("failed to allocate",))),
    _rule(
        "ggml-metal-buffer-maximum",
        _MPS,
        Backend.MPS,
        (_RX_GGML_METAL_MAX, ("than buffer maximum",)),
    ),
    _rule("miopen-buffer-oom", _GPU, Backend.ROCM, (_RX_MIOPEN_BUFFER, ("to allocate buffer",))),
    _rule("driver-gpu-memory", _GPU, _UNKNOWN, (_RX_DRIVER_GPU_MEMORY, ("more GPU memory than",))),
    _rule("dlib-cuda-oom", _GPU, Backend.CUDA, (_RX_DLIB_CUDA_OOM, ("reason: out of memory",))),
    _rule(
        "metal-command-buffer-oom",
        _MPS,
        Backend.MPS,
        (
            _RX_METAL_OOM,
            ("ErrorOutOfMemory", "Insufficient Memory", "metal::malloc", "allowed buffer size"),
        ),
    ),
    _rule("mps-invalid-buffer", _MPS, Backend.MPS, (_RX_MPS_BUFFER, ("nvalid buffer",))),
    _torch_device,
    _torch_body,
    _rule(
        "cuda-exceed-allowed",
        _GPU,
        Backend.CUDA,
        (_RX_EXCEED, ("would exceed allowed memory",)),
        (_RX_EXCEED_FRAGMENT, ("Device limit", "exceed allowed memory")),
    ),
    _alloc_on_device,
    _cuda_error,
    _rule(
        "xpu-device-oom", _GPU, Backend.XPU, (_RX_XPU_DEVICE_OOM, ("_ERROR_OUT_OF_DEVICE_MEMORY",))
    ),
    _rule(
        "openvino-gpu-oom",
        _GPU,
        Backend.XPU,
        (
            _RX_OPENVINO_GPU_OOM,
            ("CL_OUT_OF_RESOURCES", "reduce memory consumption", "of GPU resources"),
        ),
    ),
    _vulkan_device,
    _rule(
        "vulkan-out-of-device-memory",
        _GPU,
        _UNKNOWN,
        (_RX_OUT_OF_DEVICE_MEMORY, ("Out of device memory", "device memory, vr -2")),
    ),
    _rule(
        "amdgpu-cs-nomem",
        _GPU,
        Backend.ROCM,
        (_RX_AMDGPU_CS_NOMEM, ("Not enough memory for command",)),
    ),
    _rule("xpu-host-oom", _RAM, _CPU, (_RX_XPU_HOST_OOM, ("_ERROR_OUT_OF_HOST_MEMORY",))),
    _rule(
        "ggml-pinned-host",
        _RAM,
        Backend.CUDA,
        (_RX_GGML_PINNED, ("of pinned memory",)),
        recovered=True,
    ),
    _rule("pin-memory-thread", _RAM, Backend.CUDA, (_RX_PIN_THREAD, ("pin memory thread",))),
    _library_alloc,
    _rule(
        "directml-oom",
        _GPU,
        Backend.DIRECTML,
        (
            _RX_DIRECTML,
            (
                "not enough GPU video memory",
                "allocate tensor with",
                "DML allocator",
                "DirectML",
                "directml",
            ),
        ),
    ),
    _unreal_oom,
    _pagefile,
    _cpu_allocator,
    _rule(
        "host-library-alloc",
        _RAM,
        _CPU,
        (_RX_HOST_LIB_ALLOC, ("Insufficient memory", "mkl_malloc", "memory on host")),
    ),
    _rule(
        "renderer-oom",
        _RAM,
        _CPU,
        (_RX_RENDERER_OOM, ("reason=oom", "process oom", "reason: oom", "reason: 'oom'")),
    ),
    _rule("gl-out-of-memory", _GPU, _UNKNOWN, (_RX_GL_OOM, ("GL_OUT_OF_MEMORY",))),
    _windows_outofmemory,
    _tf_bfc_rounded,
    _tf_exhausted,
    _rule("itex-bfc-oom", _GPU, Backend.XPU, (_RX_ITEX_BFC, ("itex/core/devices/bfc",))),
    _rule(
        "xla-resource-exhausted",
        _GPU,
        _UNKNOWN,
        (
            _RX_XLA_OOM,
            (
                "RESOURCE_EXHAUSTED: Out of memory",
                "RESOURCE_EXHAUSTED: Failed to",
                "ResourceExhaustedError: Failed to",
                "Resource exhausted: Out",  # (XLA's local_client, 2019)
            ),
        ),
    ),
    _onnx_arena,
    _rule(
        "emscripten-oom",
        _RAM,
        _CPU,
        (
            _RX_EMSCRIPTEN_OOM,
            ("Cannot enlarge memory", "abort(OOM)", "Aborted(OOM)", "abort(out of memory)"),
        ),
    ),
    _rule("ffmpeg-enomem", _RAM, _CPU, (_RX_FFMPEG_ENOMEM, (": Out of memory",))),
    _rule("errno-enomem", _RAM, _CPU, (_RX_ERRNO_ENOMEM, ("[Errno 12]",))),
    _rule("rust-alloc-failed", _RAM, _CPU, (_RX_RUST_ALLOC, ("memory allocation of",))),
    _rule(
        "vulkan-host-oom",
        _RAM,
        _UNKNOWN,
        (_RX_VULKAN_HOST_OOM, ("vkAllocateMemory failed -1", "_OUT_OF_HOST_MEMORY")),
    ),
    _rule(
        "windows-low-virtual-memory",
        Pool.SWAP_PAGEFILE,
        _CPU,
        (_RX_WIN_LOW_VIRTUAL, ("low virtual memory",)),
    ),
    _rule("mmap-enomem", _RAM, _CPU, (_RX_MMAP, ("unable to mmap", "Memory mapping file failed"))),
    _rule(
        "library-ram-guard",
        _RAM,
        _CPU,
        (_RX_LIB_RAM_GUARD, ("memory problems", "system memory (", "sufficient RAM")),
    ),
    _rule(
        "vhs-memory-limit", _RAM, _CPU, (_RX_VHS_LIMIT, ("Memory limit hit", "can fit in memory"))
    ),
    _numpy_untyped,
    _ray_kill,
    # (before the generic OOM exception: Java's OutOfMemoryError is its own VM's heap)
    _java_heap,
    _rule("dotnet-oom", _RAM, _CPU, (_RX_DOTNET_OOM, ("System.OutOfMemoryException",))),
    _rule("mlx-malloc-oom", _MPS, Backend.MPS, (_RX_MLX_MALLOC, ("[malloc_or_wait]",))),
    _rule("rmm-device-oom", _GPU, Backend.CUDA, (_RX_RMM_OOM, ("std::bad_alloc: ",))),
    _rule("cupy-oom", _GPU, Backend.CUDA, (_RX_CUPY_OOM, ("to allocate", "allocated so far"))),
    _rule(
        "faiss-gpu-oom",
        _GPU,
        Backend.CUDA,
        (_RX_FAISS_OOM, ("cudaMalloc",)),
        (_RX_FAISS_TITLE, ("to cudaMalloc",)),
    ),
    _rule("dask-nanny-restart", _KILLED, _CPU, (_RX_DASK_NANNY, ("memory budget",))),
    _rule("loky-worker-sigkill", _KILLED, _CPU, (_RX_LOKY_SIGKILL, ("{SIGKILL(-9)",))),
    _rule("database-load-alloc", _RAM, _CPU, (_RX_DB_LOAD_ALLOC, ("Failed attempt to allocate",))),
    _rule("go-runtime-oom", _RAM, _CPU, (_RX_GO_RUNTIME_OOM, ("runtime: out of memory",))),
    _rule(
        "postgres-oom",
        _RAM,
        _CPU,
        (_RX_PG_OOM, ("Failed on request of size",)),
        (_RX_PG_OOM_TYPED, ("PSQLException", "PG::OutOfMemory", "53200")),
    ),
    _rule("mysql-sort-oom", _RAM, _CPU, (_RX_MYSQL_SORT_OOM, ("Out of sort memory",))),
    _rule("cycles-gpu-oom", _GPU, Backend.CUDA, (_RX_CYCLES_OOM, ("out of GPU and shared",))),
    _rule(
        "flashinfer-workspace-oom",
        _GPU,
        Backend.CUDA,
        (_RX_FLASHINFER_ALIGNED, ("in AlignedAllocator",)),
    ),
    _rule("nvenc-oom", _GPU, Backend.CUDA, (_RX_NVENC_OOM, ("OpenEncodeSessionEx failed",))),
    _rule("ollama-memory-layout", _GPU, _UNKNOWN, (_RX_OLLAMA_LAYOUT, ("memory layout cannot",))),
    _rule("radv-buffer-alloc", _GPU, _UNKNOWN, (_RX_RADV_BUFFER, ("Failed to allocate a buffer",))),
    _rule("rocm-own-oom", _GPU, Backend.ROCM, (_RX_ROCM_OWN_OOM, ("failed: out of memory",))),
    _rule(
        "go-virtualalloc-pagefile",
        Pool.SWAP_PAGEFILE,
        _CPU,
        (_RX_GO_VIRTUALALLOC_1455, ("errno=1455",)),
    ),
    _rule("redis-maxmemory", _RAM, _CPU, (_RX_REDIS_MAXMEMORY, ("OOM command not allowed",))),
    _rule("mysql-oom", _RAM, _CPU, (_RX_MYSQL_OOM, ("eeded ",))),
    _rule("innodb-mmap-enomem", _RAM, _CPU, (_RX_INNODB_MMAP, ("failed; errno 12",))),
    _rule("mono-oom-nested", _RAM, _CPU, (_RX_MONO_OOM_NESTED, ("'OutOfMemoryException'",))),
    _rule(
        "kotlin-compile-memory", _RAM, _CPU, (_RX_KOTLIN_COMPILE_MEMORY, ("to run compilation",))
    ),
    _rule("chrome-page-oom", _RAM, _CPU, (_RX_CHROME_PAGE_OOM, ("ode: Out of",))),
    _rule("carb-vulkan-oom", _GPU, _UNKNOWN, (_RX_CARB_VULKAN_OOM, ("allocating resource",))),
    _rule("tcnn-cudamalloc", _GPU, Backend.CUDA, (_RX_TCNN_ALLOC, ("Could not allocate memory",))),
    _rule("unreal-video-memory", _GPU, _UNKNOWN, (_RX_UNREAL_VIDEO_MEMORY, ("of video memory",))),
    _rule(
        "source2-vram-fallback",
        _GPU,
        _UNKNOWN,
        (_RX_SOURCE2_VRAM_FALLBACK, ("vmaAllocateMemory failed",)),
        recovered=True,
    ),
    _dxvk_alloc,
    _rule(
        "unity-oom",
        _RAM,
        _CPU,
        (_RX_UNITY_HEAP, ("DynamicHeapAllocator",)),
        (_RX_UNITY_OOM, ("System out of memory!",)),
    ),
    _rule("physx-gpu-alloc", _GPU, Backend.CUDA, (_RX_PHYSX_ALLOC, ("fail to allocate memory",))),
    _rule(
        "accelerator-memory", _GPU, _UNKNOWN, (_RX_ACCELERATOR_MEMORY, ("memory on accelerator",))
    ),
    _rule(
        "cuda-check-oom",
        _GPU,
        Backend.CUDA,
        (_RX_CUDA_CHECK_OOM, ("<out of memory>", "out of memory at")),
    ),
    _rule(
        "ddraw-video-memory",
        _GPU,
        _UNKNOWN,
        (_RX_DDRAW_VIDEO_MEMORY, ("8876017", "OUTOFVIDEOMEMORY")),
    ),
    _rule("wine-virtual-memory", _RAM, _CPU, (_RX_WINE_VIRTUAL, ("allocate_virtual_memory",))),
    _rule(
        "vkd3d-fallback",
        _GPU,
        _UNKNOWN,
        (_RX_VKD3D_FALLBACK, ("falling back to system memory",)),
        recovered=True,
    ),
    _rule("glib-alloc-failed", _RAM, _CPU, (_RX_GLIB_ALLOC, ("failed to allocate",))),
    _rule("ios-memory-limit", _KILLED, _CPU, (_RX_IOS_EXC_RESOURCE, ("RESOURCE_TYPE_MEMORY",))),
    _rule(
        "tensorrt-tactic-device",
        _GPU,
        Backend.CUDA,
        (_RX_TRT_TACTIC_DEVICE, ("Device memory is insufficient",)),
        recovered=True,
    ),
    _rule("heroku-memory-quota", _RAM, _CPU, (_RX_HEROKU_R14, ("Memory quota exceeded",))),
    _rule("heroku-memory-kill", _KILLED, _CPU, (_RX_HEROKU_R15, ("quota vastly exceeded",))),
    _rule("lambda-out-of-memory", _KILLED, _CPU, (_RX_LAMBDA_OOM, ("Runtime.OutOfMemory",))),
    _rule("ecs-container-oom", _KILLED, _CPU, (_RX_ECS_OOM, ("Container killed due to memory",))),
    _rule("iis-memory-recycle", _KILLED, _CPU, (_RX_IIS_RECYCLE, ("'Percent Memory' limit",))),
    _rule("chromium-oom-exit", _RAM, _CPU, (_RX_CHROMIUM_OOM_CODE, ("536870904",))),
    _rule(
        "gradle-gc-thrashing",
        _RAM,
        _CPU,
        (_RX_GRADLE_GC_THRASH, ("garbage collector is thrashing",)),
    ),
    _rule("qimage-oom", _RAM, _CPU, (_RX_QIMAGE_OOM, ("QImage: out of memory",)), recovered=True),
    _rule(
        "toolchain-heap", _RAM, _CPU, (_RX_TOOLCHAIN_HEAP, ("out of heap space", ": out of memory"))
    ),
    _rule("bun-oom", _RAM, _CPU, (_RX_BUN_OOM, ("error: OutOfMemory", "Bun ran out of memory"))),
    _rule("xcode-memory-kill", _KILLED, _CPU, (_RX_XCODE_MEMORY, ("due to memory issue",))),
    _rule("safari-memory-reload", _RAM, _CPU, (_RX_SAFARI_RELOAD, ("using significant memory",))),
    _rule("photopea-ram", _RAM, _CPU, (_RX_PHOTOPEA_RAM, ("Not enough RAM!",))),
    _rule(
        "kaggle-memory-restart",
        _KILLED,
        _CPU,
        (_RX_KAGGLE_RESTART, ("more memory than is available",)),
    ),
    _rule("cloud-run-memory-limit", _KILLED, _CPU, (_RX_CLOUD_RUN_LIMIT, ("exceeded with",))),
    _rule("runc-init-oom", _KILLED, _CPU, (_RX_RUNC_INIT_OOM, ("init was OOM-killed",))),
    _rule("ecs-agent-oom", _KILLED, _CPU, (_RX_ECS_AGENT_OOM, ("died due to OOM",))),
    _rule("android-lmkd-kill", _KILLED, _CPU, (_RX_LMKD_KILL, ("lowmemorykiller",))),
    _rule("adreno-kgsl-alloc", _GPU, _UNKNOWN, (_RX_KGSL_ALLOC, ("IOCTL_KGSL_GPUOBJ_ALLOC",))),
    _rule("rknn-npu-alloc", _GPU, _UNKNOWN, (_RX_RKNN_ALLOC, ("failed to allocate handle",))),
    _rule("opencl-host-oom", _RAM, _CPU, (_RX_CL_HOST_OOM, ("CL_OUT_OF_HOST_MEMORY",))),
    _rule(
        "jetson-alloc-mapped", _GPU, Backend.CUDA, (_RX_JETSON_ALLOC_MAPPED, ("cudaAllocMapped",))
    ),
    _rule(
        "xla-tpu-oom",
        _GPU,
        _UNKNOWN,
        (_RX_XLA_TPU_OOM, ("memory space hbm", "That was not possible")),
    ),
    _rule(
        "neuron-device-oom",
        _GPU,
        _UNKNOWN,
        (_RX_NEURON_OOM, ("DEVICE memory", "Allocation Failure")),
    ),
    _rule(
        "jittor-unify-fallback",
        _GPU,
        Backend.CUDA,
        (_RX_JITTOR_UNIFY, ("use unify memory",)),
        recovered=True,
    ),
    _rule(
        "clickhouse-memory-limit",
        _RAM,
        _CPU,
        (_RX_CLICKHOUSE_LIMIT, (") exceeded", ") memory limit exceeded")),
    ),
    _rule(
        "es-circuit-breaker",
        _RAM,
        _CPU,
        (_RX_ES_BREAKER, ("circuit_breaking", "CircuitBreaking", "Data too large")),
    ),
    _rule("trino-memory-limit", _RAM, _CPU, (_RX_TRINO_LIMIT, ("memory limit of",))),
    _rule("duckdb-oom", _RAM, _CPU, (_RX_DUCKDB_OOM, ("Out of Memory Error",))),
    _rule("yarn-container-kill", _KILLED, _CPU, (_RX_YARN_KILL, ("killed by YARN",))),
    _rule("mongo-sort-limit", _RAM, _CPU, (_RX_MONGO_SORT, ("Sort exceeded memory limit",))),
    _rule("php-memory-limit", _RAM, _CPU, (_RX_PHP_LIMIT, ("Allowed memory size",))),
    _rule("php-out-of-memory", _RAM, _CPU, (_RX_PHP_OOM, ("Out of memory (allocated",))),
    _rule("julia-oom", _RAM, _CPU, (_RX_JULIA_OOM, ("OutOfMemoryError()",))),
    _rule("matlab-oom", _RAM, _CPU, (_RX_MATLAB_OOM, ("Out of memory. ", "maximum array size"))),
    _rule("ghc-heap-exhausted", _RAM, _CPU, (_RX_GHC_HEAP, ("Heap exhausted",))),
    _rule("ocaml-oom", _RAM, _CPU, (_RX_OCAML_OOM, ("Fatal error: out of memory",))),
    _rule("erlang-alloc", _RAM, _CPU, (_RX_ERLANG_ALLOC, ("bytes of memory",))),
    _rule("ruby-no-memory", _RAM, _CPU, (_RX_RUBY_OOM, ("NoMemoryError",))),
    _rule("lua-oom", _RAM, _CPU, (_RX_LUA_OOM, ("not enough memory",))),
    _rule("zig-oom", _RAM, _CPU, (_RX_ZIG_OOM, ("error: OutOfMemory",))),
    _rule("dart-heap", _RAM, _CPU, (_RX_DART_HEAP, ("Exhausted heap space",))),
    _rule("pbs-memory-kill", _KILLED, _CPU, (_RX_PBS_KILL, ("PBS: job killed: mem",))),
    _rule(
        "scheduler-memory-kill",
        _KILLED,
        _CPU,
        (_RX_SCHEDULER_KILL, ("memory resource limit", "TERM_MEMLIMIT")),
    ),
    _rule("condor-memory-kill", _KILLED, _CPU, (_RX_CONDOR_KILL, ("gone over memory limit",))),
    _rule("slurm-step-kill", _KILLED, _CPU, (_RX_SLURM_STEP_KILL, ("exceeded memory limit (",))),
    _rule(
        "js-buffer-oom",
        _RAM,
        _CPU,
        (_RX_JS_BUFFER_OOM, ("buffer allocation failed", "WebAssembly.")),
    ),
    _rule(
        "webllm-device-lost", _GPU, _UNKNOWN, (_RX_WEBLLM_DEVICE_LOST, ("Device was lost during",))
    ),
    _rule(
        "webgpu-device-oom", _GPU, _UNKNOWN, (_RX_WEBGPU_DEVICE_OOM, ("WebGPU device error(2)",))
    ),
    _rule(
        "mindspore-host-alloc", _RAM, Backend.CUDA, (_RX_MS_HOST_ALLOC, ("cudaHostAlloc failed",))
    ),
    _rule("oracle-memory", _RAM, _CPU, (_RX_ORACLE_OOM, ("ORA-27102", "ORA-04030", "ORA-04031"))),
    _rule("neo4j-memory", _RAM, _CPU, (_RX_NEO4J_MEMORY, ("not enough memory to perform",))),
    _rule("ort-bad-allocation", _RAM, _CPU, (_RX_ORT_BAD_ALLOCATION, ("bad allocation",))),
    _rule("bigquery-memory", _RAM, _CPU, (_RX_BIGQUERY_MEMORY, ("the allotted memory",))),
    _rule("mssql-701", _RAM, _CPU, (_RX_MSSQL_701, ("insufficient system memory",))),
    _rule("ray-object-store-full", _RAM, _CPU, (_RX_RAY_STORE_FULL, ("because it is full",))),
    _rule("arrow-alloc-failed", _RAM, _CPU, (_RX_ARROW_ALLOC, ("ArrowMemoryError",))),
    _rule("exllama-vram", _GPU, _UNKNOWN, (_RX_EXLLAMA_VRAM, ("Insufficient VRAM",))),
    _rule(
        "lmstudio-guardrail", _RAM, _CPU, (_RX_LMSTUDIO_GUARD, ("insufficient system resources",))
    ),
    _rule("macos-malloc-region", _RAM, _CPU, (_RX_MACH_VM_MAP, ("mach_vm_map", "allocate region"))),
    _rule(
        "spark-rapids-rmm-alloc",
        _GPU,
        Backend.CUDA,
        (_RX_SPARK_RMM_ALLOC, ("bytes failed, device store",)),
    ),
    _rule("sglang-no-kv-memory", _GPU, _UNKNOWN, (_RX_SGLANG_NO_KV, ("for the KV cache",))),
    _rule(
        "yolox-label-assignment-oom",
        _GPU,
        Backend.CUDA,
        (_RX_YOLOX_OOM, ("during label assignment",)),
        recovered=True,
    ),
    _vllm_startup_free,
    _oom_exception,
    _oom_type_named,
    # Kubernetes' OOMKilled (not a user's 'OOM killed by Ubuntu': _oom_killed_said)
    _oom_killed_said,
    # the user's words: 'oom-killer kills the comfyui process'
    _rule(
        "oom-killer-said",
        _KILLED,
        _CPU,
        (
            _RX_OOM_KILLER_SAID,
            ("oom-killer", "OOM killer", "oom killer", "OOM-killer", "OOM Killer"),
        ),
    ),
    _exception_oom_words,
    _rule("comfy-got-oom", _GPU, _UNKNOWN, (_RX_GOT_OOM, ("Got an OOM",))),
    _rule("comfy-oom-tips", _GPU, _UNKNOWN, (_RX_TIPS, ("ran out of memory on your GPU",))),
    _rule("supir-oom-hint", _GPU, _UNKNOWN, (_RX_SUPIR_HINT, ("for SUPIR was used",))),
    _rule(
        "acestep-vram-preflight", _GPU, _UNKNOWN, (_RX_ACESTEP_PREFLIGHT, ("sufficient free VRAM",))
    ),
    _rule("vllm-no-cache-memory", _GPU, _UNKNOWN, (_RX_VLLM_NO_CACHE, ("for the cache blocks",))),
    _rule("tgi-prefill-memory", _GPU, _UNKNOWN, (_RX_TGI_PREFILL, ("prefill tokens",))),
    _ggml_buffer,
    _nv_fatal_alloc,
    _rule(
        "v8-heap-oom",
        _RAM,
        _CPU,
        (
            _RX_V8_HEAP,
            (
                "JavaScript heap",
                "FatalProcessOutOfMemory(",
                "limit Allocation failed",
                "JavaScript out of memory",
                "process out of memory",
            ),
        ),
    ),
    _rule(
        "tensorrt-tactic-oom",
        _GPU,
        Backend.CUDA,
        (_RX_TRT_RESIZE, ("resizePhysical",)),
        recovered=True,
    ),
    _rule("macos-app-memory", _RAM, _CPU, (_RX_MACOS_APP_MEMORY, ("application memory",))),
    _rule("nccl-cuda-oom", _GPU, Backend.CUDA, (_RX_NCCL_CUDA_OOM, ("WARN Cuda failure",))),
    _rule("hosted-memory-limit", _KILLED, _CPU, (_RX_HOSTED_LIMIT, ("while running your code",))),
    _rule(
        "swarmui-memory-overload",
        _RAM,
        _UNKNOWN,
        (_RX_SWARMUI_OVERLOAD, ("just before the backend process failed",)),
    ),
    # torch's DataLoader: a worker process the OS killed (RAM ran out)
    _rule(
        "dataloader-worker-killed",
        _KILLED,
        _CPU,
        (_RX_WORKER_KILLED, ("is killed by signal: Killed",)),
    ),
    _rule("slurm-cgroup-oom", _KILLED, _CPU, (_RX_SLURM_OOM, ("oom-kill event", "oom_kill event"))),
    _rule("flux-shell-oom", _KILLED, _CPU, (_RX_FLUX_SHELL_OOM, ("ERROR: oom: Memory cgroup",))),
    _rule("earlyoom-kernel-killer", _KILLED, _CPU, (_RX_EARLYOOM_SYSRQ, ("Invoking oom killer",))),
    _rule(
        "metal-buffer-limit",
        _MPS,
        Backend.MPS,
        (_RX_METAL_BUFFER_LIMIT, ("must not exceed",)),
    ),
    _rule("talos-oom-controller", _KILLED, _CPU, (_RX_TALOS_OOM, ("OOMController",))),
    _rule("colab-ram-crash", _KILLED, _CPU, (_RX_COLAB_RAM, ("all available RAM",))),
    _rule(
        "compiler-killed",
        _KILLED,
        _CPU,
        (_RX_COMPILER_KILLED, ("Killed", "signal terminated program")),
    ),
    _rule("gcc-memory-exhausted", _RAM, _CPU, (_RX_GCC_VM_EXHAUSTED, ("memory exhausted",))),
    _rule("fork-enomem", _RAM, _CPU, (_RX_FORK_ENOMEM, ("cannot allocate memory",))),
    _rule(
        "buildkit-resource-exhausted",
        _KILLED,
        _CPU,
        (_RX_BUILDKIT_EXHAUSTED, ("ResourceExhausted: process",)),
    ),
    _rule("cxx-bad-alloc", _RAM, _CPU, (_RX_BAD_ALLOC, ("bad_alloc",))),
    _rule("kubelet-eviction", _KILLED, _CPU, (_RX_KUBELET_EVICTION, ("low on resource: memory",))),
    _rule("slurm-task-oom", _KILLED, _CPU, (_RX_SRUN_OOM, ("Out Of Memory",))),
    _rule(
        "shell-killed",
        _KILLED,
        _CPU,
        (_RX_BASH_KILLED, ("Killed",)),
        (_RX_BARE_KILLED, ("Killed",)),
        (_RX_ZSH_KILLED, ("killed  ", "zsh: killed")),
        (_RX_ZH_KILLED, ("已杀死",)),
    ),
    _rule(
        "soft-copy-inputs-to-cpu",
        _GPU,
        Backend.CUDA,
        (_RX_COPY_INPUTS_TO_CPU, ("to CPU due to CUDA OOM",)),
        recovered=True,
    ),
    _soft_oom,
)


def _detect(body: str, report: _Report | None) -> tuple[str | None, Pool, Backend, int, bool]:
    """(rule, pool, backend, match position, recovered) of the strongest rule (``_CHECKS``),
    or rule None.

    ``report`` is ``_report(body)``: the fields of a pasted Error Report, if ``body`` is one."""
    for check in _CHECKS:
        found = check(body, report)
        if found is not None:
            return found
    return None, Pool.GPU, Backend.UNKNOWN, 0, False


#: what in a record, or just before it, shows that CUDA's ``out of memory`` came from pinning
#: host RAM, not from VRAM: ComfyUI releasing a model's mmap to pin it, pinning APIs, the pinned
#: staging buffer, the offload stream's async copies (and ``_TERMINATE`` below)
_PINNED_MARKS: tuple[str, ...] = (
    "Attempting to release mmap",
    "pin_memory",
    "cudaHostRegister",
    "Unable to pin memory",
    "hostbuf",
    "HostBuffer",
    "offload_stream.synchronize",
    "non_blocking=non_blocking)",
    "bytes on host",  # TensorFlow's cuda_driver: failed to alloc N bytes on host: CUDA_ERROR_...
    "pinned host memory",
    "cudaMallocHost",  # the runtime's page-locked allocator (dlib, ninfer, TensorRT samples)
    "cuMemAllocHost",  # the driver API's (PG-Strom: 'failed on cuMemAllocHost: CUDA_ERROR_...')
    "cuMemHostAlloc",
)


#: an uncatchable C++ error ending the process ('terminate called after throwing an instance of
#: c10::AcceleratorError') is the pinning path's only while models are being moved: ComfyUI's
#: partial loads and unloads around it. In a training loop it is the device's own OOM.
_TERMINATE = "terminate called after throwing"
_MODEL_MOVES = ("unload", "loaded partially", "Requested to load", "release mmap")


def pinned_evidence(text: str) -> bool:
    """True when ``text`` shows host RAM being pinned (see ``_PINNED_MARKS``)."""
    if any(mark in text for mark in _PINNED_MARKS):
        return True
    return _TERMINATE in text and any(move in text for move in _MODEL_MOVES)


_RX_INLINE_OOM_TYPE = (
    re.compile(  # (ASCII names: '4x3090也报torch.OutOfMemoryError' is torch's type)
        r"((?:[A-Za-z_][A-Za-z0-9_]*\.)*(?<![A-Za-z0-9_])OutOfMemoryError)(?:: |\(['\"])"
        r"(?:CUDA|HIP|XPU) out of memory"
    )
)  # (or its repr, as vLLM's engine logs it: "OutOfMemoryError('CUDA out of memory. ...")


def _inline_exception_type(rule: str, body: str) -> str | None:
    """An exception type the text names inside a line rather than at its start."""
    if rule == "oom-type-named" or (
        rule == "cuda-alloc-on-device" and "OutOfMemoryError -" in body
    ):
        m = _RX_OOM_TYPE_NAMED.search(body)
        return m.group(1) if m else None
    if rule == "memory-error":  # (glued to a CJK title: '# 一直报错MemoryError: bad allocation')
        m = _RX_OOM_EXC_LINE.search(body)
        return m.group(1) if m else None
    if rule == "vllm-no-cache-memory":  # (a title: the raise line's tail, then the exception)
        m = _RX_VLLM_NO_CACHE_TYPE.search(body)
        return m.group(1) if m else None
    if rule == "postgres-oom":  # (the client's exception, glued to a title's words or a lead)
        m = _RX_PG_TYPE.search(body)
        return m.group(1) if m else None
    if rule == "dotnet-oom":  # (after a title's tag: '# [BUG] System.OutOfMemoryException: ...')
        m = _RX_DOTNET_OOM_TYPED.search(body)
        return "System.OutOfMemoryException" if m else None
    if rule == "mps-invalid-buffer":
        m = _RX_MPS_BUFFER.search(body)
        return m.group(1) if m and m.group(1) else None
    if rule == "cpu-allocator" and "[enforce fail at " in body:
        m = _RX_ENFORCE_TYPE.search(body)
        return m.group(1) if m else None
    if rule in _DEVICE_OOM_RULES and (
        "OutOfMemoryError: " in body or "OutOfMemoryError('" in body or 'OutOfMemoryError("' in body
    ):
        m = _RX_INLINE_OOM_TYPE.search(body)
        return m.group(1) if m else None
    if rule == "exception-oom-words" and "`" in body:
        m = _RX_EXC_OOM_WORDS.search(body)  # (an exception quoted as inline code mid-sentence)
        return m.group(1) if m else None
    if rule == "tf-resource-exhausted" and "ResourceExhaustedError" in body:
        m = _RX_TF_EXHAUSTED_TYPE.search(body)  # ('ResourceExhaustedError : OOM ...', retyped)
        return m.group(1) if m else None
    if rule == "cxx-bad-alloc":
        return "std::bad_alloc"
    if rule == "vulkan-out-of-device-memory" and "system_error(" in body:
        m = _RX_CXX_SYSTEM_ERROR.search(body)
        return m.group(1) if m else None
    if rule == "vulkan-device-oom" and ("class std::" in body or "instance of '" in body):
        m = _RX_CXX_THROWN.search(body) or _RX_CXX_TERMINATE.search(body)
        return m.group(1) if m else None
    if rule == "clickhouse-memory-limit" and "DB::Exception: " in body:
        return "DB::Exception"
    if rule == "es-circuit-breaker":
        m = _RX_ES_TYPE.search(body)
        return (m.group(1) or m.group(2)) if m else None
    if rule == "julia-oom":
        return "OutOfMemoryError"
    if rule == "ruby-no-memory":
        m = _RX_RUBY_OOM.search(body)
        return (m.group(1) or m.group(2)) if m else None
    if rule == "mono-oom-nested":
        return "OutOfMemoryException"  # (the class the runtime names in its own sentence)
    if rule == "java-heap-oom":
        m = _RX_JAVA_OOM.search(body)
        return (m.group(1) or m.group(2) or m.group(3) or m.group(8)) if m else None
    if rule == "host-library-alloc" and "cv2.error: " in body:
        return "cv2.error"  # OpenCV's Python exception type is lower case
    if rule == "metal-command-buffer-oom" and ": Error Domain=MTL" in body:
        m = _RX_SWIFT_ERROR_TYPE.search(body)  # Swift's 'MetalExecutionError: Error Domain=...'
        return m.group(1) if m else None
    if (
        rule in ("metal-command-buffer-oom", "mlx-malloc-oom")
        and "uncaught exception of type" in body
    ):
        m = _RX_LIBCXXABI_TYPE.search(body)
        return m.group(1) if m else None
    if rule == "windows-pagefile" and ("Error: [WinError 1455]" in body or "0x800705AF" in body):
        m = _RX_PAGEFILE_TYPE.search(body)
        return (m.group(1) or m.group(2)) if m else None
    if rule == "cuda-error-oom" and "instance of '" in body:
        m = _RX_CXX_TERMINATE.search(body)
        return m.group(1) if m else None
    return None


def _oom_exception_line(body: str) -> tuple[str, int] | None:
    """The last exception line whose type is an OOM type (OutOfMemoryError, MemoryError)."""
    best = None
    for m in _RX_OOM_EXC_LINE.finditer(body):
        name = m.group(1)
        if body[m.start()] == "#" and body[m.start(1) - 1] != " " and not m.group(2):
            # glued to a title's CJK sentence and ending it, with no message: the user's words
            # naming the type ('# 执行报torch.cuda.OutOfMemoryError'), as ``_type_printed`` reads
            continue
        if name.endswith(("OutOfMemoryError", "MemoryError")):
            best = (name, m.start(1))
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


#: rules whose message gives the request as an exact byte count, in group 1 of this regex (an
#: alternative of it may give none: then the request stays unknown)
_EXACT_REQUEST: dict[str, re.Pattern[str]] = {
    "vulkan-device-oom": _RX_VULKAN_DEVICE_OOM,
    "mlx-malloc-oom": _RX_MLX_MALLOC,
    "rust-alloc-failed": _RX_RUST_ALLOC,
    "itex-bfc-oom": _RX_ITEX_BFC,
    "emscripten-oom": _RX_EMSCRIPTEN_OOM,
    "tt-dram-oom": _RX_TT_DRAM,
    "host-library-alloc": _RX_HOST_LIB_ALLOC,
    "onnx-arena-oom": _RX_ONNX_ARENA,
    "mmap-enomem": _RX_MMAP,
    "metal-command-buffer-oom": _RX_METAL_OOM,
    "miopen-buffer-oom": _RX_MIOPEN_BUFFER,
    "ggml-metal-buffer-maximum": _RX_GGML_METAL_MAX,
    "database-load-alloc": _RX_DB_LOAD_ALLOC,
    "postgres-oom": _RX_PG_OOM,
    "flashinfer-workspace-oom": _RX_FLASHINFER_ALIGNED,
    "macos-malloc-region": _RX_MACH_VM_MAP,
    "radv-buffer-alloc": _RX_RADV_BUFFER,
    "go-virtualalloc-pagefile": _RX_GO_VIRTUALALLOC_1455,
    "mysql-oom": _RX_MYSQL_OOM,
    "innodb-mmap-enomem": _RX_INNODB_MMAP,
    "glib-alloc-failed": _RX_GLIB_ALLOC,
    "erlang-alloc": _RX_ERLANG_ALLOC,
    "dart-heap": _RX_DART_HEAP,
    "ray-object-store-full": _RX_RAY_STORE_FULL,
    "arrow-alloc-failed": _RX_ARROW_ALLOC,
    "physx-gpu-alloc": _RX_PHYSX_ALLOC,
    "unity-oom": _RX_UNITY_HEAP,
}


def _numbers(rule: str, body: str, fields: dict[str, Any], extra: list[tuple[str, Any]]) -> None:
    if "; GPU=" in body:
        m = _RX_ORT_GPU.search(body)  # onnxruntime's CUDA provider names the device
        if m:
            fields["gpu_index"] = int(m.group(1))
    if rule == "dxvk-alloc-failed":
        m = _RX_DXVK_SIZE.search(body)
        fields["requested_bytes"] = int(m.group(1)) if m else None
        heaps = _RX_DXVK_HEAP.findall(body)
        if len(heaps) == 1:  # (one heap: the card's whole memory; DXVK's MB are MiB)
            fields["total_bytes"] = int(heaps[0]) * MIB
        return
    if rule == "unreal-oom":
        m = _RX_UNREAL_OOM.search(body)
        fields["requested_bytes"] = int(m.group(1)) if m else None
        return
    if rule == "ios-memory-limit":
        m = _RX_IOS_EXC_RESOURCE.search(body)
        if m:
            extra.append(("allowed_bytes", int(m.group(1)) * MIB))  # (iOS's MB are MiB)
        return
    if rule == "tensorrt-tactic-device":
        m = _RX_TRT_TACTIC_DEVICE.search(body)
        if m:
            fields["requested_bytes"] = int(m.group(1)) * MIB
            fields["free_bytes"] = int(m.group(2)) * MIB
        return
    if rule == "xla-tpu-oom":
        m = _RX_XLA_TPU_OOM.search(body)
        if m and m.group(1):  # 'Used X of Y hbm': the program needs X of the chip's Y
            fields["requested_bytes"] = size_bytes(m.group(1), m.group(2))
            fields["total_bytes"] = size_bytes(m.group(3), m.group(4))
        elif m and m.group(5):
            fields["requested_bytes"] = size_bytes(m.group(5), m.group(6))
            fields["free_bytes"] = size_bytes(m.group(7), m.group(8))
        elif m and m.group(9):
            fields["requested_bytes"] = size_bytes(m.group(9), m.group(10))
        return
    if rule == "neuron-device-oom":
        m = _RX_NEURON_OOM.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = int(m.group(1))
        return
    if rule == "clickhouse-memory-limit":
        m = _RX_CLICKHOUSE_LIMIT.search(body)
        if m and m.group(1):
            extra.append(("usage_bytes", size_bytes(m.group(1), m.group(2))))
            extra.append(("limit_bytes", size_bytes(m.group(6), m.group(7))))
            if m.group(4):
                extra.append(("vm_rss_bytes", size_bytes(m.group(4), m.group(5))))
            if m.group(3):
                fields["requested_bytes"] = int(m.group(3))
        return
    if rule == "es-circuit-breaker":
        # (ES 5 left the request out of its message; its JSON's bytes_wanted has it)
        wants = [int(w.group(1) or w.group(2)) for w in _RX_ES_WOULD_BE.finditer(body)]
        limit = _RX_ES_LIMIT.search(body)
        if wants:
            extra.append(("usage_bytes", wants[-1] if "bytes_wanted" in body else wants[0]))
        if limit:
            extra.append(("limit_bytes", int(limit.group(1) or limit.group(2))))
        return
    if rule == "trino-memory-limit":
        m = _RX_TRINO_LIMIT.search(body)
        if m:
            if m.group(3):
                extra.append(("usage_bytes", size_bytes(m.group(3), m.group(4))))
            extra.append(("limit_bytes", size_bytes(m.group(1), m.group(2))))
            if m.group(5):
                fields["requested_bytes"] = size_bytes(m.group(5), m.group(6))
        return
    if rule == "duckdb-oom":
        m = _RX_DUCKDB_OOM.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = size_bytes(m.group(1), m.group(2))
            if m.group(3):
                extra.append(("usage_bytes", size_bytes(m.group(3), m.group(4))))
                extra.append(("limit_bytes", size_bytes(m.group(5), m.group(6))))
        elif m and m.group(7):
            fields["requested_bytes"] = int(m.group(7))
        return
    if rule == "yarn-container-kill":
        m = _RX_YARN_KILL.search(body)
        if m and m.group(1):
            extra.append(("usage_bytes", size_bytes(m.group(1), m.group(2))))
            extra.append(("limit_bytes", size_bytes(m.group(3), m.group(4))))
        return
    if rule == "php-memory-limit":
        m = _RX_PHP_LIMIT.search(body)
        if m:
            extra.append(("limit_bytes", int(m.group(1))))
            fields["requested_bytes"] = int(m.group(2)) if m.group(2) else None
        return
    if rule == "php-out-of-memory":
        m = _RX_PHP_OOM.search(body)
        if m:
            fields["process_used_bytes"] = int(m.group(1))
            fields["requested_bytes"] = int(m.group(2)) if m.group(2) else None
        return
    if rule == "matlab-oom":
        m = _RX_MATLAB_OOM.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = size_bytes(m.group(1), m.group(2))
        return
    if rule == "pbs-memory-kill":
        m = _RX_PBS_KILL.search(body)
        if m:
            extra.append(("usage_bytes", int(m.group(1)) * KIB))
            extra.append(("limit_bytes", int(m.group(2)) * KIB))
        return
    if rule == "condor-memory-kill":
        m = _RX_CONDOR_KILL.search(body)
        if m:
            extra.append(("limit_bytes", int(m.group(1)) * MIB))
            if m.group(2):
                extra.append(("usage_bytes", int(m.group(2)) * MIB))
        return
    if rule == "slurm-step-kill":
        m = _RX_SLURM_STEP_KILL.search(body)
        if m:  # (slurmstepd's figures are KiB)
            extra.append(("usage_bytes", int(m.group(1)) * KIB))
            extra.append(("limit_bytes", int(m.group(2)) * KIB))
        return
    if rule == "mindspore-host-alloc":
        extra.append(("host_memory", "pinned"))
        return
    if rule == "oracle-memory":
        m = _RX_ORACLE_OOM.search(body)
        if m and (m.group(1) or m.group(2)):
            fields["requested_bytes"] = int(m.group(1) or m.group(2))
        return
    if rule == "mongo-sort-limit":
        m = _RX_MONGO_SORT.search(body)
        if m:
            extra.append(("limit_bytes", int(m.group(1))))
        return
    if rule == "photopea-ram":
        m = _RX_PHOTOPEA_RAM.search(body)
        fields["requested_bytes"] = int(m.group(1)) * MIB if m else None
        return
    if rule == "cloud-run-memory-limit":
        m = _RX_CLOUD_RUN_LIMIT.search(body)
        if m:  # (its M and MiB alike: Cloud Run's memory settings are binary)
            extra.append(("limit_bytes", int(m.group(1)) * MIB))
            extra.append(("usage_bytes", int(m.group(3)) * MIB))
        return
    if rule == "android-lmkd-kill":
        m = _RX_LMKD_KILL.search(body)
        if m:
            fields["killed_pid"] = int(m.group(2))
            extra.append(("process_name", m.group(1)))
            extra.append(("vm_rss_bytes", int(m.group(3)) * KIB))
        return
    if rule == "iis-memory-recycle":
        m = _RX_IIS_RECYCLE.search(body)
        if m and m.group(1):
            extra.append(("usage_bytes", int(m.group(1))))
            fields["total_bytes"] = int(m.group(2))
        return
    if rule == "wine-virtual-memory":
        m = _RX_WINE_VIRTUAL.search(body)
        fields["requested_bytes"] = int(m.group(1), 16) if m else None
        return
    if rule in ("tf-bfc-oom", "tf-bfc-host-oom"):
        m = _RX_TF_BFC_ROUNDED.search(body)
        fields["requested_bytes"] = int(m.group(4)) if m else None
        m = _RX_TF_BFC_GPU.search(body)
        if m:
            fields["gpu_index"] = int(m.group(1))
        if rule == "tf-bfc-host-oom":
            extra.append(("host_memory", "pinned"))
        return
    if (exact := _EXACT_REQUEST.get(rule)) is not None:
        m = exact.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = int(m.group(1))
        return
    if rule.startswith(
        (
            "cuda-oom",
            "hip-oom",
            "xpu-oom",
            "npu-oom",
            "musa-oom",
            "oom-exception",
            "cuda-alloc",
            "comfy-",
        )
    ):
        fields["requested_bytes"] = _size(_find(_RX_TRIED, body, "Tried to allocate"))
        m = _find(_RX_TOTAL, body, "capac")
        if m:
            fields["total_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        m = _find(_RX_FREE, body, " free")
        if m:
            fields["free_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        m = _find_first(_RX_ALLOCATED, body, _ALLOCATED_BRANCHES)
        if m:
            fields["allocated_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        m = _find_first(_RX_RESERVED_UNALLOC, body, _RESERVED_UNALLOC_BRANCHES)
        if m:
            fields["reserved_unallocated_bytes"] = _size(m) if m.group(1) else _size(m, 3)
        reserved = _size(_find(_RX_RESERVED, body, "reserved in total", "reserved\n"))
        fields["reserved_bytes"] = reserved
        if (
            fields.get("reserved_unallocated_bytes") is None
            and reserved is not None
            and fields.get("allocated_bytes") is not None
            and reserved >= fields["allocated_bytes"]
        ):
            fields["reserved_unallocated_bytes"] = reserved - fields["allocated_bytes"]
        fields["process_used_bytes"] = _size(_find(_RX_THIS_PROCESS, body, "process has"))
        others: dict[int, OtherProcess] = {}  # (a record quoting the message twice names a
        for pm in _RX_PROCESS.finditer(body) if "Process " in body else ():  # pid once)
            pid = int(pm.group(1))
            if pid not in others:
                others[pid] = OtherProcess(pid=pid, bytes=size_bytes(pm.group(2), pm.group(3)))
        fields["_others"] = tuple(others.values())
        private = _size(_find(_RX_PRIVATE, body, "private pools"))
        if private is not None:
            extra.append(("private_pools_bytes", private))
        allowed = _size(_find(_RX_ALLOWED, body, " allowed;"))
        if allowed is not None:
            extra.append(("allowed_bytes", allowed))
        m = _find(_RX_GPU_INDEX, body, "GPU", "NPU")
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
    elif rule == "cupy-oom":
        m = _RX_CUPY_OOM.search(body)
        if m:
            if m.group(1) or m.group(3):
                fields["requested_bytes"] = int((m.group(1) or m.group(3)).replace(",", ""))
            if m.group(2):
                fields["reserved_bytes"] = int(m.group(2))  # (what the pool holds)
            if m.group(4):
                fields["allocated_bytes"] = int(m.group(4).replace(",", ""))
    elif rule == "spark-rapids-rmm-alloc":
        m = _RX_SPARK_RMM_ALLOC.search(body)
        if m:
            fields["requested_bytes"] = int(m.group(1))
            if m.group(2):
                fields["allocated_bytes"] = int(m.group(2))
    elif rule == "faiss-gpu-oom":
        m = _RX_FAISS_OOM.search(body)
        if m:
            fields["requested_bytes"] = int(m.group(1) or m.group(4) or m.group(5))
            if m.group(2) or m.group(3):
                fields["gpu_index"] = int(m.group(2) or m.group(3))
    elif rule == "windows-low-virtual-memory":
        fields["_others"] = tuple(
            OtherProcess(pid=int(c.group(2)), bytes=int(c.group(3)))
            for c in _RX_WIN_LOW_VIRTUAL_CONSUMER.finditer(body)
        )
    elif rule == "vllm-startup-free-memory":
        m = _RX_VLLM_STARTUP_FREE.search(body)
        if m:
            if m.group(2):
                fields["gpu_index"] = int(m.group(2))
            fields["free_bytes"] = size_bytes(m.group(3), "GiB")
            fields["total_bytes"] = size_bytes(m.group(4), "GiB")
            fields["requested_bytes"] = size_bytes(m.group(5), "GiB")
    elif rule == "ray-memory-monitor-kill":
        m = _RX_RAY_VICTIM_PID.search(body)
        if m:
            fields["killed_pid"] = int(m.group(1))
    elif rule == "xla-resource-exhausted":
        m = _RX_XLA_OOM.search(body)
        if m:
            size = m.group(1) or m.group(2)
            if size:
                fields["requested_bytes"] = int(size)
            if m.group(3):
                fields["gpu_index"] = int(m.group(3))
    elif rule == "tf-resource-exhausted":
        m = _RX_TF_DEVICE.search(body) or _RX_TF_BFC_GPU.search(body)
        if m:
            fields["gpu_index"] = int(m.group(1))
        m = _RX_TF_BFC_FAILED.search(body)
        if m:
            fields["requested_bytes"] = _size(m)
    elif rule == "acestep-vram-preflight":
        m = _RX_ACESTEP_PREFLIGHT.search(body)
        if m:
            fields["requested_bytes"] = _size(m)
            fields["free_bytes"] = _size(m, 3)
    elif rule == "mps-invalid-buffer":
        m = _RX_MPS_BUFFER.search(body)
        if m and m.group(2):
            fields["requested_bytes"] = size_bytes(m.group(2), m.group(3))
    elif rule == "directml-oom":
        m = _RX_DIRECTML.search(body)
        if m and (m.group(1) or m.group(2)):
            fields["requested_bytes"] = int(m.group(1) or m.group(2))
    elif rule == "cpu-allocator":
        m = _RX_CPU_ALLOC.search(body) or _RX_CPU_ALLOC_TAIL.search(body)
        # (the tail's title alternative holds its figure in groups 3 and 4)
        size, unit = (m.group(3), m.group(4)) if m and m.lastindex == 4 else (None, None)
        if m and not size:
            size, unit = m.group(1), m.group(2)
        if m and size and unit:
            fields["requested_bytes"] = int(size) * (1 if unit == "bytes" else _K**3)
        elif m is None and (t := _RX_CPU_ALLOC_TRANSLATED.search(body)) and t.group(1):
            fields["requested_bytes"] = int(t.group(1))
    elif rule == "ggml-pinned-host":
        m = _RX_GGML_PINNED.search(body)
        if m:
            fields["requested_bytes"] = _size(m)
    elif rule == "paddle-gpu-oom":
        m = _RX_PADDLE_OOM.search(body)
        if m:
            fields["gpu_index"] = int(m.group(1))
            fields["requested_bytes"] = size_bytes(m.group(2), m.group(3))
            if m.group(4):
                fields["allocated_bytes"] = size_bytes(m.group(4), m.group(5))
            if m.group(6):
                fields["free_bytes"] = size_bytes(m.group(6), m.group(7))
        elif m := _RX_PADDLE_HEAD.search(body):
            fields["gpu_index"] = int(m.group(1))
    elif rule == "macos-memorystatus-kill":
        m = _RX_MEMORYSTATUS.search(body)
        if m:
            fields["killer"] = "kernel"
            fields["killed_pid"] = int(m.group(2))
            extra.append(("process_name", m.group(1)))
    elif rule == "container-memory-limit":
        m = _RX_CONTAINER_LIMIT.search(body)
        if m and m.group(1):
            # (the platform's 'Gi', 'GB' and 'G' all mean 2^30, as size_bytes reads them)
            fields["total_bytes"] = size_bytes(m.group(1), m.group(2)[0] + "iB")
    elif rule == "library-ram-guard":
        m = _RX_LIB_RAM_GUARD.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = _size(m)
            fields["free_bytes"] = _size(m, 3)
    elif rule == "cuda-error-oom":
        if "current device: " in body and (g := _RX_GGML_DEVICE.search(body)):
            fields["gpu_index"] = int(g.group(1))
        m = _find(
            _RX_CUDA_ERROR_REQUEST,
            body,
            "allocating ",
            "failed to alloc",
            "Requested amount",
            "buffer of length",
        )
        if m:
            if m.group(1):
                fields["requested_bytes"] = _size(m)
                fields["gpu_index"] = int(m.group(3))
            elif m.group(7):
                fields["requested_bytes"] = size_bytes(m.group(7), m.group(8) + "iB")
            else:
                fields["requested_bytes"] = int(
                    m.group(4) or m.group(5) or m.group(6) or m.group(9)
                )
    elif rule == "exception-oom-words":
        m = _RX_NEED_HAVE.search(body) if "Need: " in body else None
        if m:  # A1111's attention check: 'Need: 0.9GB free, Have:0.7GB free'
            fields["requested_bytes"] = size_bytes(m.group(1), "GB")
            fields["free_bytes"] = size_bytes(m.group(2), "GB")
    elif rule in ("numpy-alloc", "memory-error"):
        m = _RX_NUMPY.search(body)
        if m:
            fields["requested_bytes"] = size_bytes(m.group(1), m.group(2))
    elif rule == "kernel-oom-kill":
        _kernel_facts([k for _, k in _kernel_records(body)], fields, extra)
    elif rule == "tensorrt-tactic-oom":
        m = _RX_TRT_RESIZE.search(body)
        if m and m.group(1):
            fields["requested_bytes"] = int(m.group(1))
        elif "Requested amount" in body and (m := _RX_CUDA_ERROR_REQUEST.search(body)):
            # (its warning on the next line: 'Requested amount of GPU memory (N bytes) ...')
            fields["requested_bytes"] = int(m.group(6)) if m.group(6) else None
    elif rule == "ggml-metal-alloc":
        fields["requested_bytes"] = _size(_RX_GGML_METAL.search(body))
    elif rule == "java-heap-oom":
        m = _RX_JAVA_OOM.search(body)
        if m and m.group(9):
            fields["requested_bytes"] = int(m.group(9))
            if m.group(10):
                extra.append(("usage_bytes", int(m.group(10))))
                extra.append(("limit_bytes", int(m.group(11))))
        if m and m.group(4):
            fields["requested_bytes"] = int(m.group(4))
            fields["free_bytes"] = int(m.group(5))
            if m.group(7) or m.group(6):
                fields["total_bytes"] = int(m.group(7) or m.group(6))
    elif rule == "ggml-buffer-alloc":
        m = _RX_GGML_BUFFER.search(body)
        size = m and (m.group(2) or m.group(4))
        if size:
            fields["requested_bytes"] = int(size)
    elif rule == "earlyoom-kill":
        kill = _earlyoom_in(body)
        if kill is not None:
            fields["killed_pid"] = kill.pid
            extra.append(("signal", kill.signal))
            extra.append(("process_name", kill.name))
            if kill.vm_rss_bytes is not None:  # (a line cut inside its figure shows none)
                extra.append(("vm_rss_bytes", kill.vm_rss_bytes))
        fields["killer"] = "earlyoom"
    elif rule == "nohang-kill":
        fields["killer"] = "nohang"
    elif rule == "systemd-oomd-kill":
        m = _RX_OOMD.search(body)
        if m:
            extra.append(("unit", m.group(1) or m.group(2)))
        else:
            m = _RX_OOMD_ATTEMPT.search(body)
            if m:
                fields["killed_pid"] = int(m.group(1))
        fields["killer"] = "systemd-oomd"
    elif rule == "systemd-oom-kill":
        m = _RX_SYSTEMD_UNIT.search(body)
        if m and m.group(1):
            extra.append(("unit", m.group(1)))
        fields["killer"] = "kernel"
    elif rule == "systemd-oom-result":
        m = _RX_SYSTEMD_OOM_RESULT.search(body)
        if m and m.group(1):
            extra.append(("unit", m.group(1)))
    elif rule == "dataloader-worker-killed":
        m = _RX_WORKER_KILLED.search(body)
        if m and m.group(1):
            fields["killed_pid"] = int(m.group(1))
    elif rule == "talos-oom-controller":
        m = _RX_TALOS_OOM.search(body)
        if m:
            extra.append(("signal", m.group(1)))
    elif rule in ("slurm-cgroup-oom", "flux-shell-oom"):
        fields["killer"] = "kernel"
        extra.append(("scope", "cgroup"))
    elif rule == "earlyoom-kernel-killer":
        fields["killer"] = "kernel"
    elif rule == "metal-buffer-limit":
        m = _RX_METAL_BUFFER_LIMIT.search(body)
        if m:
            fields["requested_bytes"] = int(m.group(1), 0)
    elif rule == "oom-killer-said":
        fields["killer"] = "kernel"
    elif rule == "shell-killed":
        m = _RX_BASH_KILLED.search(body) or _RX_ZSH_KILLED.search(body)
        if m and m.group(1):
            fields["killed_pid"] = int(m.group(1))
    elif rule == "soft-split-attention-steps":
        m = _RX_SOFT[2][1].search(body)
        if m and m.group(1):
            extra.append(("steps", int(m.group(1))))
    for key in list(fields):
        if fields[key] is None and key != "_others":
            del fields[key]


#: torch's OOM type named anywhere (an issue title, a sentence): the failure, by its name
_RX_OOM_TYPE_NAMED = re.compile(  # (not 'torch._C.OutOfMemoryError', 'OutOfMemoryError = ...',
    # "has no attribute 'OutOfMemoryError'": code and a missing attribute, no failure)
    r"(?<![\w.'])((?:torch\.(?:cuda\.)?)?OutOfMemoryError)\b(?!\s*=|')"
)
#: the node a title names around the type: 'FaceDetailerPipe: torch.OutOfMemoryError - ...',
#: 'TangoFluxVAEDecodeAndPlay - torch.OutOfMemoryError: ...', '... OutOfMemoryError in KSampler'
_RX_TITLE_NODE = re.compile(
    r"(?:^(?:#+ )?(?:\[\w+\]: ?)?|(?<= - ))([A-Z][A-Za-z0-9_]{2,80})(?::| -) "
    r"(?:\*\*Exception Type:\*\* )?(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b"
    r"|OutOfMemoryError in ([A-Z][A-Za-z0-9_]{2,80})\b"
    # a toast's node glued to the type by a space ('# CLIPTextEncode torch.OutOfMemoryError:'):
    # CamelCase only, so a sentence's 'Got torch.OutOfMemoryError' names no node
    r"|^(?:#+ )?([A-Z][a-z0-9_]*[A-Z][A-Za-z0-9_]{1,80}) torch\.(?:cuda\.)?OutOfMemoryError:"
)
#: a pack that caught the OOM and went on, in the same record: '...failed (OutOfMemoryError: ...);
#: falling back to plain video for carrier tile'
_RX_FELL_BACK = re.compile(r"\); falling back to |\bfalling back to (?:CPU|tiled|smaller)\b")
#: what a wrapper that swallows an exception prints before its text: ComfyUI-GGUF's tensor,
#: "ignoring 'copy_' on tensor: <the error>" (ops.py's copy_, which then returns): the failure
#: was caught and the run went on; a later failure is another event
_RX_IGNORED_LEAD = re.compile(
    r"^\s*[Ii]gnoring '?\w+'? on tensor: "
    # FSDP's state_dict warning: the clone of one tensor failed, the state_dict went on
    r"|\bUserWarning: Failed to clone\(\) tensor with name \S+\."
)
#: a pack announcing its own retry of an OOM (SeedVR2: 'OOM during ...' then 'Clearing memory
#: and retrying'): a soft OOM, as ComfyUI's own 'retrying with tiled VAE decoding' is
RETRYING = re.compile(r"\bretrying\b", re.IGNORECASE)
#: a UI's field label before an exception line (Easy Diffusion's ``Extend: RuntimeError: ...``)
_RX_UI_LABEL = re.compile(  # (or an issue form's '[Bug]: ', a title's '# [Bug] ')
    r"(?:#+ )?(?:[A-Z][a-z]{2,15}: |\[\w+\]:? )(?=(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*Error(?:: |\s*$))"
)


def _exception_of(lines: list[str], idx: int) -> tuple[str | None, str | None]:
    """(type, message) of the exception line carrying the evidence, else the last OOM-ish one."""
    m = _RX_EXC_LINE.match(lines[idx].lstrip().removeprefix("# "))  # (an issue title's mark)
    if m is None and (label := _RX_UI_LABEL.match(lines[idx])) is not None:
        m = _RX_EXC_LINE.match(lines[idx][label.end() :])
    if m and not m.group(1).startswith(("Warning", "Compile")):
        # a wrapper's type before the real one (``com.chaquo.python.PyException: RuntimeError:
        # [enforce fail ...``, a str(e) re-raised): the innermost type names the failure
        while m.group(2) and (inner := _RX_EXC_LINE.match(m.group(2))):
            m = inner
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
    if best == (None, None) and idx > 0 and not _RX_EXC_LINE.match(lines[idx]):
        # the line before is an exception whose message goes on here (a pack's
        # ``RuntimeError: Failed to load video: ...`` / ``due to: ... DefaultCPUAllocator ...``,
        # or Paddle's ``ResourceExhaustedError:`` alone, a blank line, then the message)
        before = idx - 1
        while before > 0 and not lines[before].strip():
            before -= 1
        m = _RX_EXC_LINE.match(lines[before])
        if m and not m.group(1).startswith(("Warning", "Compile")):
            return m.group(1), m.group(2)
    return best


#: an exception type printed right before the evidence, after a non-name character: an issue
#: title ``Wan2_1_SkyreelsA2,RuntimeError: CUDA error: out of memory``, a sentence ending
#: ``...during execution:torch.OutOfMemoryError: Allocation on device``, or after the full stop
#: of the output line it was glued to (``number of parameters: 81894144.RuntimeError: ...``; a
#: dotted module path has a letter before its dots)
_RX_TYPE_BEFORE = re.compile(  # ASCII word before: a type glued to CJK text still counts
    # (or retyped with a dash instead of the colon: 'RuntimeError - CUDA out of memory')
    # (or a space before its colon: 'OSError : The paging file ...')
    r"(?:(?<![A-Za-z0-9_.])|(?<=[0-9)\]]\.))((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))(?: ?:[ \t]?| - )$"
)


def _type_before(line: str, col: int) -> str | None:
    """The exception type that ends right where the evidence starts on its line, if any."""
    m = _RX_TYPE_BEFORE.search(line, 0, max(col, 0))
    return m.group(1) if m else None


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


#: the UI's error toast with its newlines lost (an issue title): the exception type as the
#: toast's title, the node's id and type, then the type again before the message
#: a title that glued the toast's node class to its message: 'SONICSampler Allocation on device'
_RX_TOAST_TITLE_NODE = re.compile(r"^(?:#+ )?([A-Za-z][\w\-]{2,80}) Allocation on device\b")
_RX_FLAT_TOAST = re.compile(
    r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)) (\d+(?::\d+)*) ([A-Za-z][\w\-]{1,80}) \1\b"
)


def _dialog_node(body: str) -> str | None:
    whole = _RX_DIALOG_LINE.search(body)
    if whole is not None:  # up to the colon ending the line: 'LayerMask: BiRefNetUltra' whole
        return whole.group(1).strip()
    m = _RX_DIALOG.search(body)
    return m.group(1).strip() if m else None


def _colon_node(line: str) -> str | None:
    m = _RX_NODE_COLON.match(line)
    # (a title 'DefaultCPUAllocator : not enough memory' names torch's allocator, not a node;
    # PowerShell's error record for a native program, 'DockerDo : docker.exe: Error ...', names
    # the command it ran)
    if (
        m
        and not m.group(1).endswith(("Error", "Exception", "Allocator"))
        and not _RX_EXE_LEAD.match(line, m.end())
    ):
        return m.group(1)
    return None


#: a class name's version suffix ('NunchakuTextEncoderLoaderV2', 'DepthAnything_V2')
_RX_VERSION_END = re.compile(r"[Vv]\d+$")


def _is_node_ident(text: str) -> bool:
    if not _RX_NODE_IDENT.match(text) or text in _NOT_NODES:
        return False
    if text.endswith(("Error", "Exception", "Warning")):
        return False
    if text.isalpha() and text.isupper():
        return False  # a log level or a heading on its own line ('ERROR'), not a node class
    if text[-1].isdigit() and _RX_VERSION_END.search(text) is None:
        return False  # a model's name ('LLama3', 'Qwen2'); a class's version ends 'V2'
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

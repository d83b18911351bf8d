"""Run ComfyUI's ``main.py`` inside ComfyUI's own interpreter and report what torch saw.

Why a bootstrap instead of ``python main.py``: NVML sees a process's whole GPU use only as
often as we sample it, while torch's caching allocator keeps exact high-water marks
(``max_memory_allocated``/``max_memory_reserved``) that only code *inside* the process can
read. The same place is the only one that can cap VRAM to reproduce a smaller card
(``torch.cuda.set_per_process_memory_fraction``) and keep the allocator's history when an
allocation fails (``torch.cuda.memory._record_memory_history`` and an out-of-memory observer,
as PyTorch's "Understanding CUDA Memory Usage" notes show).

Rules this file lives by:

* **Standard library only, Python 3.8+** (annotations are never evaluated). It runs in the user's ComfyUI interpreter, which
  has neither oom-sentinel nor our Python version. The harness copies it next to the
  workspace (outside the checked-out ComfyUI) and runs it by path.
* **Never import torch first.** torch picks its CUDA allocator backend when its library loads
  (``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``, set by ComfyUI's ``cuda_malloc.py``
  before it imports torch), and ComfyUI warns when torch was imported before it. So a
  ``sys.meta_path`` hook waits for ComfyUI's own ``import torch`` and then queues our set-up
  with ``torch.cuda._lazy_call``: it runs when CUDA initialises, before any allocation.
* **No torch, no problem.** Without torch (the stand-in ComfyUI used in tests, a CPU-only
  box) the report says so and the harness measures with NVML and RSS alone.

The report is one JSON file, replaced atomically: every 100 ms while the peaks change, on
an out-of-memory error, on SIGTERM (the harness's stop signal) and at exit. Its fields::

    {"format": 1, "pid": N, "phase": "starting|running|exited|terminated",
     "torch": {"imported": bool, "version": str|null, "cuda": bool, "backend": str|null,
               "devices": [{"index", "name", "total_bytes", "max_allocated_bytes",
                            "max_reserved_bytes", "reserved_bytes"}],
               "budget_bytes": N|null, "fractions": {index: f}, "history": bool,
               "history_refused": "cudaMallocAsync"|null, "errors": [str]},
     "oom": {"device": i, "requested_bytes": n, "device_free_bytes": n,
             "allocated_bytes": n, "history_file": path|null} | null,
     "exit_code": int|null, "modules": [every module imported, at the end],
     "ram": {"hwm_bytes": N|null},
     "nodes": {"hook": "execution.execute"|null, "vram_source": "torch"|"nvml"|"fake-gpu"|null,
               "ram_source": "vmhwm-reset"|"sampled"|null, "notes": [str],
               "peaks": [{"node_id", "class_type", "peak_vram_bytes", "peak_ram_bytes",
                          "runs", "partial"?}]}}   (partial: running when stopped)

Per-node peaks: ComfyUI's ``execution`` module is wrapped when it is imported (another
``sys.meta_path`` hook; no file of ComfyUI changes). The hook point is the module-level
``execute(server, dynprompt, caches, current_item, ...)``: every ComfyUI since the execution
model of mid-2024 (v0.3.x through v0.8) runs each node through it and looks it up as a module
global (``PromptExecutor.execute``/``execute_async`` call ``execute(...)``), synchronous up to
v0.3.4x and a coroutine since; ``get_output_data`` and ``_async_map_node_over_list`` changed
their arguments across those versions (no node id before the async rewrite), so they are not
used. Without that function the report says so and carries no per-node peaks. VRAM per node:
torch's peak counters reset at the node's start and read at its end (exact) when CUDA is up,
else NVML's per-process use (or the fake GPU's per-process file, its stand-in) sampled every
5 ms during the node. RSS per node: on Linux the kernel's own high-water mark, reset at the
node's start by writing "5" to ``/proc/self/clear_refs`` and read from ``VmHWM`` at its end
(exact, one write per node, where a sampler misses a spike between samples); the mark reached
before each reset is kept in ``ram.hwm_bytes`` so the harness's whole-run peak still has it.
Elsewhere (or where the write is refused) RSS is sampled with the VRAM.

Usage (the harness builds this line)::

    python oom_bisect_bootstrap.py --result FILE [--vram-budget-bytes N] [--no-history]
        -- /path/to/ComfyUI/main.py [ComfyUI flags...]
"""

from __future__ import annotations

import sys

# The script's own directory is sys.path[0]; nothing of ours may shadow ComfyUI's modules.
# (The harness keeps this file alone in its folder, but a user may run it from anywhere.)
if sys.path and sys.path[0] and __name__ == "__main__":
    del sys.path[0]

import contextlib
import json
import os
import runpy
import signal
import tempfile
import threading
from typing import Any

FORMAT = 1
#: how often the writer thread looks at torch's counters (they are cheap to read)
POLL_S = 0.1
#: the allocator history kept for an OOM: enough for a few sampler steps of a large model
HISTORY_ENTRIES = 100000


class Reporter:
    """Holds what the parent will read and writes it atomically next to ``path``."""

    def __init__(self, path: str, budget_bytes: int | None, history: bool) -> None:
        self.path = path
        self.budget_bytes = budget_bytes
        self.history = history
        self.lock = threading.RLock()
        self.data: dict[str, Any] = {
            "format": FORMAT,
            "pid": os.getpid(),
            "phase": "starting",
            "torch": {
                "imported": False,
                "version": None,
                "cuda": False,
                "backend": None,
                "devices": [],
                "budget_bytes": budget_bytes,
                "fractions": {},
                "history": False,
                "history_refused": None,
                "errors": [],
            },
            "oom": None,
            "exit_code": None,
            "ram": {"hwm_bytes": None},
            "nodes": {
                "hook": None,
                "vram_source": None,
                "ram_source": None,
                "notes": [],
                "peaks": [],
            },
        }
        self._last = ""
        self._stop = threading.Event()
        self.nodes: NodePeaks | None = None

    # -- writing
    def write(self) -> None:
        with self.lock:
            text = json.dumps(self.data, sort_keys=True)
            if text == self._last:
                return
            directory = os.path.dirname(os.path.abspath(self.path))
            fd, tmp = tempfile.mkstemp(prefix=".bootstrap-", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                os.replace(tmp, self.path)
                self._last = text
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def error(self, what: str, exc: BaseException) -> None:
        with self.lock:
            errors: list[str] = self.data["torch"]["errors"]
            if len(errors) < 20:
                errors.append(f"{what}: {type(exc).__name__}: {exc}"[:300])

    # -- torch
    def torch_imported(self, torch: Any) -> None:
        with self.lock:
            t = self.data["torch"]
            t["imported"] = True
            t["version"] = str(getattr(torch, "__version__", "") or "") or None
        try:
            torch.cuda._lazy_call(lambda: self._on_cuda_init(torch))
        except Exception as exc:  # a torch without CUDA support, or a private API gone
            self.error("queueing the CUDA set-up", exc)
        self.write()

    def _on_cuda_init(self, torch: Any) -> None:
        """Runs inside torch's CUDA lazy init, before the first allocation."""
        with self.lock:
            t = self.data["torch"]
            t["cuda"] = True
            try:
                conf = torch.cuda.get_allocator_backend()
                t["backend"] = str(conf)
            except Exception:
                t["backend"] = None
        try:
            count = int(torch.cuda.device_count())
        except Exception as exc:
            self.error("device_count", exc)
            count = 0
        for index in range(count):
            try:
                props = torch.cuda.get_device_properties(index)
                total = int(props.total_memory)
                name = str(props.name)
            except Exception as exc:
                self.error(f"device {index} properties", exc)
                continue
            with self.lock:
                self.data["torch"]["devices"].append(
                    {
                        "index": index,
                        "name": name,
                        "total_bytes": total,
                        "max_allocated_bytes": 0,
                        "max_reserved_bytes": 0,
                        "reserved_bytes": 0,
                    }
                )
            if self.budget_bytes is not None and total > 0:
                fraction = min(1.0, self.budget_bytes / float(total))
                try:
                    torch.cuda.set_per_process_memory_fraction(fraction, index)
                    with self.lock:
                        self.data["torch"]["fractions"][str(index)] = fraction
                except Exception as exc:  # e.g. the cudaMallocAsync backend
                    self.error(f"capping device {index} at {self.budget_bytes} bytes", exc)
        if self.history:
            self._start_history(torch)
        try:
            torch._C._cuda_attach_out_of_memory_observer(self._observer(torch))
        except Exception as exc:
            self.error("attaching the out-of-memory observer", exc)
        self.write()

    def _start_history(self, torch: Any) -> None:
        record = getattr(torch.cuda.memory, "_record_memory_history", None)
        if record is None:
            return
        backend = str(self.data["torch"]["backend"] or "")
        if not backend:  # a torch without get_allocator_backend: the variable ComfyUI sets
            conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
            backend = "cudaMallocAsync" if "backend:cudaMallocAsync" in conf else ""
        if "cudaMallocAsync" in backend:
            # torch's cudaMallocAsync allocator has no history to record (it refuses the
            # call), and ComfyUI turns it on by default: say so instead of failing noisily;
            # the harness offers a replay with --disable-cuda-malloc for the history
            with self.lock:
                self.data["torch"]["history_refused"] = "cudaMallocAsync"
            return
        try:
            try:
                record(max_entries=HISTORY_ENTRIES)  # torch >= 2.1
            except TypeError:
                record(True)  # torch 2.0: (enabled, ...)
            with self.lock:
                self.data["torch"]["history"] = True
        except Exception as exc:
            if "cudaMallocAsync" in str(exc) or "Async" in str(exc):
                with self.lock:
                    self.data["torch"]["history_refused"] = "cudaMallocAsync"
                return
            self.error("recording the allocator history", exc)

    def _observer(self, torch: Any) -> Any:
        def on_oom(device: int, requested: int, allocated: int, free: int) -> None:
            history_file = None
            if self.history and self.data["torch"]["history"]:
                history_file = os.path.join(
                    os.path.dirname(os.path.abspath(self.path)),
                    f"allocator-history-{os.getpid()}.pickle",
                )
                try:
                    torch.cuda.memory._dump_snapshot(history_file)
                except Exception as exc:
                    self.error("saving the allocator history", exc)
                    history_file = None
            with self.lock:
                if self.data["oom"] is None:
                    self.data["oom"] = {
                        "device": int(device),
                        "requested_bytes": int(requested),
                        "allocated_bytes": int(allocated),
                        "device_free_bytes": int(free),
                        "history_file": history_file,
                    }
            self.poll_torch()
            self.write()

        return on_oom

    def poll_torch(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or not self.data["torch"]["cuda"]:
            return
        try:
            if not torch.cuda.is_initialized():
                return
        except Exception:
            return
        with self.lock:
            for dev in self.data["torch"]["devices"]:
                i = dev["index"]
                try:
                    # a running max: the per-node peaks reset torch's own counters
                    dev["max_allocated_bytes"] = max(
                        int(dev["max_allocated_bytes"] or 0),
                        int(torch.cuda.max_memory_allocated(i)),
                    )
                    dev["max_reserved_bytes"] = max(
                        int(dev["max_reserved_bytes"] or 0), int(torch.cuda.max_memory_reserved(i))
                    )
                    dev["reserved_bytes"] = int(torch.cuda.memory_reserved(i))
                except Exception as exc:
                    self.error(f"reading device {i} counters", exc)

    # -- the writer thread
    def start(self) -> None:
        thread = threading.Thread(target=self._loop, name="oom-bisect-reporter", daemon=True)
        thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll_torch()
            self.write()

    def final(self, phase: str, exit_code: int | None) -> None:
        self._stop.set()
        self.poll_torch()
        if self.nodes is not None:
            self.nodes.finish()
        with self.lock:
            self.data["phase"] = phase
            self.data["exit_code"] = exit_code
            # what this run imported: the fork server preloads only those (forkclient.py)
            self.data["modules"] = sorted(name for name in list(sys.modules) if name)
        self.write()


#: how often the node sampler reads NVML / the fake GPU / RSS while a node runs
NODE_POLL_S = 0.005
#: the most distinct nodes kept (a huge expanded graph must not grow the report without end)
MAX_NODES = 500


def _vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource  # no /proc: the lifetime peak is the best a sampler can read

        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        return peak if sys.platform == "darwin" else peak * 1024
    except Exception:
        return None


def _reset_hwm() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class NodePeaks:
    """The peak VRAM and RSS of every node ComfyUI executes, from a wrapped ``execute``."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.peaks: dict[str, dict[str, Any]] = {}
        self._nvml: Any = None
        self._nvml_tried = False
        self._fake_gpu = os.environ.get("OOM_SENTINEL_FAKE_GPU") or None
        self._hwm_reset: bool | None = None
        self._active = threading.Event()
        self._stop = threading.Event()
        self._sample_lock = threading.Lock()
        self._vram_sampled: int | None = None
        self._ram_sampled: int | None = None
        self._thread: threading.Thread | None = None
        self._current: Any = None

    def note(self, text: str) -> None:
        with self.reporter.lock:
            notes = self.reporter.data["nodes"]["notes"]
            if text not in notes and len(notes) < 20:
                notes.append(text[:300])

    # -- installing the hook
    def install(self, module: Any) -> None:
        """Wrap ``module.execute`` (ComfyUI's ``execution``) in place; say so if absent."""
        original = getattr(module, "execute", None)
        if not callable(original):
            self.note("no per-node peaks: this ComfyUI's execution module has no execute() to wrap")
            self.reporter.write()
            return
        import inspect

        try:
            params = list(inspect.signature(original).parameters)
        except (TypeError, ValueError):
            params = []
        if len(params) < 4 or params[3] != "current_item":
            self.note(
                "no per-node peaks: execution.execute has an unknown signature "
                f"({', '.join(params[:5]) or '?'})"
            )
            self.reporter.write()
            return
        tracker = self
        if inspect.iscoroutinefunction(original):

            async def execute(*args: Any, **kwargs: Any) -> Any:
                token = tracker.start(args, kwargs)
                try:
                    return await original(*args, **kwargs)
                finally:
                    tracker.end(token)

        else:

            def execute(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                token = tracker.start(args, kwargs)
                try:
                    return original(*args, **kwargs)
                finally:
                    tracker.end(token)

        execute.__wrapped__ = original  # type: ignore[attr-defined]
        module.execute = execute
        with self.reporter.lock:
            self.reporter.data["nodes"]["hook"] = f"{module.__name__}.execute"
        self.reporter.write()

    # -- one node
    @staticmethod
    def _identify(args: Any, kwargs: Any) -> tuple[str, str]:
        node_id = args[3] if len(args) > 3 else kwargs.get("current_item")
        dynprompt = args[1] if len(args) > 1 else kwargs.get("dynprompt")
        class_type = "?"
        try:
            node = dynprompt.get_node(node_id)
            class_type = str(node.get("class_type") or "?")
        except Exception:
            pass
        return str(node_id), class_type

    def _torch_devices(self) -> list[int]:
        torch = sys.modules.get("torch")
        if torch is None or not self.reporter.data["torch"]["cuda"]:
            return []
        try:
            if not torch.cuda.is_initialized():
                return []
        except Exception:
            return []
        return [int(d["index"]) for d in self.reporter.data["torch"]["devices"]]

    def _nvml_handle(self) -> Any:
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:
                self._nvml = None
        return self._nvml

    def _external_vram(self) -> tuple[str | None, int | None]:
        """This process's VRAM use now, from NVML or the fake GPU (None: neither)."""
        nvml = self._nvml_handle()
        if nvml is not None:
            total = 0
            try:
                for i in range(int(nvml.nvmlDeviceGetCount())):
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        if int(proc.pid) == os.getpid() and proc.usedGpuMemory is not None:
                            total += int(proc.usedGpuMemory)
                return "nvml", total
            except Exception:
                return "nvml", None
        if self._fake_gpu:
            path = os.path.join(self._fake_gpu, f"proc-{os.getpid()}.json")
            try:
                with open(path, encoding="utf-8") as fh:
                    data = json.load(fh)
                return "fake-gpu", int(data.get("used_bytes") or 0)
            except (OSError, ValueError, TypeError):
                return "fake-gpu", 0
        return None, None

    def _sampler(self) -> None:
        while not self._stop.is_set():
            if not self._active.wait(0.5):
                continue
            _src, vram = self._external_vram()
            ram = None if self._hwm_reset else _rss_bytes()
            with self._sample_lock:
                if vram is not None:
                    self._vram_sampled = max(self._vram_sampled or 0, vram)
                if ram is not None:
                    self._ram_sampled = max(self._ram_sampled or 0, ram)
            self._stop.wait(NODE_POLL_S)

    def _fold_hwm(self, value: int | None) -> None:
        if value is None:
            return
        with self.reporter.lock:
            ram = self.reporter.data["ram"]
            ram["hwm_bytes"] = max(int(ram["hwm_bytes"] or 0), value)

    def start(self, args: Any, kwargs: Any) -> Any:
        try:
            node_id, class_type = self._identify(args, kwargs)
            devices = self._torch_devices()
            torch = sys.modules.get("torch") if devices else None
            if torch is not None:
                self.reporter.poll_torch()  # keep the whole-run peak before the reset
                for i in devices:
                    torch.cuda.reset_peak_memory_stats(i)
            if self._hwm_reset is None or self._hwm_reset:
                self._fold_hwm(_vm_hwm_bytes())
                self._hwm_reset = _reset_hwm()
            with self._sample_lock:
                self._vram_sampled = None
                self._ram_sampled = None
            src, now = (None, None) if torch is not None else self._external_vram()
            # sample only what has no exact counter: NVML / the fake GPU without torch's,
            # RSS without the VmHWM reset (an idle sampler would wake 200 times a second)
            if (src is not None and now is not None) or not self._hwm_reset:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._sampler, name="oom-bisect-node-sampler", daemon=True
                    )
                    self._thread.start()
                self._active.set()
            token = (node_id, class_type, torch, devices, src, now, _rss_bytes())
            self._current = token
            return token
        except Exception as exc:
            self.reporter.error("per-node peaks (start)", exc)
            return None

    def end(self, token: Any, partial: bool = False) -> None:
        if token is None or token is not self._current:
            return  # already recorded (the stop signal came while it ran)
        self._current = None
        try:
            self._active.clear()
            node_id, class_type, torch, devices, _src, vram_start, ram_start = token
            vram: int | None = None
            source: str | None
            if torch is not None:
                source = "torch"
                vram = sum(int(torch.cuda.max_memory_reserved(i)) for i in devices)
                self.reporter.poll_torch()
            else:
                source, vram_end = self._external_vram()
                with self._sample_lock:
                    sampled = self._vram_sampled
                known = [v for v in (vram_start, vram_end, sampled) if v is not None]
                vram = max(known) if known else None
            if self._hwm_reset:
                ram = _vm_hwm_bytes()
                ram_source = "vmhwm-reset"
                self._fold_hwm(ram)
            else:
                with self._sample_lock:
                    sampled_ram = self._ram_sampled
                known = [v for v in (ram_start, sampled_ram, _rss_bytes()) if v is not None]
                ram = max(known) if known else None
                ram_source = "sampled"
            self._record(node_id, class_type, vram, ram, source, ram_source, partial)
        except Exception as exc:
            self.reporter.error("per-node peaks (end)", exc)

    def _record(
        self,
        node_id: str,
        class_type: str,
        vram: int | None,
        ram: int | None,
        vram_source: str | None,
        ram_source: str,
        partial: bool = False,
    ) -> None:
        with self.reporter.lock:
            nodes = self.reporter.data["nodes"]
            nodes["vram_source"] = vram_source
            nodes["ram_source"] = ram_source
            entry = self.peaks.get(node_id)
            if entry is None:
                if len(self.peaks) >= MAX_NODES:
                    return
                entry = {
                    "node_id": node_id,
                    "class_type": class_type,
                    "peak_vram_bytes": None,
                    "peak_ram_bytes": None,
                    "runs": 0,
                }
                self.peaks[node_id] = entry
                nodes["peaks"].append(entry)
            entry["runs"] += 1
            if partial:  # still running when the harness stopped the server
                entry["partial"] = True
            for key, value in (("peak_vram_bytes", vram), ("peak_ram_bytes", ram)):
                if value is not None:
                    entry[key] = max(int(entry[key] or 0), int(value))
        self.reporter.write()

    def finish(self) -> None:
        """At exit: the high-water mark since the last reset joins the whole-run peak."""
        if self.reporter.data["nodes"]["hook"] is None and not self.reporter.data["nodes"]["notes"]:
            self.note("no per-node peaks: ComfyUI's execution module was never imported")
        current = self._current
        if current is not None:  # the node that was running when the server was stopped
            self.end(current, partial=True)
        if self._hwm_reset:
            self._fold_hwm(_vm_hwm_bytes())
        self._stop.set()
        self._active.set()


class _ImportHook:
    """A meta-path finder that lets ComfyUI import ``name``, then calls ``on_import`` once.

    It hands out the normal spec with the loader's ``exec_module`` wrapped. ``done`` is set
    only when torch really ran: ``importlib.util.find_spec("torch")`` (an availability check
    some code does before importing) also gets a wrapped spec, which is simply never used.
    """

    def __init__(self, name: str, on_import: Any) -> None:
        self.name = name
        self.on_import = on_import
        self.busy = False
        self.done = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.busy or self.done:
            return None
        self.busy = True
        try:
            import importlib.util

            spec = importlib.util.find_spec(self.name)
        except Exception:
            spec = None
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        original = loader.exec_module
        hook = self

        def exec_module(module: Any) -> None:
            original(module)
            with contextlib.suppress(Exception):
                loader.exec_module = original  # type: ignore[method-assign]
            if not hook.done:
                hook.done = True
                hook.on_import(module)

        try:
            loader.exec_module = exec_module  # type: ignore[method-assign]
        except Exception:
            return None
        return spec


def _parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"result": None, "budget": None, "history": True}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest = argv[i + 1 :]
            if not rest:
                break
            opts["main"] = rest[0]
            opts["args"] = rest[1:]
            return opts
        if word == "--result" and i + 1 < len(argv):
            opts["result"] = argv[i + 1]
            i += 2
        elif word == "--vram-budget-bytes" and i + 1 < len(argv):
            opts["budget"] = int(argv[i + 1])
            i += 2
        elif word == "--no-history":
            opts["history"] = False
            i += 1
        else:
            break
    sys.stderr.write(
        "usage: oom_bisect_bootstrap.py --result FILE [--vram-budget-bytes N] [--no-history] "
        "-- MAIN_PY [ARGS...]\n"
    )
    raise SystemExit(2)


def main(argv: list[str]) -> int:
    opts = _parse(argv)
    if not opts["result"]:
        sys.stderr.write("oom_bisect_bootstrap.py: --result is required\n")
        return 2
    reporter = Reporter(opts["result"], opts["budget"], opts["history"])
    reporter.write()
    sys.meta_path.insert(0, _ImportHook("torch", reporter.torch_imported))
    if "torch" in sys.modules:  # preloaded by the fork server (forkserver.py): CUDA is not up
        reporter.torch_imported(sys.modules["torch"])
    nodes = NodePeaks(reporter)
    reporter.nodes = nodes
    sys.meta_path.insert(0, _ImportHook("execution", nodes.install))

    def on_term(signum: int, frame: Any) -> None:
        # The harness stops the server with SIGTERM; report the final peaks and leave at once
        # (ComfyUI's own clean-up is of no use to a throwaway instance).
        reporter.final("terminated", 128 + signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    main_py = os.path.abspath(opts["main"])
    sys.argv = [main_py, *opts["args"]]
    sys.path.insert(0, os.path.dirname(main_py))
    with reporter.lock:
        reporter.data["phase"] = "running"
    reporter.write()
    reporter.start()
    code: int | None = 0
    try:
        runpy.run_path(main_py, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        reporter.final("exited", code)
        raise
    except BaseException:
        reporter.final("exited", 1)
        raise
    reporter.final("exited", code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

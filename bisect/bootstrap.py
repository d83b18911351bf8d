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
               "errors": [str]},
     "oom": {"device": i, "requested_bytes": n, "device_free_bytes": n,
             "allocated_bytes": n, "history_file": path|null} | null,
     "exit_code": int|null, "modules": [every module imported, at the end]}

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
                "errors": [],
            },
            "oom": None,
            "exit_code": None,
        }
        self._last = ""
        self._stop = threading.Event()

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
        try:
            try:
                record(max_entries=HISTORY_ENTRIES)  # torch >= 2.1
            except TypeError:
                record(True)  # torch 2.0: (enabled, ...)
            with self.lock:
                self.data["torch"]["history"] = True
        except Exception as exc:
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
                    dev["max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(i))
                    dev["max_reserved_bytes"] = int(torch.cuda.max_memory_reserved(i))
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
        with self.lock:
            self.data["phase"] = phase
            self.data["exit_code"] = exit_code
            # what this run imported: the fork server preloads only those (forkclient.py)
            self.data["modules"] = sorted(name for name in list(sys.modules) if name)
        self.write()


class _TorchHook:
    """A meta-path finder that lets ComfyUI import torch, then calls ``on_import`` once.

    It hands out the normal spec with the loader's ``exec_module`` wrapped. ``done`` is set
    only when torch really ran: ``importlib.util.find_spec("torch")`` (an availability check
    some code does before importing) also gets a wrapped spec, which is simply never used.
    """

    def __init__(self, on_import: Any) -> None:
        self.on_import = on_import
        self.busy = False
        self.done = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch" or self.busy or self.done:
            return None
        self.busy = True
        try:
            import importlib.util

            spec = importlib.util.find_spec("torch")
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
    sys.meta_path.insert(0, _TorchHook(reporter.torch_imported))
    if "torch" in sys.modules:  # preloaded by the fork server (forkserver.py): CUDA is not up
        reporter.torch_imported(sys.modules["torch"])

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

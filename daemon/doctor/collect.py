"""Gather what ``oom-sentinel doctor`` looks at, each source on its own clock.

The doctor is run when something is already wrong, so no source may take it down: a hung NVML
call, an ``import torch`` that blocks on a broken driver, an unreadable process table or a
corrupt snapshot each become "unknown" with the reason, and the other checks still run. Every
source runs in its own daemon thread with a timeout (a hung C call cannot be interrupted, but it
no longer holds up the report or the exit); the torch probe runs in ComfyUI's own interpreter
through ``interpreter.run_interpreter``, which kills its whole process group on timeout.

Torch is never imported here. The probe script sets the device selection ComfyUI runs with
(``CUDA_VISIBLE_DEVICES`` from ``--cuda-device`` / ``--default-device`` / its environment), the
way ComfyUI's ``main.py`` does before it imports torch, and asks CUDA for real (the
``PYTORCH_NVML_BASED_CUDA_CHECK`` shortcut the install-state probe uses is turned off, because
ComfyUI does not use it). ``torch.cuda.mem_get_info()`` needs a CUDA context, so the probe
briefly holds one (a few hundred MiB) on the GPU ComfyUI uses.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from oom_sentinel.config.settings import InstanceSettings, Settings
from oom_sentinel.daemon.comfy.discovery import (
    DiscoveredInstance,
    describe_install,
    discover_instances,
)
from oom_sentinel.daemon.comfy.interpreter import (
    DEFAULT_TIMEOUT_S,
    find_interpreter,
    run_interpreter,
)
from oom_sentinel.daemon.comfy.processes import ComfyProcess, find_comfy_processes, process_for
from oom_sentinel.daemon.core.errors import ConfigError, InputError, SentinelError
from oom_sentinel.daemon.doctor.checks import (
    INCIDENTS_SHOWN,
    DoctorFacts,
    GpuState,
    IncidentFacts,
    SystemStats,
    TorchDevice,
    TorchProbe,
    comfy_visible_devices,
)
from oom_sentinel.daemon.incidents.snapshot import (
    load_snapshot,
    parse_iso_utc,
    snapshot_dirs,
    snapshots_dir,
)

__all__ = [
    "TORCH_PROBE_MARKER",
    "TORCH_PROBE_SCRIPT",
    "DoctorOptions",
    "collect_facts",
    "fetch_system_stats",
    "parse_system_stats",
    "parse_torch_probe",
    "probe_torch",
    "read_incidents",
    "resolve_target",
]

T = TypeVar("T")

#: the torch probe prints its facts on lines with this prefix (the last one wins); anything
#: else on stdout (a sitecustomize banner, a warning) is ignored
TORCH_PROBE_MARKER = "OOM_SENTINEL_DOCTOR "

#: seconds for the sources other than torch (NVML, psutil, HTTP, the snapshots folder)
SOURCE_TIMEOUT_S = 10.0
SYSTEM_STATS_TIMEOUT_S = 3.0
#: snapshot directories read at most when looking for the instance's last incidents (the
#: retention default keeps 500)
MAX_SNAPSHOTS_SCANNED = 500

# Runs inside ComfyUI's interpreter (any Python >= 3.8) with one JSON argument:
# {"apply": bool, "visible": str | null, "hip": bool}. It never raises: each step is guarded,
# and the facts so far are printed before each step (with "stage" naming the step about to
# run), so a crash or a hang inside CUDA still tells what was learnt and where it stopped.
TORCH_PROBE_SCRIPT = r"""
import json, os, platform, sys, warnings
cfg = {}
try:
    cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
except Exception:
    cfg = {}
os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
if cfg.get("apply"):
    names = ["CUDA_VISIBLE_DEVICES"] + (["HIP_VISIBLE_DEVICES"] if cfg.get("hip") else [])
    for name in names:
        if cfg.get("visible") is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(cfg["visible"])
out = {"stage": "import", "python_version": platform.python_version(),
       "executable": sys.executable, "torch_version": None, "cuda_version": None,
       "hip_version": None, "cuda_built": None, "cuda_available": None, "device_count": None,
       "current_device": None, "devices": [], "mem_free_bytes": None, "mem_total_bytes": None,
       "allocated_bytes": None, "reserved_bytes": None, "summary_header": [],
       "mps_built": None, "mps_available": None, "xpu_available": None,
       "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "warnings": [],
       "import_error": None, "errors": {}}
def emit(stage):
    out["stage"] = stage
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()
def err(step, exc):
    out["errors"][step] = ("%s: %s" % (type(exc).__name__, exc)).strip()
def keep(caught):
    for w in caught:
        text = str(w.message).strip()
        if text and ("CUDA" in text or "NVIDIA" in text or "driver" in text or "HIP" in text):
            if text not in out["warnings"]:
                out["warnings"].append(text[:500])
emit("import")
torch = None
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
    keep(caught)
except BaseException as exc:
    out["import_error"] = ("%s: %s" % (type(exc).__name__, exc)).strip()[:800]
if torch is not None:
    out["torch_version"] = str(getattr(torch, "__version__", None))
    out["cuda_version"] = getattr(torch.version, "cuda", None)
    out["hip_version"] = getattr(torch.version, "hip", None)
    try:
        out["cuda_built"] = bool(torch.backends.cuda.is_built())
    except Exception as exc:
        err("cuda_built", exc)
    emit("cuda")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["cuda_available"] = bool(torch.cuda.is_available())
            out["device_count"] = int(torch.cuda.device_count())
        keep(caught)
    except Exception as exc:
        err("cuda", exc)
    if out["cuda_available"]:
        emit("devices")
        try:
            out["current_device"] = int(torch.cuda.current_device())
            for i in range(out["device_count"] or 0):
                p = torch.cuda.get_device_properties(i)
                uuid = getattr(p, "uuid", None)
                out["devices"].append({
                    "index": i, "name": str(p.name), "total_bytes": int(p.total_memory),
                    "uuid": str(uuid) if uuid is not None else None,
                    "capability": "%s.%s" % (p.major, p.minor)})
        except Exception as exc:
            err("devices", exc)
        emit("mem_get_info")
        try:
            free, total = torch.cuda.mem_get_info()
            out["mem_free_bytes"], out["mem_total_bytes"] = int(free), int(total)
        except Exception as exc:
            err("mem_get_info", exc)
        emit("memory_summary")
        try:
            out["allocated_bytes"] = int(torch.cuda.memory_allocated())
            out["reserved_bytes"] = int(torch.cuda.memory_reserved())
            text = torch.cuda.memory_summary(abbreviated=True)
            out["summary_header"] = [l.rstrip() for l in text.splitlines() if l.strip()][:10]
        except Exception as exc:
            err("memory_summary", exc)
    emit("mps")
    try:
        mps = getattr(torch.backends, "mps", None)
        if mps is not None:
            out["mps_built"] = bool(mps.is_built())
            out["mps_available"] = bool(mps.is_available())
    except Exception as exc:
        err("mps", exc)
    try:
        xpu = getattr(torch, "xpu", None)
        if xpu is not None:
            out["xpu_available"] = bool(xpu.is_available())
    except Exception as exc:
        err("xpu", exc)
emit("done")
""".replace("MARKER", repr(TORCH_PROBE_MARKER))


# -- pure parsing ---------------------------------------------------------------------------------


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _opt_str(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def parse_torch_probe(stdout: str, executable: str) -> tuple[TorchProbe | None, str | None]:
    """``(facts, stage it stopped in)`` from the probe's stdout: the last marker line wins;
    the stage is ``"done"`` for a complete run. ``(None, None)`` when no line was printed."""
    payload: Any = None
    for line in reversed(stdout.splitlines()):
        if line.startswith(TORCH_PROBE_MARKER):
            try:
                payload = json.loads(line[len(TORCH_PROBE_MARKER) :])
            except ValueError:
                continue
            break
    if not isinstance(payload, dict):
        return None, None
    devices: list[TorchDevice] = []
    for raw in payload.get("devices") or ():
        if isinstance(raw, Mapping):
            devices.append(
                TorchDevice(
                    index=_index
                    if (_index := _opt_int(raw.get("index"))) is not None
                    else len(devices),
                    name=_opt_str(raw.get("name")),
                    total_bytes=_opt_int(raw.get("total_bytes")),
                    uuid=_opt_str(raw.get("uuid")),
                    capability=_opt_str(raw.get("capability")),
                )
            )
    errors = payload.get("errors")
    warnings = payload.get("warnings")
    header = payload.get("summary_header")
    probe = TorchProbe(
        executable=executable,
        python_version=_opt_str(payload.get("python_version")),
        torch_version=_opt_str(payload.get("torch_version")),
        cuda_version=_opt_str(payload.get("cuda_version")),
        hip_version=_opt_str(payload.get("hip_version")),
        cuda_built=_opt_bool(payload.get("cuda_built")),
        cuda_available=_opt_bool(payload.get("cuda_available")),
        device_count=_opt_int(payload.get("device_count")),
        current_device=_opt_int(payload.get("current_device")),
        devices=tuple(devices),
        mem_free_bytes=_opt_int(payload.get("mem_free_bytes")),
        mem_total_bytes=_opt_int(payload.get("mem_total_bytes")),
        allocated_bytes=_opt_int(payload.get("allocated_bytes")),
        reserved_bytes=_opt_int(payload.get("reserved_bytes")),
        summary_header=tuple(str(x) for x in header) if isinstance(header, list) else (),
        mps_built=_opt_bool(payload.get("mps_built")),
        mps_available=_opt_bool(payload.get("mps_available")),
        xpu_available=_opt_bool(payload.get("xpu_available")),
        cuda_visible_devices=payload.get("cuda_visible_devices")
        if isinstance(payload.get("cuda_visible_devices"), str)
        else None,
        warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else (),
        import_error=_opt_str(payload.get("import_error")),
        errors=tuple((str(k), str(v)) for k, v in errors.items())
        if isinstance(errors, dict)
        else (),
    )
    stage = payload.get("stage")
    return probe, stage if isinstance(stage, str) else None


def parse_system_stats(data: Any, url: str) -> SystemStats:
    """``/system_stats`` JSON (comfyui-facts §1.6) → record; missing fields are ``None``."""
    system = data.get("system") if isinstance(data, Mapping) else None
    system = system if isinstance(system, Mapping) else {}
    devices = data.get("devices") if isinstance(data, Mapping) else None
    first = devices[0] if isinstance(devices, list) and devices else {}
    first = first if isinstance(first, Mapping) else {}
    argv = system.get("argv")
    return SystemStats(
        url=url,
        comfyui_version=_opt_str(system.get("comfyui_version")),
        pytorch_version=_opt_str(system.get("pytorch_version")),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
        device_name=_opt_str(first.get("name")),
        device_type=_opt_str(first.get("type")),
        device_index=_opt_int(first.get("index")),
        vram_total_bytes=_opt_int(first.get("vram_total")),
        vram_free_bytes=_opt_int(first.get("vram_free")),
        embedded_python=_opt_bool(system.get("embedded_python")),
    )


# -- the sources -----------------------------------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def probe_torch(
    python: str | os.PathLike[str],
    *,
    visible: str | None,
    apply_visible: bool = True,
    hip: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[TorchProbe | None, str | None]:
    """Run the torch probe in ``python``; ``(facts, None)``, or ``(None, why)`` when nothing
    was learnt. A run that died or timed out part-way keeps what it printed, with the step it
    stopped in recorded as an error (an ``import torch`` that never returns is reported as
    the import error it is)."""
    exe = os.fspath(python)
    arg = json.dumps({"apply": apply_visible, "visible": visible, "hip": hip})
    run = run_interpreter(exe, ["-c", TORCH_PROBE_SCRIPT, arg], timeout_s=timeout_s)
    probe, stage = parse_torch_probe(run.stdout, exe)
    if run.timed_out:
        ending = f"did not finish within {timeout_s:g} s and was killed"
    elif run.returncode != 0:
        ending = f"exited with status {run.returncode}"
        tail = _last_line(run.stderr)
        if tail:
            ending += f" ({tail})"
    else:
        ending = ""
    if probe is None:
        return None, f"{exe}: the torch probe {ending or 'printed nothing'}"
    if stage == "done" and not ending:
        return probe, None
    step = stage or "unknown"
    text = f"the probe {ending or 'stopped'} during this step"
    if step == "import":
        return replace(probe, import_error=f"`import torch` {ending or 'did not finish'}"), None
    return replace(probe, errors=(*probe.errors, (step, text))), None


def fetch_system_stats(url: str, timeout_s: float = SYSTEM_STATS_TIMEOUT_S) -> SystemStats:
    """``GET <url>/system_stats`` from a running ComfyUI; raises ``OSError``/``ValueError``."""
    target = url.rstrip("/") + "/system_stats"
    request = urllib.request.Request(target, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        data = json.loads(response.read(1_000_000).decode("utf-8", "replace"))
    return parse_system_stats(data, url.rstrip("/"))


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(os.path.abspath(path)))


def read_incidents(
    data_dir: Path, target: DiscoveredInstance | None, *, limit: int = INCIDENTS_SHOWN
) -> tuple[tuple[IncidentFacts, ...], int]:
    """The newest ``limit`` snapshots of ``target`` (all when ``None``) and how many there are.

    A snapshot belongs to the target when its recorded install path is the target's (or, for
    a snapshot without a path, its instance name is). Unreadable snapshots are skipped."""
    found: list[IncidentFacts] = []
    total = 0
    dirs = list(reversed(snapshot_dirs(snapshots_dir(data_dir))))[:MAX_SNAPSHOTS_SCANNED]
    for directory in dirs:
        try:
            snap = load_snapshot(directory, validate=False)
        except InputError:
            continue
        head = snap.head
        if target is not None:
            path = head.instance.path
            if path and target.path:
                if _norm(path) != _norm(target.path):
                    continue
            elif head.instance.name != target.name:
                continue
        total += 1
        if len(found) >= limit:
            continue
        count = head.incident.count if head.incident is not None else None
        found.append(
            IncidentFacts(
                id=snap.id,
                created_s=parse_iso_utc(snap.created),
                instance=head.instance.name,
                pool=head.event.pool,
                node_type=head.event.node_type,
                count=count if count is not None and count > 0 else 1,
                summary=snap.summary,
                regression_suspected=head.regression is not None and head.regression.suspected,
            )
        )
    return tuple(found), total


# -- which ComfyUI ----------------------------------------------------------------------------------


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _url_port(url: str) -> tuple[str, int | None]:
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return host, port


def _from_target(
    target: str, processes: Sequence[ComfyProcess], *, name: str = "", what: str
) -> tuple[DiscoveredInstance, ComfyProcess | None]:
    if _is_url(target):
        url = target.rstrip("/")
        proc = process_for(processes, url=url)
        if proc is not None:
            found = describe_install(proc.install_dir, proc, source="cli", name=name)
            return found, proc
        host, port = _url_port(url)
        return (
            DiscoveredInstance(
                name=name or f"{host}:{port}",
                path="",
                url=url,
                log_paths=(),
                pid=None,
                python=None,
                flags=None,
                source="cli",
            ),
            None,
        )
    path = Path(target).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{what} {target}: not a directory or an http URL")
    proc = process_for(processes, path=str(path))
    return describe_install(path, proc, source="cli", name=name), proc


def resolve_target(
    *,
    instance: str | None,
    comfyui: str | None,
    configured: Sequence[InstanceSettings],
    discovered: Sequence[DiscoveredInstance],
    processes: Sequence[ComfyProcess],
) -> tuple[DiscoveredInstance | None, ComfyProcess | None]:
    """The ComfyUI to diagnose and its running process.

    ``--comfyui PATH|URL`` wins; then an ``INSTANCE`` name (discovered, else configured; a
    folder is accepted too); else the first configured instance; else the first discovered
    (running ones come first). Raises ``ConfigError`` for a name nobody knows."""
    by_pid = {p.pid: p for p in processes}
    if comfyui:
        return _from_target(comfyui, processes, what="--comfyui")
    if instance:
        for found in discovered:
            if found.name == instance:
                return found, by_pid.get(found.pid) if found.pid is not None else None
        for cfg in configured:
            if cfg.name == instance:
                return _configured(cfg, processes)
        if Path(instance).expanduser().is_dir() or _is_url(instance):
            return _from_target(instance, processes, what="INSTANCE")
        names = [d.name for d in discovered] + [c.name for c in configured if c.name]
        known = ", ".join(dict.fromkeys(names)) or "none found"
        raise ConfigError(
            f"no ComfyUI instance named {instance!r} (known: {known}); "
            "or name one with --comfyui PATH|URL"
        )
    if configured:
        return _configured(configured[0], processes)
    if discovered:
        first = discovered[0]
        return first, by_pid.get(first.pid) if first.pid is not None else None
    return None, None


def _configured(
    cfg: InstanceSettings, processes: Sequence[ComfyProcess]
) -> tuple[DiscoveredInstance, ComfyProcess | None]:
    if cfg.path:
        found, proc = _from_target(
            str(Path(cfg.path).expanduser()), processes, name=cfg.name, what="instance path"
        )
    else:
        url = cfg.url or f"http://127.0.0.1:{cfg.port or 8188}"
        found, proc = _from_target(url, processes, name=cfg.name, what="instance url")
    if cfg.url and found.url != cfg.url:
        found = replace(found, url=cfg.url.rstrip("/"))
    return found, proc


# -- gathering -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoctorOptions:
    """What the command line asked for."""

    instance: str | None = None
    comfyui: str | None = None
    python: str | None = None
    #: for the torch probe (``import torch`` cold on Windows takes 20-30 s)
    timeout_s: float = DEFAULT_TIMEOUT_S
    data_dir: Path | None = None
    settings: Settings = field(default_factory=Settings)
    environ: Mapping[str, str] | None = None
    #: skip the torch probe (``--no-torch``)
    torch: bool = True


def _in_thread(
    name: str, func: Callable[[], T], timeout_s: float, unknown: dict[str, str]
) -> Callable[[], T | None]:
    """Start ``func`` in a daemon thread; the returned callable waits for it (up to the
    timeout) and gives its value, or ``None`` with the reason recorded under ``name``."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = func()
        except Exception as exc:
            box["error"] = (
                str(exc) if isinstance(exc, SentinelError) else f"{type(exc).__name__}: {exc}"
            )

    thread = threading.Thread(target=body, name=f"doctor-{name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s

    def wait() -> T | None:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            unknown[name] = f"no answer within {timeout_s:g} s"
            return None
        if "error" in box:
            unknown[name] = box["error"]
            return None
        return box.get("value")

    return wait


def _gpu_state(options: DoctorOptions, environ: Mapping[str, str]) -> GpuState:
    from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe
    from oom_sentinel.daemon.probes.nvml import NvmlGpuProbe

    choice = select_gpu_probe(options.settings.gpu, environ)
    try:
        devices = choice.probe.devices()
        processes = choice.probe.processes()
        driver = None
        if isinstance(choice.probe, NvmlGpuProbe):
            driver = choice.probe.status().driver_version
        return GpuState(choice.backend, choice.detail, devices, processes, driver)
    finally:
        choice.probe.close()


def _choose_python(
    options: DoctorOptions, target: DiscoveredInstance | None, proc: ComfyProcess | None
) -> tuple[str | None, str | None, str | None]:
    """``(interpreter, how it was chosen, why none)``."""
    if options.python:
        path = Path(options.python).expanduser()
        if not path.exists():
            raise ConfigError(f"--python {options.python}: no such file")
        return str(path), "--python", None
    if proc is not None and os.path.exists(proc.interpreter):
        return proc.interpreter, "process", None
    if target is not None:
        if target.python and os.path.exists(target.python):
            return target.python, "install", None
        for root in (target.path, target.code_dir):
            if root:
                found = find_interpreter(root)
                if found is not None:
                    return str(found), "install", None
        where = target.path or target.url
        return None, None, f"no interpreter found for {where} (no venv or python_embeded)"
    return None, None, "no ComfyUI install was found or named"


def collect_facts(options: DoctorOptions) -> DoctorFacts:
    """Gather every source the checks use. Raises only ``ConfigError`` for what the user
    named wrongly (an unknown instance, a missing --python); everything else that fails is
    recorded in ``DoctorFacts.unknown``."""
    environ = os.environ if options.environ is None else options.environ
    unknown: dict[str, str] = {}
    now_s = time.time()

    processes = _in_thread("processes", find_comfy_processes, SOURCE_TIMEOUT_S, unknown)()
    procs = tuple(processes) if processes is not None else ()
    home = environ.get("HOME") or environ.get("USERPROFILE") or str(Path.home())
    discovered: tuple[DiscoveredInstance, ...] = ()
    if options.settings.discovery.enabled or options.instance:
        try:
            discovered = discover_instances(home=home, environ=environ, processes=procs)
        except Exception as exc:  # best effort: a name can still come from the config
            unknown["discovery"] = f"{type(exc).__name__}: {exc}"
    target, proc = resolve_target(
        instance=options.instance,
        comfyui=options.comfyui,
        configured=options.settings.instances,
        discovered=discovered,
        processes=procs,
    )
    python, python_source, no_python = _choose_python(options, target, proc)

    from oom_sentinel.daemon.probes.host import PsutilHostProbe

    host_probe = PsutilHostProbe()
    own: set[int] = set()
    if proc is not None:
        own = {proc.pid, *host_probe.descendants(proc.pid)}

    wait_gpu = _in_thread("gpu", lambda: _gpu_state(options, environ), SOURCE_TIMEOUT_S, unknown)
    wait_host = _in_thread("host", host_probe.host, SOURCE_TIMEOUT_S, unknown)
    wait_rss = (
        _in_thread("rss", lambda: host_probe.process_tree(proc.pid), SOURCE_TIMEOUT_S, unknown)
        if proc is not None
        else None
    )

    wait_torch = None
    if not options.torch:
        unknown["torch"] = "skipped (--no-torch)"
    elif python is None:
        unknown["torch"] = no_python or "no interpreter"
    else:
        if proc is not None:
            inherited = proc.cuda_visible_devices if proc.environ_readable else None
        else:
            inherited = environ.get("CUDA_VISIBLE_DEVICES")
        flags = proc.flags if proc is not None else None
        visible = comfy_visible_devices(flags, inherited)
        sets_it = flags is not None and (
            flags.cuda_device not in (None, "all") or flags.default_device is not None
        )
        exe = python
        wait_torch = _in_thread(
            "torch",
            lambda: probe_torch(exe, visible=visible, hip=sets_it, timeout_s=options.timeout_s),
            options.timeout_s + SOURCE_TIMEOUT_S,
            unknown,
        )

    wait_stats = None
    explicit_url = bool(options.comfyui and _is_url(options.comfyui))
    if target is not None and target.url and (proc is not None or explicit_url or not target.path):
        url = target.url
        wait_stats = _in_thread(
            "system_stats", lambda: fetch_system_stats(url), SOURCE_TIMEOUT_S, unknown
        )

    data_dir = options.data_dir or options.settings.resolved_data_dir()
    incidents: tuple[IncidentFacts, ...] | None = None
    incident_total: int | None = None
    if not data_dir.is_dir():
        unknown["incidents"] = (
            f"no data directory at {data_dir}: the watchdog has not recorded anything here"
        )
    else:
        got = _in_thread(
            "incidents", lambda: read_incidents(data_dir, target), SOURCE_TIMEOUT_S, unknown
        )()
        if got is not None:
            incidents, incident_total = got

    gpu = wait_gpu()
    host = wait_host()
    tree = wait_rss() if wait_rss is not None else None
    torch: TorchProbe | None = None
    if wait_torch is not None:
        result = wait_torch()
        if result is not None:
            torch, why = result
            if torch is None and why:
                unknown["torch"] = why
    stats = wait_stats() if wait_stats is not None else None
    if proc is None and stats is None:
        unknown.setdefault(
            "flags",
            "ComfyUI is not running (or not visible to this user), so its launch flags are not "
            "known",
        )
    return DoctorFacts(
        now_s=now_s,
        platform=sys.platform,
        target=target,
        process=proc,
        comfy_processes=tuple(processes) if processes is not None else None,
        own_pids=frozenset(own),
        gpu=gpu,
        host=host,
        comfy_rss_bytes=tree.rss_bytes if tree is not None else None,
        python=python,
        python_source=python_source,
        torch=torch,
        system_stats=stats,
        incidents=incidents,
        incident_total=incident_total,
        data_dir=str(data_dir),
        doctor_cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        unknown=unknown,
    )

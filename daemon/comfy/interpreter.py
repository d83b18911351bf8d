"""Ask ComfyUI's own Python what it has installed, without ever importing torch here.

The daemon must stay small and must not hold a CUDA context, so torch, CUDA, cuDNN and driver
facts come from a short script run in ComfyUI's interpreter (its venv, the Windows portable
``python_embeded``, or a path the user gives) under a timeout. A hung interpreter (a broken
driver can make ``import torch`` block) is killed with its whole process group.

The script's output is parsed by pure functions (``parse_facts_output``, ``parse_freeze``), so
the torch-present path is testable from canned output as well as from a real interpreter.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from oom_sentinel.daemon.core.errors import ProbeError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "FACTS_MARKER",
    "FACTS_SCRIPT",
    "GpuFacts",
    "InterpreterFacts",
    "InterpreterRun",
    "find_interpreter",
    "interpreter_candidates",
    "parse_facts_output",
    "parse_freeze",
    "probe_interpreter",
    "redact_url_credentials",
    "run_interpreter",
]

#: ``import torch`` cold on Windows with a large CUDA build takes 20-30 s; pip freeze of a
#: ComfyUI venv with ~300 distributions about 1-2 s. One minute covers both with margin.
DEFAULT_TIMEOUT_S = 60.0

#: The facts script prints one line with this prefix; anything else on stdout (a
#: sitecustomize banner, a custom node's print at import) is ignored.
FACTS_MARKER = "OOM_SENTINEL_FACTS "

# Runs inside ComfyUI's interpreter (any Python >= 3.8). It must never raise: every probe is
# guarded and reports what it could not learn as null. It does not touch the GPU beyond what
# torch.cuda.get_device_properties needs (no allocation, no context on the device), and the
# parent sets PYTORCH_NVML_BASED_CUDA_CHECK=1 so is_available() asks NVML instead of
# initialising CUDA.
FACTS_SCRIPT = r"""
import json, os, platform, subprocess, sys
out = {"python_version": platform.python_version(), "executable": sys.executable,
       "torch_version": None, "cuda_version": None, "hip_version": None,
       "cudnn_version": None, "cuda_available": None, "driver_version": None,
       "xpu_available": None, "mps_available": None, "other_backends": None,
       "gpus": [], "torch_error": None, "distributions": []}
try:
    try:
        from importlib import metadata as _md
    except ImportError:
        _md = None
    if _md is not None:
        seen = set()
        for dist in _md.distributions():
            name = dist.metadata["Name"]
            if not name or name.lower() in seen:
                continue
            seen.add(name.lower())
            direct = None
            try:
                text = dist.read_text("direct_url.json")
                direct = json.loads(text) if text else None
            except Exception:
                direct = None
            line = "%s==%s" % (name, dist.version)
            if isinstance(direct, dict) and direct.get("url"):
                url = direct["url"]
                vcs = direct.get("vcs_info") or {}
                if (direct.get("dir_info") or {}).get("editable"):
                    line = "-e " + url
                elif vcs.get("vcs") and vcs.get("commit_id"):
                    line = "%s @ %s+%s@%s" % (name, vcs["vcs"], url, vcs["commit_id"])
                else:
                    line = "%s @ %s" % (name, url)
            out["distributions"].append(line)
except Exception as exc:
    out["distributions_error"] = repr(exc)
try:
    import torch
    out["torch_version"] = str(torch.__version__)
    out["cuda_version"] = getattr(torch.version, "cuda", None)
    out["hip_version"] = getattr(torch.version, "hip", None)
    try:
        v = torch.backends.cudnn.version()
        out["cudnn_version"] = None if v is None else str(v)
    except Exception:
        pass
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                out["gpus"].append({"index": i, "name": p.name,
                                    "total_memory_bytes": int(p.total_memory)})
    except Exception as exc:
        out["torch_error"] = "cuda: %r" % (exc,)
    try:
        xpu = getattr(torch, "xpu", None)
        out["xpu_available"] = bool(xpu.is_available()) if xpu is not None else False
    except Exception:
        pass
    try:
        out["mps_available"] = bool(torch.backends.mps.is_available())
    except Exception:
        pass
    try:
        import importlib.util as _iu
        out["other_backends"] = [m for m in ("torch_directml", "torch_npu", "torch_mlu")
                                 if _iu.find_spec(m) is not None]
    except Exception:
        pass
except Exception as exc:
    out["torch_error"] = "import torch: %r" % (exc,)
try:
    import pynvml
    pynvml.nvmlInit()
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        out["driver_version"] = v.decode() if isinstance(v, bytes) else str(v)
    finally:
        pynvml.nvmlShutdown()
except Exception:
    pass
if out["driver_version"] is None:
    try:
        with open("/proc/driver/nvidia/version") as fh:
            head = fh.readline()
        import re
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", head)
        if m:
            out["driver_version"] = m.group(1)
    except Exception:
        pass
if out["driver_version"] is None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            out["driver_version"] = r.stdout.strip().splitlines()[0].strip()
    except Exception:
        pass
sys.stdout.write("\n" + %(marker)r + json.dumps(out) + "\n")
sys.stdout.flush()
""".replace("%(marker)r", repr(FACTS_MARKER))


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One device as torch in ComfyUI's interpreter sees it."""

    index: int
    name: str | None
    total_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class InterpreterFacts:
    """What ComfyUI's interpreter reported; ``None`` where it could not tell (torch absent,
    no NVIDIA driver, a failed probe). ``error`` says why the probe failed as a whole."""

    executable: str
    python_version: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    hip_version: str | None = None
    cudnn_version: str | None = None
    driver_version: str | None = None
    cuda_available: bool | None = None
    gpus: tuple[GpuFacts, ...] = ()
    torch_error: str | None = None
    error: str | None = None
    #: Intel XPU and Apple MPS backends (None: not asked, or torch absent)
    xpu_available: bool | None = None
    mps_available: bool | None = None
    #: installed device plug-ins ComfyUI can use (torch_directml, torch_npu, torch_mlu)
    other_backends: tuple[str, ...] = ()

    def has_accelerator(self) -> bool | None:
        """Whether torch sees any device ComfyUI can run on besides the CPU (CUDA, which
        ROCm builds answer too, XPU, MPS, or a DirectML/NPU/MLU plug-in that is installed);
        None when it cannot tell (no torch, a failed probe)."""
        if self.error is not None or self.torch_version is None:
            return None
        answers = (self.cuda_available, self.xpu_available, self.mps_available)
        if any(a is True for a in answers) or self.other_backends:
            return True
        return False if self.cuda_available is False else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "executable": self.executable,
            "python_version": self.python_version,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "hip_version": self.hip_version,
            "cudnn_version": self.cudnn_version,
            "driver_version": self.driver_version,
            "cuda_available": self.cuda_available,
            "gpus": [
                {"index": g.index, "name": g.name, "total_memory_bytes": g.total_memory_bytes}
                for g in self.gpus
            ],
            "torch_error": self.torch_error,
            "error": self.error,
            "xpu_available": self.xpu_available,
            "mps_available": self.mps_available,
            "other_backends": list(self.other_backends),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InterpreterFacts:
        """Rebuild from ``to_dict`` output or the facts script's JSON; unknown keys ignored."""
        gpus: list[GpuFacts] = []
        for raw in data.get("gpus") or ():
            if isinstance(raw, Mapping):
                gpus.append(
                    GpuFacts(
                        index=_int_or(raw.get("index"), len(gpus)),
                        name=_str_or_none(raw.get("name")),
                        total_memory_bytes=_int_or(raw.get("total_memory_bytes"), None),
                    )
                )
        cuda_available = data.get("cuda_available")

        def flag(key: str) -> bool | None:
            value = data.get(key)
            return value if isinstance(value, bool) else None

        return cls(
            executable=str(data.get("executable") or ""),
            python_version=_str_or_none(data.get("python_version")),
            torch_version=_str_or_none(data.get("torch_version")),
            cuda_version=_str_or_none(data.get("cuda_version")),
            hip_version=_str_or_none(data.get("hip_version")),
            cudnn_version=_str_or_none(data.get("cudnn_version")),
            driver_version=_str_or_none(data.get("driver_version")),
            cuda_available=cuda_available if isinstance(cuda_available, bool) else None,
            gpus=tuple(gpus),
            torch_error=_str_or_none(data.get("torch_error")),
            error=_str_or_none(data.get("error")),
            xpu_available=flag("xpu_available"),
            mps_available=flag("mps_available"),
            other_backends=tuple(
                str(b) for b in (data.get("other_backends") or ()) if isinstance(b, str)
            ),
        )


@dataclass(frozen=True, slots=True)
class InterpreterRun:
    """The outcome of one run of the interpreter."""

    returncode: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    timed_out: bool


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _int_or(value: Any, default: int | None) -> Any:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


# ---------------------------------------------------------------------------------------------
# Pure parsing


def _facts_payload(stdout: str) -> dict[str, Any] | None:
    """The JSON object on the facts script's last marker line (None: missing or garbled)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(FACTS_MARKER):
            try:
                payload = json.loads(line[len(FACTS_MARKER) :])
            except ValueError:
                return None
            return payload if isinstance(payload, dict) else None
    return None


def parse_facts_output(stdout: str, executable: str) -> InterpreterFacts:
    """Turn the facts script's stdout into a record; a missing or garbled marker line gives a
    record whose ``error`` says so (never an exception: the caller records what it has)."""
    payload = _facts_payload(stdout)
    if payload is None:
        return InterpreterFacts(
            executable=executable, error="the interpreter printed no facts line"
        )
    # The executable we ran is the identity the user configured; sys.executable inside a
    # venv may point through a symlink to the base interpreter.
    return replace(InterpreterFacts.from_dict(payload), executable=executable, error=None)


def facts_distributions(stdout: str) -> tuple[str, ...] | None:
    """The ``importlib.metadata`` listing from the facts script (the fallback when the
    interpreter has no pip, as in uv-made venvs)."""
    payload = _facts_payload(stdout)
    dists = payload.get("distributions") if payload is not None else None
    if not isinstance(dists, list):
        return None
    return parse_freeze("\n".join(str(d) for d in dists))


_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")


def redact_url_credentials(text: str) -> str:
    """Drop ``user:token@`` from every URL in ``text`` (pip lines, remote URLs)."""
    return _CREDENTIALS.sub(r"\1", text)


def parse_freeze(text: str) -> tuple[str, ...]:
    """``pip freeze`` output → its requirement lines, sorted case-insensitively.

    Comment lines (pip's ``# Editable install with no version control``) and blanks are
    dropped; credentials in URLs are removed (secrets never land in a state)."""
    lines: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines.add(redact_url_credentials(line))
    return tuple(sorted(lines, key=lambda s: (s.lower(), s)))


# ---------------------------------------------------------------------------------------------
# Finding and running the interpreter


def interpreter_candidates(root: str | Path) -> list[Path]:
    """Where ComfyUI installs keep their Python, most specific first: a venv inside the
    install, then the Windows portable layout (``ComfyUI_windows_portable/python_embeded``
    next to ``ComfyUI/``)."""
    base = Path(root)
    names: list[Path] = []
    for venv in (".venv", "venv", "env"):
        names += [base / venv / "bin" / "python", base / venv / "Scripts" / "python.exe"]
    names += [base.parent / "python_embeded" / "python.exe", base / "python_embeded" / "python.exe"]
    # Linux builds of the portable layout (some community bundles) use the same folder name.
    names += [base.parent / "python_embeded" / "bin" / "python"]
    return names


def find_interpreter(root: str | Path) -> Path | None:
    """ComfyUI's interpreter for the install at ``root``, or ``None`` if none is found (the
    caller then asks the user, or uses the interpreter of the running ComfyUI process)."""
    for candidate in interpreter_candidates(root):
        if candidate.is_file() and (os.name == "nt" or os.access(candidate, os.X_OK)):
            return candidate
    return None


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            # is_available() through NVML: no CUDA driver initialisation in the child.
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
            # Never write __pycache__ into the user's environment.
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }
    )
    if extra:
        env.update(extra)
    return env


def run_interpreter(
    python: str | Path,
    args: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    run_as: tuple[int, int] | None = None,
) -> InterpreterRun:
    """Run ``python *args`` with a timeout; on timeout kill its whole process group (pip and
    torch may start children that would otherwise keep the pipes open).

    ``run_as`` (uid, gid), POSIX only: run as that user with no supplementary groups and
    their HOME -- a daemon running as root must not run code from a user's environment
    (``sitecustomize``, ``.pth`` files) as root."""
    exe = os.fspath(python)
    popen_kwargs: dict[str, Any] = {}
    extra_env = dict(env or {})
    if os.name == "nt":
        popen_kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
    else:
        popen_kwargs["start_new_session"] = True
        if run_as is not None:
            popen_kwargs.update(user=run_as[0], group=run_as[1])
            if os.geteuid() == 0:  # dropping root's groups needs root (setgroups)
                popen_kwargs["extra_groups"] = []
            extra_env.setdefault("HOME", _home_of(run_as[0]))
    try:
        proc = subprocess.Popen(
            [exe, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Not the install's root: its folders (utils/, app/) would shadow modules.
            cwd=os.path.dirname(os.path.abspath(exe)) or None,
            env=_child_env(extra_env),
            **popen_kwargs,
        )
    except OSError as exc:
        raise ProbeError(f"{exe}: cannot run the interpreter: {exc.strerror or exc}") from exc
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return InterpreterRun(None, _decode(out), _decode(err), timed_out=True)
    return InterpreterRun(proc.returncode, _decode(out), _decode(err), timed_out=False)


def _home_of(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_dir
    except (ImportError, KeyError):
        return "/"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if os.name == "nt":
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def probe_interpreter(
    python: str | Path,
    *,
    pip: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    run_as: tuple[int, int] | None = None,
) -> tuple[InterpreterFacts, tuple[str, ...] | None]:
    """Facts about ``python`` and (with ``pip``) its ``pip freeze`` lines.

    Never raises for a misbehaving interpreter: a timeout, a crash or garbage output comes
    back as ``InterpreterFacts.error`` and ``None`` pip lines, so a capture still records the
    git state. A missing executable raises ``ProbeError`` (a configuration mistake)."""
    exe = os.fspath(python)
    if not os.path.exists(exe):
        raise ProbeError(f"{exe}: interpreter not found")
    run = run_interpreter(exe, ["-c", FACTS_SCRIPT], timeout_s=timeout_s, run_as=run_as)
    if run.timed_out:
        facts = InterpreterFacts(
            executable=exe, error=f"timed out after {timeout_s:g} s and was killed"
        )
    elif run.returncode != 0:
        facts = InterpreterFacts(
            executable=exe,
            error=f"exited with status {run.returncode}: {_last_line(run.stderr)}".rstrip(": "),
        )
    else:
        facts = parse_facts_output(run.stdout, exe)
    if not pip or facts.error is not None:
        return facts, None
    freeze = run_interpreter(exe, ["-m", "pip", "freeze"], timeout_s=timeout_s, run_as=run_as)
    if freeze.returncode == 0 and not freeze.timed_out:
        return facts, parse_freeze(freeze.stdout)
    # No pip in that environment (uv venvs): the metadata listing is the same information.
    return facts, facts_distributions(run.stdout)


if __name__ == "__main__":  # pragma: no cover - manual check: python -m ... [python]
    target = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    found_facts, lines = probe_interpreter(target)
    print(json.dumps({"facts": found_facts.to_dict(), "pip": lines}, indent=2))

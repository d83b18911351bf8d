"""Which device the replays run on, decided once before the first measurement, and what a
replay that still dies for a device reason means.

Why it matters: on a machine where ComfyUI's torch sees no GPU, ComfyUI only starts with
``--cpu``. The user's own ComfyUI has that flag, but a bisect started without a snapshot
and without a running ComfyUI has no flags to copy, so every replay died ("Found no NVIDIA
driver on your system") and the bisect ended with "the good state cannot be tested" —
about the machine, not about any state.

The rule (``choose_device``): flags the user gave (``--flags``), the snapshot's or the
running ComfyUI's are used as they are. Otherwise ComfyUI's own interpreter is asked (the
facts probe the doctor uses, daemon/comfy/interpreter.py); when its torch reports no CUDA (ROCm
answers through the same API), XPU or MPS device, ``--cpu`` is added and one line says so.

A replay that still dies for a device reason (``device_failure``) is the harness's failure,
not the state's: the runner stops with the one-line fix and nothing of it reaches the
outcome cache or the log (a cached "won't start: no NVIDIA driver" would otherwise be
replayed as that state's outcome in every later bisect, across ``reset``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from oom_sentinel.bisect.search.verdict import Outcome, Skip
from oom_sentinel.daemon.comfy.interpreter import InterpreterFacts
from oom_sentinel.daemon.core.errors import BisectError

__all__ = [
    "DeviceChoice",
    "DeviceFailure",
    "choose_device",
    "device_failure",
    "is_harness_failure",
]

#: what torch or ComfyUI print when the machine has no device for this build of torch
_DEVICE_RE = re.compile(
    r"Found no NVIDIA driver on your system"
    r"|Torch not compiled with CUDA enabled"
    r"|No CUDA GPUs are available"
    r"|no CUDA-capable device is detected"
    r"|CUDA driver version is insufficient"
    r"|The NVIDIA driver on your system is too old"
    r"|No HIP GPUs are available"
    r"|no kernel image is available for execution on the device",
    re.IGNORECASE,
)


class DeviceFailure(BisectError):
    """A replay died because of the machine's device, not the state (exit status 1)."""


@dataclass(frozen=True)
class DeviceChoice:
    flags: tuple[str, ...]
    #: the one line to print (None: nothing was added)
    note: str | None = None


def choose_device(
    flags: Sequence[str], flags_given: bool, facts: InterpreterFacts | None
) -> DeviceChoice:
    """The flags the replays use (see the module docstring). ``flags_given``: the flags came
    from the user, the snapshot or the running ComfyUI; ``facts``: the probe of ComfyUI's
    interpreter (None: not probed)."""
    flags = tuple(flags)
    if flags_given or "--cpu" in flags or facts is None:
        return DeviceChoice(flags)
    if facts.has_accelerator() is not False:
        return DeviceChoice(flags)  # a device, or torch cannot tell: leave the choice to ComfyUI
    torch = f"torch {facts.torch_version}" if facts.torch_version else "torch"
    return DeviceChoice(
        (*flags, "--cpu"),
        f"ComfyUI's {torch} ({facts.executable}) sees no CUDA, ROCm, XPU or MPS device: "
        "replaying with --cpu (--flags chooses otherwise)",
    )


def device_failure(
    outcome: Outcome, console_tail: Sequence[str], flags: Sequence[str]
) -> str | None:
    """The one-line fix when ``outcome`` is a skip caused by the machine's device, else None."""
    if not isinstance(outcome, Skip):
        return None
    found = _DEVICE_RE.search(outcome.reason) or _DEVICE_RE.search("\n".join(console_tail))
    if found is None:
        return None
    said = found.group(0)
    if "--cpu" in flags:
        return (
            f"ComfyUI cannot use its device even with --cpu ({said}): check that ComfyUI "
            "itself starts with these flags"
        )
    return (
        f"ComfyUI's torch found no usable GPU ({said}): the replays need --cpu — run "
        "`oom-bisect reset`, then start again with --flags '--cpu' (plus the flags you use)"
    )


#: skips that describe the machine or another user at that moment, not the state
_HARNESS_PREFIXES = (
    "the prompt was interrupted by someone else",
    "won't start: no answer on /system_stats",  # a slow or loaded machine, this time
    # what uv could install (envs.py): the indexes this machine reaches, not the state
    "packages: ",
)


def is_harness_failure(outcome: Outcome) -> bool:
    """An outcome that says nothing about the state: a device failure, a prompt someone else
    interrupted, a start that timed out, a package set uv could not install. Never cached, so a later bisect measures the state
    for itself (a wrong cached answer costs more than one measurement)."""
    if not isinstance(outcome, Skip):
        return False
    return bool(_DEVICE_RE.search(outcome.reason)) or outcome.reason.startswith(_HARNESS_PREFIXES)

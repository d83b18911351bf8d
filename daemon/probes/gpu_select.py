"""Choose the GPU probe in one place, with a fallback, and say which one runs.

Like watchdog's ``_get_observer_cls``, the choice is made once, here, and logged as one line:

=========  ===================================================================================
backend    when
=========  ===================================================================================
fake       ``gpu.fake_dir`` or ``$OOM_SENTINEL_FAKE_GPU`` names a fake-GPU directory (tests,
           the stand-in ComfyUI); with ``backend = "fake"`` one of them is required
nvml       an NVIDIA driver is installed (NVML loads). A driver that is not loaded yet or
           was upgraded without a reboot keeps this backend: it retries and recovers alone
none       ``backend = "none"``, or (auto) no NVML library / no ``pynvml`` module: Macs, AMD,
           CPU-only boxes. The daemon still records RAM, logs and the API's view of memory
=========  ===================================================================================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oom_sentinel.config.settings import GpuSettings
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProbe, GpuProcessSample
from oom_sentinel.daemon.probes.fake_gpu import ENV_FAKE_GPU
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
from oom_sentinel.daemon.probes.nvml import NvmlGpuProbe

__all__ = ["GpuChoice", "NullGpuProbe", "select_gpu_probe"]

log = logging.getLogger(__name__)


class NullGpuProbe:
    """No GPU data, and the reason why (shown by ``status`` and in snapshots)."""

    backend = "none"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def devices(self) -> tuple[GpuDeviceSample, ...]:
        return ()

    def processes(self) -> tuple[GpuProcessSample, ...]:
        return ()

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class GpuChoice:
    """The probe that runs, and the one line that was logged about it."""

    probe: GpuProbe
    backend: str
    detail: str

    @property
    def line(self) -> str:
        return f"GPU probe: {self.backend} ({self.detail})"


def select_gpu_probe(
    settings: GpuSettings | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    nvml_module: Any = None,
) -> GpuChoice:
    """Build the configured GPU probe (see the table above) and log which one it is.

    ``nvml_module`` replaces ``pynvml`` (tests). Raises ``ConfigError`` only for
    ``backend = "fake"`` without a directory.
    """
    cfg = settings if settings is not None else GpuSettings()
    env = os.environ if environ is None else environ
    choice = _choose(cfg, env, nvml_module)
    log.info("%s", choice.line)
    return choice


def _choose(cfg: GpuSettings, env: Mapping[str, str], nvml_module: Any) -> GpuChoice:
    if cfg.backend == "none":
        reason = 'disabled by gpu.backend = "none"'
        return GpuChoice(NullGpuProbe(reason), "none", reason)

    if cfg.fake_dir:
        fake_dir, origin = os.path.expanduser(cfg.fake_dir), "gpu.fake_dir"
    else:
        fake_dir, origin = env.get(ENV_FAKE_GPU, ""), f"${ENV_FAKE_GPU}"
    if cfg.backend == "fake" and not fake_dir:
        raise ConfigError(
            f'gpu.backend = "fake" needs gpu.fake_dir or ${ENV_FAKE_GPU} to name a directory'
        )
    if fake_dir and cfg.backend in ("auto", "fake"):
        probe = FakeGpuProbe(fake_dir)
        count = len(probe.devices())
        return GpuChoice(probe, "fake", f"{fake_dir} from {origin}, {count} device(s)")

    nvml = NvmlGpuProbe(nvml_module, retry_interval_s=float(cfg.nvml_retry_s))
    if nvml.start(report=False):
        st = nvml.status()
        detail = f"{st.device_count} device(s), driver {st.driver_version or 'unknown'}"
        return GpuChoice(nvml, "nvml", detail)
    st = nvml.status()
    if cfg.backend == "auto" and st.absent:
        nvml.close()
        reason = st.reason or "NVML unavailable"
        return GpuChoice(NullGpuProbe(reason), "none", reason)
    detail = f"no data yet: {st.reason}; retrying every {cfg.nvml_retry_s} s"
    return GpuChoice(nvml, "nvml", detail)

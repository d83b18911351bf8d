"""The memory timeline: the last minutes of GPU, RAM and process memory, kept in a ring buffer
so a crash snapshot can show the climb that led to the failure.

An OOM kill leaves no message behind (the kernel never waits for us), so the samples taken
*before* the death are the main evidence; the buffer is frozen into ``timeline.csv`` the moment
an incident opens.

Sampling is cheap on purpose: one NVML device/process query, ``virtual_memory`` and
``swap_memory``, and one RSS read per watched process and child (``host_probe`` walks only the
watched tree, never all processes). While a prompt executes ``Sampler.set_active(True)`` switches
to the faster interval; the buffer keeps ``timeline_s`` seconds either way (see
``Timeline.from_settings``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from oom_sentinel.config.settings import SamplingSettings
from oom_sentinel.daemon.probes.base import GpuProbe, HostProbe, MemorySample, ProcessTreeSample

__all__ = [
    "CSV_FIXED_COLUMNS",
    "SAMPLER_JOB_ID",
    "Sampler",
    "Timeline",
    "csv_columns",
    "to_csv",
]

log = logging.getLogger(__name__)

SAMPLER_JOB_ID = "memory-sampler"

#: The first columns of every timeline.csv. After them, in this order, come the columns the
#: samples call for (a column appears when any sample has a value for it; a blank cell means
#: unknown or absent at that moment):
#:
#: - ``gpu<i>_used_bytes``, ``gpu<i>_total_bytes``         per GPU index ``i``, ascending
#: - ``ram_available_bytes``, ``ram_total_bytes``, ``swap_used_bytes``, ``swap_total_bytes``
#: - ``commit_used_bytes``, ``commit_limit_bytes``           Windows commit charge, where known
#: - ``pid<p>_rss_bytes``, ``pid<p>_peak_rss_bytes``         per watched process tree (root ``p``:
#:   RSS of the process and its children; the root's kernel high-water mark)
#: - ``gpu<i>_pid<p>_used_bytes``                            per process using GPU ``i``
#:
#: ``time_utc`` is ISO 8601 with milliseconds and a ``Z``; ``time_s`` is seconds since the epoch
#: with three decimals. All memory is in bytes.
CSV_FIXED_COLUMNS = ("time_utc", "time_s")


class Timeline:
    """A thread-safe ring buffer of ``MemorySample``, bounded by count and by age.

    ``capacity`` bounds memory; ``max_age_s`` (when given) drops samples older than that,
    measured from the newest sample, so an idle hour at 1 s and a busy minute at 250 ms both
    leave exactly the last ``max_age_s`` seconds.
    """

    def __init__(self, capacity: int = 600, max_age_s: float | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"timeline capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._samples: deque[MemorySample] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, sampling: SamplingSettings) -> Timeline:
        """Room for ``timeline_s`` seconds even at the faster (active) interval (both ends
        included: 2401 samples span 600 s at 250 ms)."""
        fastest_ms = min(sampling.interval_ms, sampling.active_interval_ms)
        capacity = math.ceil(sampling.timeline_s * 1000 / fastest_ms) + 1
        return cls(capacity=capacity, max_age_s=float(sampling.timeline_s))

    def append(self, sample: MemorySample) -> None:
        with self._lock:
            self._samples.append(sample)
            if self.max_age_s is not None:
                horizon = sample.time_s - self.max_age_s
                while self._samples and self._samples[0].time_s < horizon:
                    self._samples.popleft()

    def snapshot(self) -> tuple[MemorySample, ...]:
        """Every sample held, oldest first (a copy: later appends do not change it)."""
        with self._lock:
            return tuple(self._samples)

    def since(self, time_s: float) -> tuple[MemorySample, ...]:
        with self._lock:
            return tuple(s for s in self._samples if s.time_s >= time_s)

    def latest(self) -> MemorySample | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._samples)


# -- CSV -----------------------------------------------------------------------------------


def _iso(time_s: float) -> str:
    stamp = datetime.fromtimestamp(time_s, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def _row(sample: MemorySample) -> dict[str, int | float | str]:
    row: dict[str, int | float | str] = {
        "time_utc": _iso(sample.time_s),
        "time_s": f"{sample.time_s:.3f}",
    }

    def put(key: str, value: int | None) -> None:
        if value is not None:
            row[key] = value

    for gpu in sample.gpus:
        put(f"gpu{gpu.index}_used_bytes", gpu.used_bytes)
        put(f"gpu{gpu.index}_total_bytes", gpu.total_bytes)
    if sample.host is not None:
        host = sample.host
        put("ram_available_bytes", host.ram_available_bytes)
        put("ram_total_bytes", host.ram_total_bytes)
        put("swap_used_bytes", host.swap_used_bytes)
        put("swap_total_bytes", host.swap_total_bytes)
        put("commit_used_bytes", host.committed_bytes)
        put("commit_limit_bytes", host.commit_limit_bytes)
    for tree in sample.process_trees:
        put(f"pid{tree.root_pid}_rss_bytes", tree.rss_bytes)
        put(f"pid{tree.root_pid}_peak_rss_bytes", tree.peak_rss_bytes)
    for proc in sample.gpu_processes:
        put(f"gpu{proc.device_index}_pid{proc.pid}_used_bytes", proc.used_bytes)
    return row


_HOST_ORDER = (
    "ram_available_bytes",
    "ram_total_bytes",
    "swap_used_bytes",
    "swap_total_bytes",
    "commit_used_bytes",
    "commit_limit_bytes",
)


def csv_columns(samples: Sequence[MemorySample]) -> list[str]:
    """The header ``to_csv`` writes for these samples (documented at ``CSV_FIXED_COLUMNS``)."""
    keys: set[str] = set()
    for sample in samples:
        keys.update(_row(sample))
    gpus = sorted({g.index for s in samples for g in s.gpus})
    trees = sorted({t.root_pid for s in samples for t in s.process_trees})
    gpu_procs = sorted({(p.device_index, p.pid) for s in samples for p in s.gpu_processes})
    ordered: list[str] = list(CSV_FIXED_COLUMNS)
    for i in gpus:
        ordered += [f"gpu{i}_used_bytes", f"gpu{i}_total_bytes"]
    ordered += list(_HOST_ORDER)
    for pid in trees:
        ordered += [f"pid{pid}_rss_bytes", f"pid{pid}_peak_rss_bytes"]
    for dev, pid in gpu_procs:
        ordered.append(f"gpu{dev}_pid{pid}_used_bytes")
    return [c for c in ordered if c in keys or c in CSV_FIXED_COLUMNS]


def to_csv(samples: Sequence[MemorySample]) -> str:
    """The samples as CSV text, one row per sample, oldest first; blank cell = unknown."""
    columns = csv_columns(samples)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    for sample in sorted(samples, key=lambda s: s.time_s):
        writer.writerow(_row(sample))
    return out.getvalue()


# -- the sampling job ------------------------------------------------------------------------


class Sampler:
    """Takes one ``MemorySample`` per tick into a ``Timeline``; run by an APScheduler job.

    ``start(scheduler)`` adds the interval job (``coalesce=True``, ``max_instances=1``: a stalled
    process samples once when it wakes instead of bursting); ``set_active(True)`` switches it to
    the faster interval while a prompt executes and back with ``False``. The watched process
    roots are set with ``watch`` / ``unwatch`` / ``set_watched``. ``sample_once`` never raises.
    """

    def __init__(
        self,
        timeline: Timeline,
        gpu: GpuProbe,
        host: HostProbe,
        sampling: SamplingSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        on_sample: Callable[[MemorySample], None] | None = None,
    ) -> None:
        self.timeline = timeline
        self.gpu = gpu
        self.host = host
        self.sampling = sampling if sampling is not None else SamplingSettings()
        self._clock = clock
        self._on_sample = on_sample
        self._watched: dict[int, None] = {}
        self._lock = threading.Lock()
        self._scheduler: Any = None
        self._active = False
        self._failed_once = False

    # -- what is watched -----------------------------------------------------------------
    def watch(self, pid: int) -> None:
        with self._lock:
            self._watched[pid] = None

    def unwatch(self, pid: int) -> None:
        with self._lock:
            self._watched.pop(pid, None)

    def set_watched(self, pids: Iterable[int]) -> None:
        with self._lock:
            self._watched = dict.fromkeys(pids)

    @property
    def watched(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._watched)

    # -- one tick ------------------------------------------------------------------------
    def sample_once(self) -> MemorySample | None:
        """Read every probe once and append the sample; ``None`` if something went wrong."""
        try:
            now = self._clock()
            gpus = self.gpu.devices()
            gpu_procs = self.gpu.processes()
            host = self.host.host()
            trees: list[ProcessTreeSample] = []
            for pid in self.watched:
                tree = self.host.process_tree(pid)
                if tree is not None:
                    trees.append(tree)
            sample = MemorySample(
                time_s=now,
                gpus=gpus,
                gpu_processes=gpu_procs,
                host=host,
                process_trees=tuple(trees),
            )
            self.timeline.append(sample)
        except Exception:
            # probes never raise by contract; this guards the scheduler thread regardless
            if not self._failed_once:
                self._failed_once = True
                log.exception("memory sampling failed; the timeline has a gap")
            return None
        if self._on_sample is not None:
            try:
                self._on_sample(sample)
            except Exception:
                log.exception("memory sample callback failed")
        return sample

    # -- scheduling ----------------------------------------------------------------------
    @property
    def interval_ms(self) -> int:
        return self.sampling.active_interval_ms if self._active else self.sampling.interval_ms

    @property
    def active(self) -> bool:
        return self._active

    def start(self, scheduler: Any) -> None:
        """Add the sampling job to an APScheduler 3.x scheduler (started or not)."""
        self._scheduler = scheduler
        scheduler.add_job(
            self.sample_once,
            trigger="interval",
            seconds=self.interval_ms / 1000,
            id=SAMPLER_JOB_ID,
            name="memory sampler",
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            # a tick later than one interval is useless; skip it rather than run it late
            misfire_grace_time=max(1, math.ceil(self.interval_ms / 1000)),
            next_run_time=datetime.now(UTC),
        )

    def set_active(self, active: bool) -> None:
        """Sample at ``active_interval_ms`` while a prompt executes, else ``interval_ms``."""
        with self._lock:
            if active == self._active:
                return
            self._active = active
            interval_s = self.interval_ms / 1000
        if self._scheduler is None:
            return
        try:
            self._scheduler.reschedule_job(SAMPLER_JOB_ID, trigger="interval", seconds=interval_s)
        except Exception:
            log.exception("could not change the sampling interval to %g s", interval_s)
            return
        if active:
            # the first fast sample should not wait out the slow interval
            with contextlib.suppress(Exception):
                self._scheduler.modify_job(SAMPLER_JOB_ID, next_run_time=datetime.now(UTC))

    def stop(self) -> None:
        if self._scheduler is None:
            return
        with contextlib.suppress(Exception):
            self._scheduler.remove_job(SAMPLER_JOB_ID)
        self._scheduler = None

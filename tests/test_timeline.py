"""The memory timeline: ring buffer bounds, CSV export, and the APScheduler sampling job."""

from __future__ import annotations

import csv
import io
import logging
import os
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from daemon_harness import wait_for

from oom_sentinel.config.settings import SamplingSettings
from oom_sentinel.daemon.probes.base import (
    GpuDeviceSample,
    GpuProcessSample,
    HostSample,
    MemorySample,
    ProcessTreeSample,
)
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir, FakeProcessUsage
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
from oom_sentinel.daemon.probes.gpu_select import NullGpuProbe
from oom_sentinel.daemon.probes.host import PsutilHostProbe
from oom_sentinel.daemon.probes.timeline import (
    SAMPLER_JOB_ID,
    Sampler,
    Timeline,
    csv_columns,
    to_csv,
)

GiB = 1024**3


def sample(t: float, **kw: object) -> MemorySample:
    return MemorySample(
        time_s=t,
        gpus=kw.get("gpus", ()),  # type: ignore[arg-type]
        gpu_processes=kw.get("gpu_processes", ()),  # type: ignore[arg-type]
        host=kw.get("host"),  # type: ignore[arg-type]
        process_trees=kw.get("process_trees", ()),  # type: ignore[arg-type]
    )


# -- ring buffer ------------------------------------------------------------------------------------


def test_ring_buffer_keeps_the_newest_capacity_samples() -> None:
    tl = Timeline(capacity=3)
    for t in range(5):
        tl.append(sample(float(t)))
    assert [s.time_s for s in tl.snapshot()] == [2.0, 3.0, 4.0]
    assert len(tl) == 3
    latest = tl.latest()
    assert latest is not None and latest.time_s == 4.0


def test_old_samples_age_out_even_below_capacity() -> None:
    tl = Timeline(capacity=1000, max_age_s=10)
    for t in (0.0, 5.0, 9.0, 12.0, 20.0):
        tl.append(sample(t))
    assert [s.time_s for s in tl.snapshot()] == [12.0, 20.0]


def test_default_settings_hold_ten_minutes_even_at_the_active_rate() -> None:
    tl = Timeline.from_settings(SamplingSettings())
    assert tl.capacity == 600 * 1000 // 250 + 1
    assert tl.max_age_s == 600
    for i in range(3000):  # 12.5 minutes at 250 ms
        tl.append(sample(i * 0.25))
    held = tl.snapshot()
    assert held[-1].time_s - held[0].time_s == 600
    idle = Timeline.from_settings(SamplingSettings())
    for i in range(700):  # 700 s at 1 s
        idle.append(sample(float(i)))
    assert len(idle) == 601


def test_snapshot_is_a_copy_and_since_filters() -> None:
    tl = Timeline(capacity=10)
    tl.append(sample(1.0))
    snap = tl.snapshot()
    tl.append(sample(2.0))
    assert len(snap) == 1
    assert [s.time_s for s in tl.since(1.5)] == [2.0]
    assert Timeline().latest() is None


def test_concurrent_appends_lose_nothing() -> None:
    tl = Timeline(capacity=100_000)

    def writer(offset: int) -> None:
        for i in range(2000):
            tl.append(sample(offset + i * 1e-6))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    reads = [len(tl.snapshot()) for _ in range(50)]
    for th in threads:
        th.join()
    assert len(tl) == 16_000
    assert all(0 <= r <= 16_000 for r in reads)


def test_zero_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Timeline(capacity=0)


# -- CSV ------------------------------------------------------------------------------------------


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_header_and_cells_follow_the_documented_layout() -> None:
    host = HostSample(
        ram_total_bytes=64 * GiB,
        ram_available_bytes=40 * GiB,
        swap_total_bytes=8 * GiB,
        swap_used_bytes=1 * GiB,
    )
    gpu0 = GpuDeviceSample(0, "RTX 4090", 24 * GiB, 10 * GiB, 14 * GiB)
    first = sample(
        1_767_225_600.0,
        gpus=(gpu0,),
        host=host,
        process_trees=(ProcessTreeSample(4242, 3 * GiB, 4 * GiB),),
        gpu_processes=(GpuProcessSample(4242, 0, 9 * GiB),),
    )
    second = sample(
        1_767_225_601.25,
        gpus=(gpu0, GpuDeviceSample(1, "RTX 3060", 12 * GiB, None, None)),
        host=host,
        process_trees=(ProcessTreeSample(4242, 3 * GiB + 5, None),),
        gpu_processes=(GpuProcessSample(4242, 0, None), GpuProcessSample(777, 0, GiB)),
    )
    text = to_csv([second, first])  # out of order on purpose: the CSV is oldest first
    header = text.splitlines()[0].split(",")
    assert header == [
        "time_utc",
        "time_s",
        "gpu0_used_bytes",
        "gpu0_total_bytes",
        "gpu1_total_bytes",
        "ram_available_bytes",
        "ram_total_bytes",
        "swap_used_bytes",
        "swap_total_bytes",
        "pid4242_rss_bytes",
        "pid4242_peak_rss_bytes",
        "gpu0_pid777_used_bytes",
        "gpu0_pid4242_used_bytes",
    ]
    assert header == csv_columns([first, second])
    r1, r2 = rows(text)
    assert r1["time_utc"] == "2026-01-01T00:00:00.000Z"
    assert r1["time_s"] == "1767225600.000"
    assert r2["time_utc"] == "2026-01-01T00:00:01.250Z"
    assert r1["gpu0_used_bytes"] == str(10 * GiB)
    assert r1["gpu1_total_bytes"] == ""  # no second GPU at that moment
    assert r2["gpu1_total_bytes"] == str(12 * GiB)
    assert r1["pid4242_peak_rss_bytes"] == str(4 * GiB)
    assert r2["pid4242_peak_rss_bytes"] == ""
    assert r1["gpu0_pid4242_used_bytes"] == str(9 * GiB)
    assert r2["gpu0_pid4242_used_bytes"] == ""  # unknown (WDDM), not 0
    assert r1["gpu0_pid777_used_bytes"] == ""
    assert r2["gpu0_pid777_used_bytes"] == str(GiB)


def test_csv_has_commit_columns_only_where_known() -> None:
    linux = sample(1.0, host=HostSample(8 * GiB, 4 * GiB, 0, 0))
    assert "commit_used_bytes" not in to_csv([linux])
    windows = sample(2.0, host=HostSample(8 * GiB, 4 * GiB, 0, 0, 24 * GiB, 10 * GiB))
    (row,) = rows(to_csv([windows]))
    assert row["commit_used_bytes"] == str(10 * GiB)
    assert row["commit_limit_bytes"] == str(24 * GiB)


def test_csv_of_no_samples_is_just_the_time_header() -> None:
    assert to_csv([]) == "time_utc,time_s\n"
    assert to_csv([sample(5.0)]) == "time_utc,time_s\n1970-01-01T00:00:05.000Z,5.000\n"


# -- sampler --------------------------------------------------------------------------------------


@pytest.fixture
def fake_gpu(tmp_path: Path) -> FakeGpuProbe:
    root = FakeGpuDir(tmp_path / "gpu").create([FakeDevice(0, "Fake GPU", 8 * GiB, GiB)])
    root.report(FakeProcessUsage(os.getpid(), "pytest", 0, 2 * GiB, 2 * GiB))
    return FakeGpuProbe(root)


def test_one_sample_reads_every_probe(fake_gpu: FakeGpuProbe) -> None:
    tl = Timeline(capacity=10)
    sampler = Sampler(tl, fake_gpu, PsutilHostProbe(), clock=lambda: 123.0)
    sampler.watch(os.getpid())
    sampler.watch(2**22 + 4321)  # not running: left out of the sample, not an error
    s = sampler.sample_once()
    assert s is not None and tl.snapshot() == (s,)
    assert s.time_s == 123.0
    assert s.gpus[0].used_bytes == 3 * GiB
    assert [(p.pid, p.used_bytes) for p in s.gpu_processes] == [(os.getpid(), 2 * GiB)]
    assert s.host is not None and s.host.ram_total_bytes > 0
    assert [t.root_pid for t in s.process_trees] == [os.getpid()]
    assert s.process_trees[0].rss_bytes > 0


def test_watch_list_changes() -> None:
    sampler = Sampler(Timeline(), NullGpuProbe("none"), PsutilHostProbe())
    sampler.watch(1)
    sampler.watch(2)
    sampler.unwatch(1)
    assert sampler.watched == (2,)
    sampler.set_watched([5, 6])
    assert sampler.watched == (5, 6)


class ExplodingHost:
    def host(self) -> HostSample | None:
        raise RuntimeError("boom")

    def process_tree(self, root_pid: int) -> ProcessTreeSample | None:
        raise RuntimeError("boom")


def test_a_failing_probe_leaves_a_gap_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    tl = Timeline()
    sampler = Sampler(tl, NullGpuProbe("none"), ExplodingHost())
    caplog.set_level(logging.ERROR)
    assert sampler.sample_once() is None
    assert sampler.sample_once() is None
    assert len(tl) == 0
    assert len([r for r in caplog.records if "gap" in r.getMessage()]) == 1


def test_scheduler_job_samples_and_switches_interval(fake_gpu: FakeGpuProbe) -> None:
    settings = SamplingSettings(interval_ms=200, active_interval_ms=50, timeline_s=60)
    tl = Timeline.from_settings(settings)
    sampler = Sampler(tl, fake_gpu, PsutilHostProbe(), settings)
    scheduler = BackgroundScheduler(timezone="UTC")
    sampler.start(scheduler)
    scheduler.start()
    try:
        job = scheduler.get_job(SAMPLER_JOB_ID)
        assert job is not None
        assert job.coalesce is True and job.max_instances == 1
        assert job.trigger.interval == timedelta(milliseconds=200)
        wait_for(lambda: len(tl) >= 2, what="two idle samples")

        sampler.set_active(True)
        assert sampler.active and sampler.interval_ms == 50
        job = scheduler.get_job(SAMPLER_JOB_ID)
        assert job is not None and job.trigger.interval == timedelta(milliseconds=50)
        count = len(tl)
        wait_for(lambda: len(tl) >= count + 3, what="fast samples")

        sampler.set_active(False)
        job = scheduler.get_job(SAMPLER_JOB_ID)
        assert job is not None and job.trigger.interval == timedelta(milliseconds=200)

        sampler.stop()
        assert scheduler.get_job(SAMPLER_JOB_ID) is None
    finally:
        scheduler.shutdown(wait=True)
    times = [s.time_s for s in tl.snapshot()]
    assert times == sorted(times)


def test_set_active_before_start_only_changes_the_interval() -> None:
    sampler = Sampler(Timeline(), NullGpuProbe("none"), PsutilHostProbe())
    sampler.set_active(True)
    assert sampler.interval_ms == 250
    sampler.set_active(False)
    assert sampler.interval_ms == 1000

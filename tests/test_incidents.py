"""The incident state machine, stepped with an explicit clock: merges, storms, settle timing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.classify.events import MERGED_FIELDS, Backend, OomEvent, OtherProcess, Pool
from oom_sentinel.daemon.incidents.tracker import (
    Action,
    CloseIncident,
    CountSoftOom,
    IncidentTracker,
    Observation,
    TrackerConfig,
    UpdateIncident,
    WriteSnapshot,
    expected_sources,
    incident_fingerprint,
    merge_events,
    summarize,
)

GIB = 1024**3

# What the log's traceback record classifies as: numbers, no node.
LOG_TRACEBACK = OomEvent(
    pool=Pool.GPU,
    backend=Backend.CUDA,
    recovered=False,
    message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 24.00 GiB of which 1.00 GiB is free.",
    exception_type="torch.OutOfMemoryError",
    gpu_index=0,
    requested_bytes=2 * GIB,
    total_bytes=24 * GIB,
    free_bytes=1 * GIB,
    allocated_bytes=20 * GIB,
    rule="cuda-oom",
)
# `Got an OOM, unloading all loaded models.`: says it was an OOM, nothing more.
LOG_GOT_AN_OOM = OomEvent(
    pool=Pool.GPU,
    backend=Backend.UNKNOWN,
    recovered=False,
    message="Got an OOM, unloading all loaded models.",
    rule="got-an-oom",
)
# The API's execution_error: node and exception type, the message without our parsing.
API_ERROR = OomEvent(
    pool=Pool.GPU,
    backend=Backend.CUDA,
    recovered=False,
    message="Allocation on device",
    exception_type="torch.OutOfMemoryError",
    node_type="KSampler",
    node_id="3",
    rule="execution-error",
)
SOFT = OomEvent(
    pool=Pool.GPU,
    backend=Backend.CUDA,
    recovered=True,
    message="Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.",
    rule="tiled-vae-retry",
)
KILLED_PROCESS = OomEvent(
    pool=Pool.KILLED_BY_OS,
    backend=Backend.UNKNOWN,
    recovered=False,
    message="ComfyUI (pid 4242) exited with SIGKILL",
    killed_pid=4242,
    rule="process-sigkill",
)
KILLED_KERNEL = OomEvent(
    pool=Pool.KILLED_BY_OS,
    backend=Backend.UNKNOWN,
    recovered=False,
    message="Out of memory: Killed process 4242 (python)",
    killer="kernel",
    killed_pid=4242,
    rule="kernel-oom-kill",
)


def _ids() -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"inc{n}"


def tracker(**cfg: Any) -> IncidentTracker:
    counter = _ids()
    return IncidentTracker(TrackerConfig(**cfg), new_id=lambda: next(counter))


def obs(
    event: OomEvent, at: float, source: str = "log", instance: str = "main", **evidence: Any
) -> Observation:
    return Observation(instance=instance, source=source, event=event, at_s=at, evidence=evidence)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_log_only_instance_writes_snapshot_at_once() -> None:
    t = tracker()
    actions = t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    assert kinds(actions) == ["WriteSnapshot"]
    inc = actions[0].incident  # type: ignore[union-attr]
    assert (inc.id, inc.count, inc.sources, inc.snapshot_written) == ("inc1", 1, ("log",), True)
    assert inc.event.requested_bytes == 2 * GIB
    assert t.next_deadline() == 100.0 + 300.0  # only the storm window is left to wait for


def test_snapshot_waits_for_the_api_and_takes_the_node_from_it() -> None:
    t = tracker(settle_s=1.0)
    t.set_available_sources("main", ["log", "api"])
    assert t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0) == []
    assert t.next_deadline() == 101.0
    assert t.tick(100.5) == []
    actions = t.observe(obs(API_ERROR, 100.2, source="api", prompt_id="p1"), now=100.3)
    assert kinds(actions) == ["WriteSnapshot"]  # every expected source reported: no more waiting
    event = actions[0].incident.event  # type: ignore[union-attr]
    assert (event.node_type, event.node_id) == ("KSampler", "3")  # from the API
    assert (event.requested_bytes, event.free_bytes) == (2 * GIB, 1 * GIB)  # from the log
    assert event.message.startswith("CUDA out of memory. Tried")  # the log's text has numbers
    assert actions[0].incident.sources == ("api", "log")  # type: ignore[union-attr]
    assert actions[0].incident.summary == (  # type: ignore[union-attr]
        "GPU out of memory in KSampler (node 3) on main: tried to allocate 2.00 GiB, "
        "1.00 GiB free of 24.00 GiB"
    )


def test_snapshot_is_written_after_settle_when_the_api_stays_silent() -> None:
    t = tracker(settle_s=1.0)
    t.set_available_sources("main", ["log", "api"])
    assert t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0) == []
    assert t.tick(100.999) == []
    actions = t.tick(101.0)
    assert kinds(actions) == ["WriteSnapshot"]
    assert t.tick(101.5) == []  # written once, never again


def test_late_api_record_updates_the_row_only() -> None:
    t = tracker(settle_s=1.0)
    t.set_available_sources("main", ["log", "api"])
    t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    assert kinds(t.tick(101.0)) == ["WriteSnapshot"]
    actions = t.observe(obs(API_ERROR, 102.0, source="api", prompt_id="p1"), now=102.0)
    assert kinds(actions) == ["UpdateIncident"]
    inc = actions[0].incident  # type: ignore[union-attr]
    assert (inc.count, inc.sources, inc.last_seen_s) == (1, ("api", "log"), 102.0)
    assert inc.event.node_type is None  # the snapshot was already written: it stays as written


def test_follow_up_log_records_of_one_failure_merge_silently() -> None:
    t = tracker()
    assert kinds(t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)) == ["WriteSnapshot"]
    # "!!! Exception during processing !!!" repeats the message a few ms later; then the unload
    assert t.observe(obs(LOG_TRACEBACK, 100.001), now=100.01) == []
    assert t.observe(obs(LOG_GOT_AN_OOM, 100.05), now=100.06) == []
    (inc,) = t.open_incidents()
    assert inc.count == 1


def test_a_batch_read_at_once_lands_in_one_snapshot() -> None:
    t = tracker()
    actions = t.observe_many(
        [obs(LOG_GOT_AN_OOM, 100.0), obs(LOG_TRACEBACK, 100.01)],
        now=100.2,
    )
    assert kinds(actions) == ["WriteSnapshot"]
    inc = actions[0].incident  # type: ignore[union-attr]
    assert len(inc.observations) == 2
    assert inc.event.requested_bytes == 2 * GIB  # the record with numbers wins within a source
    assert inc.event.backend is Backend.CUDA


def test_storm_grows_the_count_without_new_snapshots() -> None:
    t = tracker(storm_window_s=300.0)
    writes = 0
    counts: list[int] = []
    for i in range(5):
        at = 100.0 + 20.0 * i
        for action in t.observe(obs(LOG_TRACEBACK, at), now=at):
            if isinstance(action, WriteSnapshot):
                writes += 1
            if isinstance(action, UpdateIncident):
                counts.append(action.incident.count)
    assert writes == 1
    assert counts == [2, 3, 4, 5]
    (inc,) = t.open_incidents()
    assert (inc.first_seen_s, inc.last_seen_s) == (100.0, 180.0)


def test_storm_failures_each_with_api_and_log_count_once_each() -> None:
    t = tracker(settle_s=1.0)
    t.set_available_sources("main", ["log", "api"])
    seen: list[str] = []
    for i, prompt in enumerate(["p1", "p2", "p3"]):
        at = 100.0 + 2.0 * i
        seen += kinds(t.observe(obs(LOG_TRACEBACK, at), now=at))
        seen += kinds(t.observe(obs(LOG_GOT_AN_OOM, at + 0.01), now=at + 0.01))
        seen += kinds(t.observe(obs(API_ERROR, at + 0.02, "api", prompt_id=prompt), now=at + 0.02))
    (inc,) = t.open_incidents()
    assert inc.count == 3
    assert seen.count("WriteSnapshot") == 1


def test_different_prompt_ids_are_different_failures_even_at_once() -> None:
    t = tracker()
    t.observe(obs(API_ERROR, 100.0, "api", prompt_id="p1"), now=100.0)
    actions = t.observe(obs(API_ERROR, 100.0, "api", prompt_id="p2"), now=100.0)
    assert [a.incident.count for a in actions] == [2]  # type: ignore[union-attr]


def test_same_prompt_id_repeated_is_the_same_failure() -> None:
    t = tracker()
    t.observe(obs(API_ERROR, 100.0, "api", prompt_id="p1"), now=100.0)
    assert t.observe(obs(API_ERROR, 103.0, "api", prompt_id="p1"), now=103.0) == []
    assert t.open_incidents()[0].count == 1


def test_after_the_storm_window_a_new_incident_opens() -> None:
    t = tracker(storm_window_s=300.0)
    t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    actions = t.observe(obs(LOG_TRACEBACK, 401.0), now=401.0)
    assert kinds(actions) == ["CloseIncident", "WriteSnapshot"]
    assert actions[0].incident.id == "inc1"  # type: ignore[union-attr]
    assert actions[1].incident.id == "inc2"  # type: ignore[union-attr]


def test_a_quiet_incident_is_closed_by_tick() -> None:
    t = tracker(storm_window_s=300.0)
    t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    t.observe(obs(LOG_TRACEBACK, 150.0), now=150.0)
    assert t.tick(450.0) == []
    actions = t.tick(450.1)
    assert kinds(actions) == ["CloseIncident"]
    assert actions[0].incident.count == 2  # type: ignore[union-attr]
    assert t.open_incidents() == ()
    assert t.next_deadline() is None


def test_catching_up_an_old_log_writes_the_pending_snapshot_before_closing_it() -> None:
    t = tracker(settle_s=1.0, storm_window_s=300.0)
    t.set_available_sources("main", ["log", "api"])
    # Both records read in one batch long after they were written: the first incident's
    # settle time has not come by the clock, but the second record is a new incident.
    actions = t.observe_many([obs(LOG_TRACEBACK, 1000.0), obs(LOG_TRACEBACK, 2000.0)], now=5000.0)
    assert kinds(actions) == ["WriteSnapshot", "CloseIncident"]
    assert kinds(t.tick(5001.0)) == ["WriteSnapshot"]


@pytest.mark.parametrize(
    ("first", "second", "incidents"),
    [
        (Pool.GPU, Pool.GPU_FRAGMENTATION, 1),
        (Pool.GPU_FRAGMENTATION, Pool.GPU, 1),
        (Pool.GPU, Pool.RAM, 2),
        (Pool.RAM, Pool.SWAP_PAGEFILE, 2),
        (Pool.GPU, Pool.KILLED_BY_OS, 2),
    ],
    ids=["gpu+frag", "frag+gpu", "gpu+ram", "ram+pagefile", "gpu+killed"],
)
def test_pools_group_by_family(first: Pool, second: Pool, incidents: int) -> None:
    t = tracker()
    t.observe(obs(replace(LOG_TRACEBACK, pool=first), 100.0), now=100.0)
    t.observe(obs(replace(LOG_TRACEBACK, pool=second, rule="other"), 100.1), now=100.1)
    assert len(t.open_incidents()) == incidents


def test_fragmentation_is_the_more_specific_pool() -> None:
    t = tracker(settle_s=1.0)
    t.set_available_sources("main", ["log", "api"])
    t.observe(obs(API_ERROR, 100.0, "api"), now=100.0)
    frag = replace(LOG_TRACEBACK, pool=Pool.GPU_FRAGMENTATION, reserved_unallocated_bytes=6 * GIB)
    (write,) = t.observe(obs(frag, 100.1), now=100.1)
    assert write.incident.pool is Pool.GPU_FRAGMENTATION  # type: ignore[union-attr]
    assert "6.00 GiB reserved but unallocated" in write.incident.summary  # type: ignore[union-attr]


def test_instances_are_tracked_apart() -> None:
    t = tracker()
    a = t.observe(obs(LOG_TRACEBACK, 100.0, instance="a"), now=100.0)
    b = t.observe(obs(LOG_TRACEBACK, 100.0, instance="b"), now=100.0)
    assert kinds(a) == kinds(b) == ["WriteSnapshot"]


def test_soft_ooms_are_counted_per_instance_and_open_nothing() -> None:
    t = tracker()
    actions = t.observe(obs(SOFT, 100.0), now=100.0) + t.observe(obs(SOFT, 101.0), now=101.0)
    actions += t.observe(obs(SOFT, 101.0, instance="other"), now=101.0)
    assert [(a.instance, a.count) for a in actions if isinstance(a, CountSoftOom)] == [
        ("main", 1),
        ("main", 2),
        ("other", 1),
    ]
    assert t.open_incidents() == ()
    assert t.soft_oom_count("main") == 2


def test_a_kill_waits_for_kernel_evidence_and_names_the_killer() -> None:
    t = tracker(settle_s=1.0)
    t.set_available_sources("main", ["log", "api", "process", "kernel"])
    assert t.observe(obs(KILLED_PROCESS, 100.0, "process", pid=4242), now=100.0) == []
    (write,) = t.observe(obs(KILLED_KERNEL, 100.5, "kernel"), now=100.6)
    inc = write.incident  # type: ignore[union-attr]
    assert (inc.event.killer, inc.event.killed_pid, inc.sources) == (
        "kernel",
        4242,
        ("kernel", "process"),
    )
    assert inc.summary == "Killed by kernel for lack of memory on main: pid 4242"


def test_a_kill_of_another_pid_is_another_failure() -> None:
    t = tracker()
    t.observe(obs(KILLED_PROCESS, 100.0, "process", pid=4242), now=100.0)
    other = replace(KILLED_KERNEL, killed_pid=777)
    (update,) = t.observe(obs(other, 100.1, "kernel"), now=100.1)
    assert isinstance(update, UpdateIncident) and update.incident.count == 2


def test_a_source_going_away_releases_the_pending_snapshot() -> None:
    t = tracker(settle_s=5.0)
    t.set_available_sources("main", ["log", "api"])
    t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    t.set_available_sources("main", ["log"])  # the websocket dropped
    assert kinds(t.tick(100.1)) == ["WriteSnapshot"]


def test_zero_settle_writes_at_once_even_when_the_api_is_expected() -> None:
    t = tracker(settle_s=0.0)
    t.set_available_sources("main", ["log", "api"])
    assert kinds(t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)) == ["WriteSnapshot"]


def test_a_resumed_incident_absorbs_the_storm_after_a_restart() -> None:
    first = tracker()
    (write,) = first.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    restarted = tracker()
    restarted.resume(write.incident, now=130.0)  # type: ignore[union-attr]
    (update,) = restarted.observe(obs(LOG_TRACEBACK, 140.0), now=140.0)
    assert isinstance(update, UpdateIncident)
    assert (update.incident.id, update.incident.count) == ("inc1", 2)


def test_merge_window_bounds_one_failure() -> None:
    t = tracker(merge_window_s=10.0)
    t.observe(obs(LOG_TRACEBACK, 100.0), now=100.0)
    # the API's report of "the same" failure 11 s later is too late to be the same failure
    (update,) = t.observe(obs(API_ERROR, 111.0, "api"), now=111.0)
    assert update.incident.count == 2  # type: ignore[union-attr]


def test_observations_kept_per_incident_are_bounded() -> None:
    t = tracker(max_observations=3, settle_s=10.0)
    t.set_available_sources("main", ["log", "api"])
    for i in range(10):
        t.observe(obs(replace(LOG_GOT_AN_OOM, rule=f"r{i}"), 100.0 + i * 0.01), now=100.0)
    (inc,) = t.open_incidents()
    assert len(inc.observations) == 3 and inc.count == 1


# --- pure helpers -----------------------------------------------------------------------------


def test_merge_events_takes_each_field_from_the_most_specific_source() -> None:
    kernel = replace(KILLED_KERNEL, pool=Pool.GPU, killed_pid=None, killer=None, rule="k")
    log = replace(LOG_TRACEBACK, node_type="FromLog", other_processes=(OtherProcess(9, GIB),))
    merged = merge_events(
        [obs(API_ERROR, 1.0, "api"), obs(log, 1.1, "log"), obs(kernel, 1.2, "kernel")]
    )
    assert merged.node_type == "KSampler"  # api before log for the node
    assert merged.requested_bytes == 2 * GIB  # log first for numbers
    assert merged.other_processes == (OtherProcess(9, GIB),)
    assert merged.recovered is False


def test_merge_events_keeps_every_fact_only_another_source_knows() -> None:
    """The log's record (first for numbers) knows nothing but "it was an OOM"; the API's
    error carries torch's whole message. Every fact the API read survives the merge, the
    older torch's reserved total and this process's whole use included (a hand-kept field
    list once dropped those two)."""
    api = replace(
        LOG_TRACEBACK,
        node_type="KSampler",
        node_id="3",
        reserved_bytes=22 * GIB,
        process_used_bytes=23 * GIB,
        reserved_unallocated_bytes=GIB,
        mps_other_bytes=5,
        mps_max_allowed_bytes=6,
        mps_allocated_bytes=7,
        killer="kernel",
        killed_pid=42,
        other_processes=(OtherProcess(9, GIB),),
        rule="execution-error",
    )
    merged = merge_events([obs(LOG_GOT_AN_OOM, 1.0, "log"), obs(api, 1.1, "api")])
    assert merged.reserved_bytes == 22 * GIB
    assert merged.process_used_bytes == 23 * GIB
    for name in MERGED_FIELDS:
        assert getattr(merged, name) == getattr(api, name) or name == "message", name
    assert merged.message == LOG_GOT_AN_OOM.message  # the log's own line, first for numbers


def test_merge_events_needs_an_observation() -> None:
    with pytest.raises(ValueError):
        merge_events([])


def test_fingerprint_ignores_numbers_but_not_node_or_family() -> None:
    a = incident_fingerprint("main", LOG_TRACEBACK)
    assert a == incident_fingerprint("main", replace(LOG_TRACEBACK, requested_bytes=1))
    assert a == incident_fingerprint("main", replace(LOG_TRACEBACK, pool=Pool.GPU_FRAGMENTATION))
    assert a != incident_fingerprint("main", replace(LOG_TRACEBACK, node_type="VAEDecode"))
    assert a != incident_fingerprint("other", LOG_TRACEBACK)
    assert a != incident_fingerprint("main", replace(LOG_TRACEBACK, pool=Pool.RAM))


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (LOG_GOT_AN_OOM, "GPU out of memory on main"),
        (
            replace(LOG_TRACEBACK, free_bytes=None),
            "GPU out of memory on main: tried to allocate 2.00 GiB, capacity 24.00 GiB",
        ),
        (
            OomEvent(Pool.RAM, Backend.CPU, False, "DefaultCPUAllocator", requested_bytes=3 * GIB),
            "System RAM exhausted on main: tried to allocate 3.00 GiB",
        ),
        (
            OomEvent(Pool.SWAP_PAGEFILE, Backend.CUDA, False, "os error 1455", node_type="X"),
            "Paging file / commit limit exhausted in X on main",
        ),
        (KILLED_PROCESS, "Killed by the OS for lack of memory on main: pid 4242"),
    ],
    ids=["no-numbers", "no-free", "ram", "pagefile-node", "killed-unknown-killer"],
)
def test_summary_line(event: OomEvent, expected: str) -> None:
    assert summarize("main", event) == expected


@pytest.mark.parametrize(
    ("event", "available", "expected"),
    [
        (LOG_TRACEBACK, {"log"}, {"log"}),
        (LOG_TRACEBACK, {"log", "api", "process", "kernel"}, {"log", "api"}),
        (KILLED_KERNEL, {"log", "api", "process", "kernel"}, {"process", "kernel"}),
        (KILLED_KERNEL, {"log", "api"}, set()),
    ],
    ids=["log-only", "python-oom", "kill", "kill-unwatched"],
)
def test_expected_sources(event: OomEvent, available: set[str], expected: set[str]) -> None:
    assert expected_sources(event, available) == frozenset(expected)


def test_config_from_settings() -> None:
    cfg = TrackerConfig.from_settings(Settings().incidents)
    assert (cfg.merge_window_s, cfg.storm_window_s, cfg.settle_s) == (10.0, 300.0, 1.0)


def test_close_carries_final_state() -> None:
    t = tracker()
    t.observe(obs(LOG_TRACEBACK, 0.0), now=0.0)
    t.observe(obs(LOG_TRACEBACK, 5.0), now=5.0)
    (close,) = t.tick(306.0)
    assert isinstance(close, CloseIncident) and close.incident.count == 2


# --- one incident per distinct failure (issue 11, item 1) --------------------------------------


def _node(event: OomEvent, node: str) -> OomEvent:
    return replace(event, node_type=node)


def test_a_different_node_inside_the_storm_window_is_its_own_incident() -> None:
    t = tracker(storm_window_s=300.0)
    writes: list[str] = []
    for i, node in enumerate(["KSampler", "VAEDecode", "ApplyInstantID", "SUPIR_Upscale"]):
        at = 100.0 + 30.0 * i
        for action in t.observe(obs(_node(LOG_TRACEBACK, node), at), now=at):
            if isinstance(action, WriteSnapshot):
                writes.append(action.incident.node_type or "")
    assert writes == ["KSampler", "VAEDecode", "ApplyInstantID", "SUPIR_Upscale"]
    assert sorted(i.count for i in t.open_incidents()) == [1, 1, 1, 1]
    # and a repeat of the second one joins it, not the newest
    actions = t.observe(obs(_node(LOG_TRACEBACK, "VAEDecode"), 300.0), now=300.0)
    assert [(type(a).__name__, a.incident.node_type, a.incident.count) for a in actions] == [  # type: ignore[union-attr]
        ("UpdateIncident", "VAEDecode", 2)
    ]


def test_a_different_workflow_is_its_own_incident_the_same_one_a_storm() -> None:
    t = tracker(settle_s=0.0)
    t.observe(obs(API_ERROR, 100.0, "api", prompt_id="p1", workflow_fingerprint="wf-a"), 100.0)
    other = t.observe(
        obs(API_ERROR, 110.0, "api", prompt_id="p2", workflow_fingerprint="wf-b"), 110.0
    )
    assert kinds(other) == ["WriteSnapshot"]
    again = t.observe(
        obs(API_ERROR, 120.0, "api", prompt_id="p3", workflow_fingerprint="wf-a"), 120.0
    )
    assert [(a.incident.workflow_fingerprint, a.incident.count) for a in again] == [("wf-a", 2)]  # type: ignore[union-attr]
    # the fingerprint the alerts group by stays (instance, family, exception, node)
    assert len({i.fingerprint for i in t.open_incidents()}) == 1


def test_a_field_only_one_side_knows_does_not_split_a_storm() -> None:
    t = tracker()
    t.observe(obs(_node(LOG_TRACEBACK, "KSampler"), 100.0), now=100.0)
    # a later log record that names no node is a repeat, not a new problem
    actions = t.observe(obs(LOG_TRACEBACK, 130.0), now=130.0)
    assert [(type(a).__name__, a.incident.count) for a in actions] == [("UpdateIncident", 2)]  # type: ignore[union-attr]


def test_one_failures_follow_up_record_joins_the_newest_failure() -> None:
    t = tracker()
    t.observe(obs(_node(LOG_TRACEBACK, "KSampler"), 100.0, record_id="r1"), now=100.0)
    t.observe(obs(_node(LOG_TRACEBACK, "VAEDecode"), 102.0, record_id="r2"), now=102.0)
    actions = t.observe(obs(LOG_GOT_AN_OOM, 102.05, record_id="r3"), now=102.05)
    (update,) = actions
    assert isinstance(update, UpdateIncident)
    assert update.incident.node_type == "VAEDecode" and update.incident.count == 1
    assert [(r.record_id, r.failure) for r in update.records] == [("r3", 1)]


# --- records counted once (issue 11, item 2) ---------------------------------------------------


def test_every_record_is_handed_out_once_with_its_failure_number() -> None:
    t = tracker()
    got: list[tuple[str, int]] = []
    for i in range(4):
        at = 100.0 + 5.0 * i
        for action in t.observe(obs(LOG_TRACEBACK, at, record_id=f"tb{i}"), now=at):
            if isinstance(action, (WriteSnapshot, UpdateIncident)):
                got += [(r.record_id, r.failure) for r in action.records]
        # the follow-up record of the same failure changes no count, yet is reported
        for action in t.observe(obs(LOG_GOT_AN_OOM, at + 0.05, record_id=f"got{i}"), now=at):
            assert isinstance(action, UpdateIncident)
            got += [(r.record_id, r.failure) for r in action.records]
    assert got == [(f"{k}{i}", i + 1) for i in range(4) for k in ("tb", "got")]
    assert t.tick(200.0) == []  # nothing handed out twice


def test_a_resumed_storm_knows_its_last_failure() -> None:
    first = tracker()
    (write,) = first.observe(obs(LOG_TRACEBACK, 100.0, record_id="a"), now=100.0)
    assert isinstance(write, WriteSnapshot)
    restarted = tracker()
    restarted.resume(write.incident, now=130.0, last_failure=write.records)
    # ComfyUI's second log call for the same OOM, read after the restart: same failure
    (update,) = restarted.observe(obs(LOG_GOT_AN_OOM, 101.0, record_id="b"), now=131.0)
    assert isinstance(update, UpdateIncident) and update.incident.count == 1
    # the next traceback is the next failure, although it is only 3 s later
    (update,) = restarted.observe(obs(LOG_TRACEBACK, 103.0, record_id="c"), now=132.0)
    assert isinstance(update, UpdateIncident) and update.incident.count == 2
    assert [(r.record_id, r.failure) for r in update.records] == [("c", 2)]

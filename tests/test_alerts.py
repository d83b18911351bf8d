"""The alert policy: a storm is one alert and a summary, limits hold, soft OOMs warn early."""

from __future__ import annotations

import json

import pytest

from oom_sentinel.daemon.alerts.policy import (
    AlertPolicy,
    HeldBackSummary,
    IncidentAlert,
    IncidentFacts,
    PolicyConfig,
    SoftOomAlert,
    SoftOomWarning,
    StormSummary,
)

T0 = 1_800_000_000.0


def facts(
    incident_id: str = "inc1",
    *,
    group: str = "fp-gpu-ksampler",
    count: int = 1,
    at: float = T0,
    instance: str = "main",
    snapshot_id: str | None = "20270115T080000Z_gpu_KSampler",
) -> IncidentFacts:
    return IncidentFacts(
        incident_id=incident_id,
        group=group,
        instance=instance,
        pool="gpu",
        count=count,
        first_seen_s=at,
        last_seen_s=at,
        summary=f"GPU out of memory in KSampler on {instance}",
        snapshot_id=snapshot_id,
        snapshot_path=f"/var/lib/oom-sentinel/snapshots/{snapshot_id}",
    )


def test_first_incident_alerts_at_once() -> None:
    policy = AlertPolicy(PolicyConfig())
    out = policy.on_incident_written(facts(), T0)
    assert len(out) == 1
    alert = out[0]
    assert isinstance(alert, IncidentAlert)
    assert alert.key == "incident:inc1"
    assert alert.facts.snapshot_id == "20270115T080000Z_gpu_KSampler"


def test_storm_is_one_alert_then_one_summary_when_it_ends() -> None:
    cfg = PolicyConfig(group_window_s=300, repeat_interval_s=14400)
    policy = AlertPolicy(cfg)
    sent = policy.on_incident_written(facts(count=1), T0)
    # 29 more failures join the incident over ten minutes: nothing is sent meanwhile
    for n in range(2, 31):
        sent += policy.on_incident_updated(facts(count=n, at=T0 + n * 20), T0 + n * 20)
        sent += policy.tick(T0 + n * 20 + 1)
    assert [type(i) for i in sent] == [IncidentAlert]
    assert policy.pending_failures("fp-gpu-ksampler") == 29
    # the storm window passes: the tracker closes the incident; one summary follows
    closed_at = T0 + 600 + 300
    sent = policy.on_incident_closed(facts(count=30, at=T0 + 600), closed_at)
    assert len(sent) == 1
    summary = sent[0]
    assert isinstance(summary, StormSummary)
    assert summary.failures == 29
    assert summary.ended is True
    assert summary.previous_s == T0
    assert summary.latest is not None and summary.latest.snapshot_id
    assert policy.tick(closed_at + 10_000) == []


def test_summary_waits_for_the_group_window_after_the_alert() -> None:
    policy = AlertPolicy(PolicyConfig(group_window_s=300))
    policy.on_incident_written(facts(count=1), T0)
    policy.on_incident_updated(facts(count=3, at=T0 + 5), T0 + 5)
    # closed quickly (short storm window): too soon after the alert for a follow-up
    assert policy.on_incident_closed(facts(count=3, at=T0 + 5), T0 + 60) == []
    assert policy.tick(T0 + 299) == []
    due = policy.tick(T0 + 300)
    assert len(due) == 1 and isinstance(due[0], StormSummary) and due[0].failures == 2


def test_a_storm_that_goes_on_is_reminded_each_repeat_interval() -> None:
    policy = AlertPolicy(PolicyConfig(group_window_s=300, repeat_interval_s=3600))
    policy.on_incident_written(facts(count=1), T0)
    reminders = []
    count = 1
    for minute in range(1, 181):  # three hours, one failure a minute, never closed
        count += 1
        now = T0 + minute * 60
        reminders += policy.on_incident_updated(facts(count=count, at=now), now)
    assert [type(r) for r in reminders] == [StormSummary, StormSummary, StormSummary]
    assert all(not r.ended for r in reminders if isinstance(r, StormSummary))
    assert [r.failures for r in reminders if isinstance(r, StormSummary)] == [60, 60, 60]


def test_a_new_incident_of_the_same_group_is_folded_until_the_repeat_interval() -> None:
    policy = AlertPolicy(PolicyConfig(group_window_s=300, repeat_interval_s=3600))
    policy.on_incident_written(facts("a"), T0)
    policy.on_incident_closed(facts("a"), T0 + 300)
    # same failure again 20 minutes later: a new snapshot, but no new alert...
    out = policy.on_incident_written(facts("b", at=T0 + 1200), T0 + 1200)
    assert out == []
    # ...it is summed up once its own storm is over
    out = policy.on_incident_closed(facts("b", at=T0 + 1200), T0 + 1500)
    assert len(out) == 1 and isinstance(out[0], StormSummary)
    assert (out[0].failures, out[0].incidents) == (1, 1)
    assert out[0].latest is not None and out[0].latest.incident_id == "b"
    # after the repeat interval a new incident is alerted in full again
    out = policy.on_incident_written(facts("c", at=T0 + 6000), T0 + 6000)
    assert [type(i) for i in out] == [IncidentAlert]


def test_different_groups_alert_separately() -> None:
    policy = AlertPolicy(PolicyConfig())
    a = policy.on_incident_written(facts("a", group="gpu-main"), T0)
    b = policy.on_incident_written(facts("b", group="ram-main"), T0 + 1)
    c = policy.on_incident_written(facts("c", group="gpu-other", instance="other"), T0 + 2)
    assert [len(a), len(b), len(c)] == [1, 1, 1]


def test_rate_limit_holds_back_and_summarises_when_a_slot_frees() -> None:
    policy = AlertPolicy(PolicyConfig(max_per_hour=3))
    sent = []
    for n in range(6):
        sent += policy.on_incident_written(facts(f"i{n}", group=f"g{n}"), T0 + n)
    assert [type(i) for i in sent] == [IncidentAlert] * 3
    assert policy.tick(T0 + 3599) == []
    out = policy.tick(T0 + 3601)  # the first alert left the window
    assert len(out) == 1 and isinstance(out[0], HeldBackSummary)
    assert out[0].count == 3 and len(out[0].samples) == 3
    assert "snapshot 20270115T080000Z_gpu_KSampler" in out[0].samples[0]


def test_no_rate_limit_when_zero() -> None:
    policy = AlertPolicy(PolicyConfig(max_per_hour=0))
    sent = []
    for n in range(50):
        sent += policy.on_incident_written(facts(f"i{n}", group=f"g{n}"), T0 + n)
    assert len(sent) == 50


def test_recovered_soft_ooms_never_alert_by_default() -> None:
    policy = AlertPolicy(PolicyConfig(soft_oom_warning_count=0))
    out = []
    for n in range(100):
        out += policy.on_soft_oom("main", T0 + n, T0 + n)
    assert out == []


def test_rising_rate_of_soft_ooms_warns_once_then_rearms_after_it_falls() -> None:
    cfg = PolicyConfig(soft_oom_warning_count=5, soft_oom_warning_window_s=600)
    policy = AlertPolicy(cfg)
    out = []
    # one every five minutes: at most two in a window, never a warning
    for n in range(6):
        out += policy.on_soft_oom("main", T0 + n * 300, T0 + n * 300)
    assert out == []
    # then one a minute: the fifth within ten minutes warns, once
    start = T0 + 3000
    for n in range(10):
        out += policy.on_soft_oom("main", start + n * 60, start + n * 60)
    assert len(out) == 1 and isinstance(out[0], SoftOomWarning)
    assert out[0].instance == "main" and out[0].count >= 5
    # quiet for a while (the rate falls below half): it re-arms, the next burst warns again
    later = start + 3000
    assert policy.tick(later) == []
    burst = []
    for n in range(5):
        burst += policy.on_soft_oom("main", later + n * 10, later + n * 10)
    assert len(burst) == 1 and isinstance(burst[0], SoftOomWarning)


def test_old_soft_ooms_read_late_do_not_warn() -> None:
    policy = AlertPolicy(PolicyConfig(soft_oom_warning_count=3, soft_oom_warning_window_s=600))
    out = []
    for n in range(10):  # catching up on a log of yesterday
        out += policy.on_soft_oom("main", T0 - 86400 + n, T0)
    assert out == []


def test_send_recovered_alerts_each_soft_oom_grouped() -> None:
    policy = AlertPolicy(
        PolicyConfig(send_recovered=True, soft_oom_warning_count=0, group_window_s=300)
    )
    first = policy.on_soft_oom("main", T0, T0, message="retrying with tiled VAE")
    assert len(first) == 1 and isinstance(first[0], SoftOomAlert)
    more = []
    for n in range(1, 4):
        more += policy.on_soft_oom("main", T0 + n, T0 + n)
    assert more == []
    summary = policy.tick(T0 + 300)
    assert len(summary) == 1 and isinstance(summary[0], StormSummary)
    assert summary[0].soft and summary[0].failures == 3


def test_state_survives_a_restart() -> None:
    cfg = PolicyConfig(group_window_s=300, repeat_interval_s=3600, max_per_hour=10)
    policy = AlertPolicy(cfg)
    policy.on_incident_written(facts(count=1), T0)
    policy.on_incident_updated(facts(count=4, at=T0 + 30), T0 + 30)
    state = json.loads(json.dumps(policy.to_state()))  # what the store keeps
    resumed = AlertPolicy(cfg, state)
    # the incident written before the restart is not alerted again
    assert resumed.on_incident_written(facts(count=4), T0 + 40) == []
    out = resumed.on_incident_closed(facts(count=6, at=T0 + 60), T0 + 400)
    assert len(out) == 1 and isinstance(out[0], StormSummary) and out[0].failures == 5


@pytest.mark.parametrize(
    "state",
    [{}, {"version": 99}, {"version": 1, "groups": "junk", "soft": [], "held": None}],
    ids=["empty", "newer", "junk"],
)
def test_unreadable_state_starts_afresh(state: dict[str, object]) -> None:
    policy = AlertPolicy(PolicyConfig(), state)
    assert len(policy.on_incident_written(facts(), T0)) == 1

"""The watcher's bookkeeping for prompts too fast to be seen in ``/queue``, in orders of
events a real server produces only by chance (a status broadcast overtaking a ``/queue``
answer computed before its prompt was queued). The watcher is driven directly; its client is
a scripted stand-in for ``ComfyClient`` answering from in-memory queue and history state.
The same paths against a real server: tests/test_comfy_watch.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from oom_sentinel.daemon.comfy.api import HistoryEntry, QueueState
from oom_sentinel.daemon.comfy.watch import PromptDone, WatchOptions, _InstanceWatch

PROMPT = {"1": {"class_type": "EmptyImage", "inputs": {}}}


def history_entry(prompt_id: str, number: int, ended_ms: int = 1001) -> HistoryEntry:
    return HistoryEntry.from_json(
        prompt_id,
        {
            "prompt": [number, prompt_id, PROMPT, {"client_id": "browser"}, ["1"]],
            "outputs": {},
            "status": {
                "status_str": "success",
                "completed": True,
                "messages": [
                    ["execution_start", {"prompt_id": prompt_id, "timestamp": ended_ms - 1}],
                    ["execution_success", {"prompt_id": prompt_id, "timestamp": ended_ms}],
                ],
            },
            "meta": {},
        },
    )


class ScriptedClient:
    """What the watcher asks of ComfyClient, answered from ``queue_state`` and ``done``."""

    def __init__(self) -> None:
        self.queue_state = QueueState((), ())
        self.done: dict[str, HistoryEntry] = {}
        self.history_reads = 0

    async def queue(self) -> QueueState:
        return self.queue_state

    async def history(self, max_items: int | None = None) -> dict[str, HistoryEntry]:
        self.history_reads += 1
        newest = list(self.done.items())[-(max_items or len(self.done)) :]
        return dict(reversed(newest))

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None:
        return self.done.get(prompt_id)

    async def system_stats(self) -> Any:
        raise ConnectionError("not asked for successes")

    async def internal_logs(self) -> Any:
        raise ConnectionError("not asked for successes")


def status(remaining: int) -> Mapping[str, Any]:
    return {"status": {"exec_info": {"queue_remaining": remaining}}}


def make_watch(options: WatchOptions | None = None) -> tuple[_InstanceWatch, list[Any]]:
    got: list[Any] = []
    watch = _InstanceWatch(
        "main", "http://127.0.0.1:1", got.append, options or WatchOptions(), lambda: 0.0
    )
    watch.ws_up = True
    watch._on_status(status(0))  # ComfyUI greets a new websocket with the current status
    return watch, got


def done_ids(got: list[Any]) -> list[str]:
    return [m.prompt_id for m in got if isinstance(m, PromptDone)]


def test_a_prompt_announced_before_a_stale_empty_queue_answer_is_still_reported() -> None:
    async def scenario() -> list[str]:
        watch, got = make_watch()
        client = ScriptedClient()
        watch._on_status(status(1))  # X queued: its broadcast arrives ...
        await watch._poll(client)  # ... with a /queue answer from before X: empty
        assert done_ids(got) == []  # X is not in history yet: nothing to report
        client.done["X"] = history_entry("X", 0)  # X ran and finished between two polls
        watch._on_status(status(0))
        await watch._poll(client)
        return done_ids(got)

    assert asyncio.run(scenario()) == ["X"]


def test_no_history_is_read_when_every_prompt_that_went_out_was_reported() -> None:
    async def scenario() -> tuple[list[str], int]:
        watch, got = make_watch()
        client = ScriptedClient()
        item = history_entry("Y", 0).item
        assert item is not None
        watch._on_status(status(1))
        client.queue_state = QueueState((item,), ())
        await watch._poll(client)  # Y seen running
        client.queue_state = QueueState((), ())
        client.done["Y"] = history_entry("Y", 0)
        watch._on_status(status(0))
        await watch._poll(client)  # Y gone from the queue: its own history entry is read
        return done_ids(got), client.history_reads

    ids, sweeps = asyncio.run(scenario())
    assert ids == ["Y"]
    assert sweeps == 0


def test_prompts_seen_only_as_broadcasts_are_all_found_in_one_sweep() -> None:
    async def scenario() -> list[str]:
        watch, got = make_watch()
        client = ScriptedClient()
        for n, pid in enumerate(("A", "B", "C")):  # each queued and done between two polls
            watch._on_status(status(1))
            client.done[pid] = history_entry(pid, n)
            watch._on_status(status(0))
        await watch._poll(client)
        return done_ids(got)

    assert sorted(asyncio.run(scenario())) == ["A", "B", "C"]


def test_backfilled_prompts_do_not_count_as_prompts_that_went_out() -> None:
    async def scenario() -> list[str]:
        watch, got = make_watch()
        client = ScriptedClient()
        client.done["old1"] = history_entry("old1", 0)  # ran before the watcher connected
        client.done["old2"] = history_entry("old2", 1)
        await watch._backfill(client)
        watch._on_status(status(1))  # Z: queued and done between two polls ...
        await watch._poll(client)  # ... the first poll's answer predates it
        client.done["Z"] = history_entry("Z", 2)
        watch._on_status(status(0))
        await watch._poll(client)
        return done_ids(got)

    assert asyncio.run(scenario()) == ["old2", "old1", "Z"]


def test_prompts_missed_anywhere_in_a_long_busy_spell_are_all_found() -> None:
    """200 prompts went out while the queue never emptied; the watcher saw all but three of
    them, and those three are old, far from the newest entries."""

    async def scenario() -> list[str]:
        watch, got = make_watch()
        client = ScriptedClient()
        for n in range(200):
            pid = f"p{n:03d}"
            watch._on_status(status(1))
            client.done[pid] = history_entry(pid, n)
            watch._on_status(status(0))
            if n not in (5, 17, 40):
                watch.reported.add(pid)  # seen and reported as it ran
                watch.seen_new += 1
                watch.reported_new += 1
        await watch._poll(client)
        return done_ids(got)

    assert sorted(asyncio.run(scenario())) == ["p005", "p017", "p040"]


def test_the_first_backfill_reads_history_back_to_when_a_daemon_last_watched() -> None:
    """300 prompts ran while no daemon watched (after ``backfill_since_s``), more before."""

    async def scenario() -> tuple[list[str], int]:
        watch, got = make_watch(WatchOptions(backfill_since_s=1000.0))
        client = ScriptedClient()
        for n in range(500):
            ended_ms = (900_000 if n < 200 else 1_000_500) + n
            client.done[f"p{n:03d}"] = history_entry(f"p{n:03d}", n, ended_ms=ended_ms)
        await watch._backfill(client)
        return done_ids(got), client.history_reads

    ids, reads = asyncio.run(scenario())
    assert {f"p{n:03d}" for n in range(200, 500)} <= set(ids)
    # pages of 64 and 256 held only prompts after it, the third reached older ones (those are
    # recorded as runs by the service, not alarmed on: they end before its horizon)
    assert reads == 3


def test_a_reconnect_backfill_reads_back_to_the_newest_prompt_already_reported() -> None:
    async def scenario() -> tuple[list[str], int]:
        watch, got = make_watch()
        watch._first_session = False  # the daemon already watched this server
        client = ScriptedClient()
        for n in range(400):
            client.done[f"p{n:03d}"] = history_entry(f"p{n:03d}", n)
            if n < 100:
                watch.reported.add(f"p{n:03d}")
        await watch._backfill(client)
        return done_ids(got), client.history_reads

    ids, reads = asyncio.run(scenario())
    assert sorted(ids) == [f"p{n:03d}" for n in range(100, 400)]
    assert reads == 3  # 64, 256, then 1024 reached p099


def test_a_prompt_whose_broadcasts_were_lost_is_found_by_the_idle_safety_poll() -> None:
    """A websocket that dropped and came back (or a broadcast lost under load) counted nothing
    for a prompt queued and done in between; the idle timer's poll reads the newest history
    entry and finds it. A poll a broadcast woke reads no history when nothing is missing."""

    async def scenario() -> tuple[list[str], list[str], int]:
        watch, got = make_watch()
        client = ScriptedClient()
        client.done["Z"] = history_entry("Z", 0)  # no status broadcast ever counted it
        await watch._poll(client)  # woken by a kick: the counters say nothing is missing
        after_kick = done_ids(got)
        reads = client.history_reads
        await watch._poll(client, safety=True)
        return after_kick, done_ids(got), reads

    after_kick, after_safety, reads = asyncio.run(scenario())
    assert (after_kick, reads) == ([], 0)
    assert after_safety == ["Z"]

"""The watcher's bookkeeping for prompts too fast to be seen in ``/queue``, in orders of
events a real server produces only by chance (a status broadcast overtaking a ``/queue``
answer computed before its prompt was queued). The watcher is driven directly; its client is
a scripted stand-in for ``ComfyClient`` answering from in-memory queue and history state.
The same paths against a real server: tests/test_comfy_watch.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from oom_sentinel.daemon.comfy_api import HistoryEntry, QueueState
from oom_sentinel.daemon.comfy_watch import PromptDone, WatchOptions, _InstanceWatch

PROMPT = {"1": {"class_type": "EmptyImage", "inputs": {}}}


def history_entry(prompt_id: str, number: int) -> HistoryEntry:
    return HistoryEntry.from_json(
        prompt_id,
        {
            "prompt": [number, prompt_id, PROMPT, {"client_id": "browser"}, ["1"]],
            "outputs": {},
            "status": {
                "status_str": "success",
                "completed": True,
                "messages": [
                    ["execution_start", {"prompt_id": prompt_id, "timestamp": 1000}],
                    ["execution_success", {"prompt_id": prompt_id, "timestamp": 1001}],
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


def make_watch() -> tuple[_InstanceWatch, list[Any]]:
    got: list[Any] = []
    watch = _InstanceWatch("main", "http://127.0.0.1:1", got.append, WatchOptions(), lambda: 0.0)
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

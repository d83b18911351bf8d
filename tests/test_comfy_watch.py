"""The API watcher against the stand-in ComfyUI run as a real process on 127.0.0.1.

Our websocket hears only ``status`` broadcasts (the execution messages go to the posting
client), so everything here is what the watcher learns from ``/queue`` and ``/history`` --
the prompts are posted by the test with a client id of its own, like a browser tab would.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from standin_proc import StandinProcess, start_standin

from oom_sentinel.daemon.classify.events import Pool
from oom_sentinel.daemon.comfy.api import HistoryEntry
from oom_sentinel.daemon.comfy.watch import (
    ApiContext,
    ApiStatus,
    ComfyWatcher,
    PromptDone,
    PromptStarted,
    WatchMessage,
    WatchOptions,
    done_from_history,
    logs_tail,
    next_backoff_s,
)
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

MIB = 1024 * 1024
M = TypeVar("M")


class Inbox:
    """What the watcher hands over, as the service's inbox would receive it."""

    def __init__(self) -> None:
        self.q: queue.Queue[WatchMessage] = queue.Queue()
        self.seen: list[WatchMessage] = []

    def __call__(self, message: WatchMessage) -> None:
        self.q.put(message)

    def next(
        self, kind: type[M], pred: Callable[[M], bool] = lambda m: True, timeout_s: float = 30.0
    ) -> M:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind.__name__} within {timeout_s} s; got {self.seen}")
            try:
                message = self.q.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(message)
            if isinstance(message, kind) and pred(message):
                return message

    def drain(self, seconds: float) -> list[WatchMessage]:
        out: list[WatchMessage] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                out.append(self.q.get(timeout=left))
            except queue.Empty:
                break
        self.seen.extend(out)
        return out


def one_node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {
        "1": {"class_type": class_type, "inputs": inputs},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def post(srv: StandinProcess, prompt: dict[str, Any], **extra: Any) -> str:
    return srv.post_prompt(prompt, client_id="browser", **extra)


def wait_history(srv: StandinProcess, prompt_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not srv.get_json(f"/history/{prompt_id}"):
        assert time.monotonic() < deadline, f"{prompt_id} never finished"
        time.sleep(0.05)


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def watcher(inbox: Inbox) -> Iterator[ComfyWatcher]:
    w = ComfyWatcher(inbox)
    w.start()
    yield w
    w.stop()


@pytest.fixture
def srv(standin: Callable[..., StandinProcess]) -> StandinProcess:
    return standin()


# ---- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "expected"),
    [(0.0, 0.1), (0.1, 0.2), (0.8, 1.6), (1.6, 2.0), (2.0, 2.0)],
    ids=["floor", "double", "double-again", "clamp", "stay"],
)
def test_reconnect_backoff_doubles_up_to_the_cap(current: float, expected: float) -> None:
    assert next_backoff_s(current, WatchOptions()) == pytest.approx(expected)


def test_logs_tail_keeps_the_last_lines() -> None:
    lines = [f"2026-01-01T00:00:0{i}.000000 - line {i}\n" for i in range(5)]
    text = "".join(lines)
    assert logs_tail(text, 2) == lines[3] + lines[4]
    assert logs_tail(text, 100) == text
    assert logs_tail(None, 3) is None


def history_entry(messages: list[list[Any]], status_str: str = "error") -> HistoryEntry:
    prompt = one_node("KSampler", seed=1)
    extra = {"client_id": "c", "extra_pnginfo": {"workflow": {"id": "wf"}}}
    raw = {
        "prompt": [7, "pid-1", prompt, extra, ["2"]],
        "outputs": {},
        "status": {
            "status_str": status_str,
            "completed": status_str == "success",
            "messages": messages,
        },
        "meta": {},
    }
    return HistoryEntry.from_json("pid-1", raw)


OOM_ERROR = {
    "prompt_id": "pid-1",
    "node_id": "1",
    "node_type": "KSampler",
    "executed": [],
    "exception_message": "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which 1.00 GiB is free.\n",
    "exception_type": "torch.OutOfMemoryError",
    "traceback": [],
    "current_inputs": {},
    "current_outputs": ["1", "2"],
    "timestamp": 1_800_000_002_500,
}


def test_an_oom_in_history_is_an_api_observation_of_that_prompt() -> None:
    entry = history_entry(
        [
            ["execution_start", {"prompt_id": "pid-1", "timestamp": 1_800_000_000_000}],
            [
                "execution_cached",
                {"nodes": [], "prompt_id": "pid-1", "timestamp": 1_800_000_000_001},
            ],
            ["execution_error", OOM_ERROR],
        ]
    )
    done = done_from_history("main", entry, seen_s=1_800_000_003.0)
    assert done.outcome == "error" and done.prompt_id == "pid-1" and done.number == 7
    assert (done.started_s, done.ended_s) == (1_800_000_000.0, 1_800_000_002.5)
    assert done.workflow == {"id": "wf"} and done.prompt == one_node("KSampler", seed=1)
    assert done.event is not None and done.event.pool is Pool.GPU
    obs = done.observation
    assert obs is not None and obs.source == "api" and obs.instance == "main"
    assert obs.at_s == 1_800_000_002.5
    assert obs.evidence == {
        "prompt_id": "pid-1",
        "node_id": "1",
        "node_type": "KSampler",
        "exception_type": "torch.OutOfMemoryError",
        "number": 7,
    }
    assert obs.event.node_type == "KSampler" and obs.event.requested_bytes == 2 * 1024**3


@pytest.mark.parametrize(
    ("messages", "status_str", "outcome"),
    [
        ([["execution_success", {"prompt_id": "pid-1", "timestamp": 5}]], "success", "success"),
        (
            [["execution_interrupted", {"prompt_id": "pid-1", "node_id": "1", "timestamp": 5}]],
            "error",
            "interrupted",
        ),
        (
            [
                [
                    "execution_error",
                    {**OOM_ERROR, "exception_message": "boom", "exception_type": "ValueError"},
                ]
            ],
            "error",
            "error",
        ),
        ([], "success", "success"),  # an old ComfyUI that kept no messages
    ],
    ids=["success", "interrupted", "other-error", "no-messages"],
)
def test_outcomes_without_an_oom_carry_no_observation(
    messages: list[list[Any]], status_str: str, outcome: str
) -> None:
    done = done_from_history("main", history_entry(messages, status_str), seen_s=1.0)
    assert done.outcome == outcome and done.observation is None and done.event is None


# ---- against the stand-in ----------------------------------------------------------------------


def test_connecting_reports_the_api_with_its_system_stats(
    watcher: ComfyWatcher, inbox: Inbox, srv: StandinProcess
) -> None:
    watcher.set_instances({"main": srv.url})
    up = inbox.next(ApiStatus)
    assert up.connected and up.instance == "main" and up.url == srv.url
    assert up.system_stats is not None and up.system_stats["system"]["comfyui_version"]
    assert up.websocket is True
    assert watcher.connected() == {"main": True}


def test_a_running_prompt_is_captured_at_once_and_its_outcome_read_from_history(
    watcher: ComfyWatcher, inbox: Inbox, srv: StandinProcess
) -> None:
    watcher.set_instances({"main": srv.url})
    inbox.next(ApiStatus)
    workflow = {"id": "wf-7", "nodes": [{"id": 1, "type": "Sleep"}], "links": []}
    prompt = one_node("Sleep", seconds=1.0)
    pid = post(srv, prompt, extra_data={"extra_pnginfo": {"workflow": workflow}})
    started = inbox.next(PromptStarted)
    assert started.prompt_id == pid and started.prompt == prompt
    assert started.workflow == workflow and started.client_id == "browser"
    context = inbox.next(ApiContext)
    assert context.system_stats is not None and "got prompt" in (context.internal_logs or "")
    done = inbox.next(PromptDone)
    assert done.prompt_id == pid and done.outcome == "success" and not done.backfill
    assert done.started_s is not None and done.ended_s is not None
    assert done.ended_s - done.started_s >= 0.9  # ComfyUI's own times, not ours
    assert done.observation is None and done.node_count == 2 and done.cached_nodes == ()


def test_an_oom_becomes_an_observation_with_comfyuis_view_of_memory(
    watcher: ComfyWatcher, inbox: Inbox, standin: Callable[..., StandinProcess], tmp_path: Path
) -> None:
    gpu = tmp_path / "gpu"
    FakeGpuDir(gpu).create([FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)])
    srv = standin(fake_gpu=gpu)
    watcher.set_instances({"main": srv.url})
    inbox.next(ApiStatus)
    pid = post(srv, one_node("AllocateVRAM", mib=9000))
    done = inbox.next(PromptDone)
    assert done.prompt_id == pid and done.outcome == "error"
    obs = done.observation
    assert obs is not None and obs.source == "api"
    assert obs.event.pool is Pool.GPU and obs.event.node_type == "AllocateVRAM"
    assert obs.evidence["prompt_id"] == pid and obs.evidence["node_id"] == "1"
    assert obs.evidence["exception_type"] == "torch.OutOfMemoryError"
    assert done.error is not None and done.error["node_type"] == "AllocateVRAM"
    assert done.system_stats is not None
    assert done.system_stats["devices"][0]["type"] == "cuda"
    assert done.internal_logs is not None and "Got an OOM" in done.internal_logs


def test_an_error_that_is_not_an_oom_is_an_outcome_only(
    watcher: ComfyWatcher, inbox: Inbox, srv: StandinProcess
) -> None:
    watcher.set_instances({"main": srv.url})
    inbox.next(ApiStatus)
    pid = post(srv, one_node("Fail", message="bad input", exception="ValueError"))
    done = inbox.next(PromptDone)
    assert done.prompt_id == pid and done.outcome == "error"
    assert done.observation is None and done.error is not None
    assert done.error["exception_type"] == "ValueError"


def test_prompts_too_fast_for_the_queue_poll_are_each_reported_once(
    watcher: ComfyWatcher, inbox: Inbox, srv: StandinProcess
) -> None:
    watcher.set_instances({"main": srv.url})
    inbox.next(ApiStatus)
    ids = [
        post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=c))
        for c in range(6)
    ]
    for pid in ids:
        wait_history(srv, pid)
    reported: list[str] = []
    deadline = time.monotonic() + 30
    while set(reported) != set(ids) and time.monotonic() < deadline:
        reported.append(inbox.next(PromptDone, timeout_s=deadline - time.monotonic()).prompt_id)
    reported += [m.prompt_id for m in inbox.drain(1.5) if isinstance(m, PromptDone)]
    assert sorted(reported) == sorted(ids)


def test_prompts_that_ran_before_the_watcher_connected_are_backfilled(
    watcher: ComfyWatcher, inbox: Inbox, srv: StandinProcess
) -> None:
    pid = post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=1))
    wait_history(srv, pid)
    watcher.set_instances({"main": srv.url})
    done = inbox.next(PromptDone)
    assert done.prompt_id == pid and done.backfill and done.outcome == "success"


def test_an_interrupted_prompt_and_a_deleted_pending_one(
    watcher: ComfyWatcher, inbox: Inbox, srv: StandinProcess
) -> None:
    watcher.set_instances({"main": srv.url})
    inbox.next(ApiStatus)
    running = post(srv, one_node("Sleep", seconds=30.0))
    inbox.next(PromptStarted, lambda m: m.prompt_id == running)
    pending = post(srv, one_node("Sleep", seconds=0.5))
    time.sleep(0.5)  # seen pending
    assert srv.post_json("/queue", {"delete": [pending]})[0] == 200
    assert srv.post_json("/interrupt", {"prompt_id": running})[0] == 200
    done = inbox.next(PromptDone)
    assert done.prompt_id == running and done.outcome == "interrupted"
    later = [m for m in inbox.drain(1.0) if isinstance(m, PromptDone | PromptStarted)]
    assert later == [], "a prompt deleted before it ran is no run"


def test_a_restart_is_followed_and_the_running_prompt_reported_lost(
    watcher: ComfyWatcher, inbox: Inbox, tmp_path: Path
) -> None:
    first = start_standin(tmp_path / "a")
    second: StandinProcess | None = None
    try:
        watcher.set_instances({"main": first.url})
        inbox.next(ApiStatus, lambda m: m.connected)
        prompt = one_node("Sleep", seconds=60.0)
        pid = post(first, prompt)
        inbox.next(PromptStarted, lambda m: m.prompt_id == pid)
        first.kill()
        lost = inbox.next(PromptDone)
        assert lost.prompt_id == pid and lost.outcome == "lost" and lost.prompt == prompt
        assert inbox.next(ApiStatus).connected is False
        second = start_standin(tmp_path / "b", port=first.port)
        assert inbox.next(ApiStatus).connected is True
        after = post(second, one_node("EmptyImage", width=8, height=8, batch_size=1, color=2))
        done = inbox.next(PromptDone)
        assert done.prompt_id == after and done.outcome == "success"
    finally:
        first.kill()
        if second is not None:
            second.stop()


def test_instances_can_be_dropped_and_the_thread_stopped(inbox: Inbox, srv: StandinProcess) -> None:
    w = ComfyWatcher(inbox)
    w.start()
    worker = w.worker
    assert worker.is_alive()
    try:
        w.set_instances({"main": srv.url})
        inbox.next(ApiStatus)
        w.set_instances({})
        time.sleep(0.3)
        assert tuple(w.watched()) == ()
        post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=3))
        assert [m for m in inbox.drain(1.0) if isinstance(m, PromptDone)] == []
    finally:
        w.stop()
    assert not worker.is_alive() and worker.error is None


def test_without_a_websocket_polling_still_reports_every_prompt_once(
    inbox: Inbox, srv: StandinProcess
) -> None:
    w = ComfyWatcher(inbox, WatchOptions(websocket=False))
    w.start()
    try:
        w.set_instances({"main": srv.url})
        up = inbox.next(ApiStatus)
        assert up.connected and up.websocket is False
        slow = post(srv, one_node("Sleep", seconds=2.5))
        assert inbox.next(PromptStarted).prompt_id == slow
        assert inbox.next(PromptDone).prompt_id == slow
        fast = [
            post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=c))
            for c in range(40, 43)
        ]
        for pid in fast:
            wait_history(srv, pid)
        reported: list[str] = []
        while set(reported) != set(fast):
            reported.append(inbox.next(PromptDone).prompt_id)
        reported += [m.prompt_id for m in inbox.drain(2.5) if isinstance(m, PromptDone)]
        assert sorted(reported) == sorted(fast)
    finally:
        w.stop()


def test_prompts_whose_status_broadcasts_never_came_are_found_by_the_idle_safety_poll(
    inbox: Inbox, standin: Callable[..., StandinProcess]
) -> None:
    """A websocket that is up but carries no status broadcasts (lost, or a proxy that drops
    them): nothing counts the fast prompts, and the idle timer's poll still finds each once."""
    srv = standin(env={"OOM_STANDIN_WS_DROP": "status"})
    w = ComfyWatcher(inbox, WatchOptions(idle_poll_s=0.5))
    w.start()
    try:
        w.set_instances({"main": srv.url})
        up = inbox.next(ApiStatus)
        assert up.connected and up.websocket is True
        fast = [
            post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=c))
            for c in range(50, 53)
        ]
        for pid in fast:
            wait_history(srv, pid)
        reported: list[str] = []
        deadline = time.monotonic() + 30
        while set(reported) != set(fast) and time.monotonic() < deadline:
            reported.append(inbox.next(PromptDone, timeout_s=deadline - time.monotonic()).prompt_id)
        reported += [m.prompt_id for m in inbox.drain(1.5) if isinstance(m, PromptDone)]
        assert sorted(reported) == sorted(fast)
    finally:
        w.stop()

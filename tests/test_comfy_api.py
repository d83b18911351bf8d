"""ComfyClient reads ComfyUI's API into typed records and turns one prompt into one outcome
(comfyui-facts.md 1.11), tested against the stand-in ComfyUI running as a real process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from standin_proc import StandinProcess, start_standin

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.daemon.comfy.api import (
    ComfyClient,
    HistoryEntry,
    PostResult,
    QueueItem,
    SystemStats,
)
from oom_sentinel.daemon.core.errors import ComfyError

T = TypeVar("T")


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await factory()

    return asyncio.run(main())


def one_node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {
        "1": {"class_type": class_type, "inputs": inputs},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    proc = start_standin(tmp_path_factory.mktemp("client-standin"))
    yield proc
    proc.stop()


# ---- records from raw JSON (no server) ---------------------------------------------------------
def test_queue_item_exposes_prompt_workflow_and_client() -> None:
    raw = [
        3,
        "p-1",
        {"1": {"class_type": "EmptyImage", "inputs": {}}},
        {
            "client_id": "c",
            "create_time": 1767000000000,
            "extra_pnginfo": {"workflow": {"id": "wf"}},
        },
        ["9"],
    ]
    item = QueueItem.from_json(raw)
    assert (item.number, item.prompt_id, item.outputs_to_execute) == (3.0, "p-1", ("9",))
    assert item.client_id == "c" and item.create_time_ms == 1767000000000
    assert item.workflow == {"id": "wf"}
    assert QueueItem.from_json([0, "p", {}]).workflow is None


@pytest.mark.parametrize(
    "raw",
    [None, "text", [1, 2], {"prompt": 1}],
    ids=["null", "string", "too-short", "object"],
)
def test_malformed_queue_items_are_refused(raw: Any) -> None:
    with pytest.raises(ValueError):
        QueueItem.from_json(raw)


def test_history_entry_from_an_old_comfyui_without_status() -> None:
    entry = HistoryEntry.from_json("p", {"prompt": [0, "p", {}, {}, []], "outputs": {}})
    assert entry.status_str is None and entry.completed is None and entry.messages == ()
    assert entry.execution_error is None and not entry.succeeded and not entry.interrupted


def test_history_entry_finds_the_error_and_the_interrupt() -> None:
    raw = {
        "prompt": [0, "p", {}, {}, ["2"]],
        "outputs": {},
        "status": {
            "status_str": "error",
            "completed": False,
            "messages": [
                ["execution_start", {"prompt_id": "p"}],
                ["execution_cached", {"nodes": ["1"], "prompt_id": "p"}],
                ["execution_error", {"exception_type": "torch.OutOfMemoryError"}],
                "junk",
            ],
        },
    }
    entry = HistoryEntry.from_json("p", raw)
    assert entry.execution_error == {"exception_type": "torch.OutOfMemoryError"}
    assert entry.cached_nodes == ("1",) and entry.completed is False
    assert len(entry.messages) == 3


def test_system_stats_units_and_unknowns() -> None:
    stats = SystemStats.from_json(
        {
            "system": {"ram_total": 100, "argv": ["main.py"]},
            "devices": [{"name": "cpu", "type": "cpu", "index": None, "vram_total": 100}],
        }
    )
    assert stats.ram_total_bytes == 100 and stats.ram_free_bytes is None
    assert stats.argv == ("main.py",) and stats.comfyui_version is None
    (dev,) = stats.devices
    assert dev.index is None and dev.vram_total_bytes == 100 and dev.torch_vram_free_bytes is None


def test_post_result_describes_a_refusal_in_one_line() -> None:
    refused = PostResult(
        400,
        None,
        None,
        {},
        {
            "type": "invalid_prompt",
            "message": "Cannot execute because node X does not exist.",
            "details": "Node ID '#1'\nmore",
        },
    )
    assert not refused.accepted and refused.error_type == "invalid_prompt"
    assert (
        refused.describe()
        == "refused: invalid_prompt: Cannot execute because node X does not exist. (Node ID '#1')"
    )


# ---- endpoints ---------------------------------------------------------------------------------
def test_system_stats_is_typed(srv: StandinProcess) -> None:
    async def go() -> SystemStats:
        async with ComfyClient(srv.url) as client:
            return await client.system_stats()

    stats = run(go)
    assert stats.os == "linux" and stats.comfyui_version == "0.8.0"
    assert stats.argv is not None and str(srv.port) in stats.argv
    (dev,) = stats.devices
    assert dev.type == "cpu" and dev.index is None and dev.vram_total_bytes == stats.ram_total_bytes


def test_queue_captures_the_running_prompt_and_ui_workflow(srv: StandinProcess) -> None:
    workflow = {"id": "wf-42", "nodes": [{"id": 1, "type": "Sleep"}]}

    async def go() -> None:
        async with (
            ComfyClient(srv.url, client_id="watcher") as watcher,
            ComfyClient(srv.url, client_id="user") as user,
        ):
            post = await user.post_prompt(
                one_node("Sleep", seconds=30.0),
                extra_data={"extra_pnginfo": {"workflow": workflow}},
            )
            assert post.accepted and post.node_errors == {}
            for _ in range(500):
                state = await watcher.queue()
                if state.running:
                    break
                await asyncio.sleep(0.01)
            (item,) = state.running
            assert item.prompt_id == post.prompt_id and item.client_id == "user"
            assert item.workflow == workflow and item.prompt["1"]["class_type"] == "Sleep"
            assert state.remaining == 1 and await watcher.queue_remaining() == 1
            assert await watcher.history_entry(item.prompt_id) is None  # running: {}
            await watcher.interrupt(item.prompt_id)
            for _ in range(500):
                entry = await watcher.history_entry(item.prompt_id)
                if entry is not None:
                    break
                await asyncio.sleep(0.01)
            assert entry is not None and entry.interrupted and entry.item is not None
            assert entry.item.workflow == workflow

    run(go)


def test_history_object_info_and_logs(srv: StandinProcess) -> None:
    async def go() -> None:
        async with ComfyClient(srv.url) as client:
            for color in (1, 2, 3):
                outcome = await client.run_prompt(
                    one_node("EmptyImage", width=8, height=8, batch_size=1, color=color), 30
                )
                assert outcome.kind == "success"
            newest = await client.history(max_items=2)
            assert len(newest) == 2 and all(e.succeeded for e in newest.values())
            everything = await client.history()
            assert list(newest) == list(everything)[-2:]
            info = await client.object_info()
            assert (
                info["StandinSampler"]["input"]["required"]["seed"][1]["control_after_generate"]
                is True
            )
            assert list(await client.object_info("EmptyImage")) == ["EmptyImage"]
            text = await client.internal_logs()
            assert " - got prompt" in text
            raw = await client.internal_logs_raw()
            assert any(e.text == "got prompt\n" for e in raw) and raw[0].time_iso

    run(go)


def test_refused_prompt_is_a_result_with_node_errors(srv: StandinProcess) -> None:
    async def go() -> tuple[PostResult, PostResult]:
        async with ComfyClient(srv.url) as client:
            missing = await client.post_prompt(
                {"1": {"class_type": "NodeFromANewerPack", "inputs": {}}}
            )
            invalid = await client.post_prompt(
                one_node("EmptyImage", width=0, height=8, batch_size=1, color=0)
            )
            return missing, invalid

    missing, invalid = run(go)
    assert (
        missing.status_code == 400
        and missing.error_type == "invalid_prompt"
        and missing.prompt_id is None
    )
    assert (
        missing.error is not None
        and missing.error["message"]
        == "Cannot execute because node NodeFromANewerPack does not exist."
    )
    assert invalid.error_type == "prompt_outputs_failed_validation"
    assert invalid.node_errors["1"]["errors"][0]["type"] == "value_smaller_than_min"


def test_free_unloads_and_drops_the_cache(srv: StandinProcess) -> None:
    prompt = one_node("EmptyImage", width=8, height=8, batch_size=1, color=77)

    async def go() -> tuple[tuple[str, ...], tuple[str, ...]]:
        async with ComfyClient(srv.url) as client:
            await client.run_prompt(prompt, 30)
            cached = await client.run_prompt(prompt, 30)
            await client.free(unload_models=True, free_memory=True)
            fresh = await client.run_prompt(prompt, 30)
            return cached.executed_nodes, fresh.executed_nodes

    cached, fresh = run(go)
    assert cached == () and fresh == ("1", "2")


def test_websocket_yields_text_messages_with_our_sid(srv: StandinProcess) -> None:
    async def go() -> list[str]:
        async with ComfyClient(srv.url, client_id="ws-test") as client, client.websocket() as ws:
            seen = []
            async for msg in ws:
                seen.append(msg.type)
                if msg.type == "status":
                    break
            assert ws.sid == "ws-test"
            return seen

    assert run(go) == ["status"]


# ---- run_prompt ---------------------------------------------------------------------------------
def test_run_prompt_success(srv: StandinProcess) -> None:
    outcome = run(
        lambda: _run(
            srv.url,
            one_node("EmptyImage", width=8, height=8, batch_size=1, color=900),
            prompt_id="mine-1",
        )
    )
    assert outcome.kind == "success" and outcome.prompt_id == "mine-1"
    assert outcome.executed_nodes == ("1", "2") and outcome.cached_nodes == ()
    assert outcome.history is not None and outcome.history.outputs["2"]["text"]
    assert outcome.error is None and outcome.post is not None and outcome.post.accepted
    assert [m.type for m in outcome.messages][:2] == ["execution_start", "execution_cached"]
    assert outcome.messages[-1].type == "executing" and outcome.messages[-1].data["node"] is None


def test_run_prompt_error_carries_the_execution_error(srv: StandinProcess) -> None:
    outcome = run(
        lambda: _run(srv.url, one_node("Fail", message="not memory", exception="KeyError"))
    )
    assert outcome.kind == "error"
    assert outcome.error is not None and outcome.error["exception_type"] == "KeyError"
    assert outcome.error["node_type"] == "Fail"
    assert outcome.history is not None and outcome.history.execution_error == outcome.error


def test_run_prompt_rejected_is_not_an_exception(srv: StandinProcess) -> None:
    outcome = run(lambda: _run(srv.url, {"1": {"class_type": "Missing", "inputs": {}}}))
    assert outcome.kind == "rejected" and outcome.history is None
    assert (
        outcome.detail
        == "refused: invalid_prompt: Cannot execute because node Missing does not exist. (Node ID '#1')"
    )


def test_run_prompt_interrupted(srv: StandinProcess) -> None:
    async def go() -> Any:
        async with ComfyClient(srv.url) as client, ComfyClient(srv.url) as other:
            task = asyncio.create_task(
                client.run_prompt(one_node("Sleep", seconds=30.0), 60, prompt_id="to-stop")
            )
            for _ in range(500):
                if (await other.queue()).running:
                    break
                await asyncio.sleep(0.01)
            await other.interrupt("to-stop")
            return await task

    outcome = run(go)
    assert (
        outcome.kind == "interrupted"
        and outcome.history is not None
        and outcome.history.interrupted
    )


def test_run_prompt_timeout_can_interrupt(srv: StandinProcess) -> None:
    async def go() -> Any:
        async with ComfyClient(srv.url) as client:
            outcome = await client.run_prompt(
                one_node("Sleep", seconds=30.0), 0.5, interrupt_on_timeout=True
            )
            for _ in range(500):
                if await client.queue_remaining() == 0:
                    break
                await asyncio.sleep(0.01)
            return outcome, await client.history_entry(outcome.prompt_id)

    outcome, entry = run(go)
    assert outcome.kind == "timeout" and outcome.detail == "no outcome within 0.5 s"
    assert entry is not None and entry.interrupted


def test_run_prompt_falls_back_to_polling_history(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, env={"OOM_STANDIN_WS_DROP": "executing"})
    try:
        outcome = run(
            lambda: _run(proc.url, one_node("Sleep", seconds=0.2, value=1), poll_interval_s=0.1)
        )
    finally:
        proc.stop()
    assert outcome.kind == "success" and outcome.history is not None
    assert not any(m.type == "executing" for m in outcome.messages)


def test_run_prompt_reports_a_killed_server_as_crashed(tmp_path: Path) -> None:
    proc = start_standin(tmp_path)

    async def go() -> Any:
        async with ComfyClient(proc.url) as client, ComfyClient(proc.url) as watcher:
            climbing = one_node("AllocateRAM", mib=400, steps=200, step_delay_ms=50)
            task = asyncio.create_task(client.run_prompt(climbing, 60, alive=proc.alive))
            for _ in range(1000):
                if (await watcher.queue()).running:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            proc.kill()
            return await task

    try:
        outcome = run(go)
    finally:
        proc.kill()
    assert outcome.kind == "crashed" and outcome.history is None
    assert outcome.executed_nodes == ("1",)
    assert outcome.detail is not None and "no terminal event" in outcome.detail


def test_binary_previews_are_skipped(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, "--preview-method", "auto")

    async def go() -> tuple[int, list[str], Any]:
        async with (
            aiohttp.ClientSession() as session,
            ComfyClient(proc.url, client_id="cc") as client,
        ):
            raw = await session.ws_connect(proc.url.replace("http", "ws") + "/ws?clientId=raw")
            await raw.receive()
            async with client.websocket() as ws:
                await ws.receive()
                # Without a client_id, previews and progress go to every socket.
                async with session.post(
                    proc.url + "/prompt", json={"prompt": one_node("Sleep", seconds=0.1, value=1)}
                ) as resp:
                    assert resp.status == 200
                binary = 0
                async for msg in raw:
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        binary += 1
                        assert msg.data[:8] == b"\x00\x00\x00\x01\x00\x00\x00\x02"
                    elif (
                        json.loads(msg.data)["data"]
                        .get("status", {})
                        .get("exec_info", {})
                        .get("queue_remaining")
                        == 0
                    ):
                        break
                seen = []
                while True:
                    msg = await ws.receive(timeout_s=5)
                    assert msg is not None
                    seen.append(msg.type)
                    if (
                        msg.type == "status"
                        and msg.data["status"]["exec_info"]["queue_remaining"] == 0
                    ):
                        break
            await raw.close()
            # run_prompt's own socket gets the previews of its prompt and must skip them too.
            outcome = await client.run_prompt(one_node("Sleep", seconds=0.1, value=2), 30)
            return binary, seen, outcome

    try:
        binary, seen, outcome = run(go)
    finally:
        proc.stop()
    assert binary == 10
    assert seen.count("progress") == 10 and "<binary>" not in seen
    assert outcome.kind == "success"


async def _run(url: str, prompt: dict[str, Any], **kw: Any) -> Any:
    async with ComfyClient(url) as client:
        return await client.run_prompt(prompt, 30, **kw)


# ---- readiness and errors ----------------------------------------------------------------------
def test_wait_ready_returns_once_the_server_answers(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, wait_ready=False)

    async def go() -> SystemStats:
        async with ComfyClient(proc.url) as client:
            return await client.wait_ready(30, alive=proc.alive)

    try:
        assert run(go).comfyui_version == "0.8.0"
    finally:
        proc.stop()


def test_wait_ready_stops_when_the_process_exits(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, "--unknown-flag", wait_ready=False)

    async def go() -> None:
        async with ComfyClient(proc.url) as client:
            await client.wait_ready(30, alive=proc.alive)

    with pytest.raises(ComfyError, match="the process exited before it was ready"):
        run(go)
    assert proc.proc.wait(timeout=10) == 2


def test_errors_are_one_line_naming_the_url() -> None:
    port = free_port()

    async def go(call: str) -> None:
        async with ComfyClient(f"http://127.0.0.1:{port}", timeout_s=2) as client:
            if call == "ready":
                await client.wait_ready(0.3)
            elif call == "ws":
                async with client.websocket():
                    pass
            else:
                await client.queue()

    for call, path in (("queue", "/queue"), ("ready", "/system_stats"), ("ws", "/ws?clientId=")):
        with pytest.raises(ComfyError) as info:
            run(lambda call=call: go(call))
        message = str(info.value)
        assert "\n" not in message and f"127.0.0.1:{port}{path}" in message


def test_run_prompt_raises_when_nothing_listens() -> None:
    port = free_port()
    with pytest.raises(ComfyError, match=f"127.0.0.1:{port}"):
        run(lambda: _run(f"http://127.0.0.1:{port}", {"1": {}}))

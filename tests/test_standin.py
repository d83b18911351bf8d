"""The stand-in ComfyUI, run as a real process, answers and behaves as ComfyUI v0.8.0 does
(comfyui-facts.md 1, 2, 3 and 11): endpoint shapes, validation bodies, websocket routing and
message order, caching, console lines, and real memory use."""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from standin_proc import StandinProcess, start_standin

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir, FakeProcessUsage

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    proc = start_standin(tmp_path_factory.mktemp("standin-cpu"))
    yield proc
    proc.stop()


def blur_prompt(color: int = 0, width: int = 64) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": width, "height": 64, "batch_size": 1, "color": color},
        },
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }


def one_node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {
        "1": {"class_type": class_type, "inputs": inputs},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


class Recorder:
    """Websocket clients connected before a prompt is posted; records text messages."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws_url = url.replace("http://", "ws://")

    async def run(
        self,
        body: dict[str, Any],
        *,
        owner: str | None,
        observers: tuple[str, ...] = (),
        timeout_s: float = 30.0,
        during: Any = None,
    ) -> tuple[int, Any, dict[str, list[dict[str, Any]]]]:
        ids = ([owner] if owner else []) + list(observers)
        sinks: dict[str, list[dict[str, Any]]] = {cid: [] for cid in ids}
        async with aiohttp.ClientSession() as session:
            await _until_idle(session, self.url)
            sockets = {
                cid: await session.ws_connect(f"{self.ws_url}/ws?clientId={cid}") for cid in ids
            }

            async def read(cid: str) -> None:
                async for msg in sockets[cid]:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        sinks[cid].append(json.loads(msg.data))
                    elif msg.type == aiohttp.WSMsgType.BINARY:
                        sinks[cid].append({"type": "<binary>", "data": {}})

            readers = [asyncio.create_task(read(cid)) for cid in ids]
            await _until(lambda: all(sinks[cid] for cid in ids), 10)
            async with session.post(self.url + "/prompt", json=body) as resp:
                status, answer = resp.status, await resp.json()
            if status == 200:
                pid = answer["prompt_id"]
                if during is not None:
                    await during(session, pid)
                if owner:
                    await _until(lambda: any(_is_final(m, pid) for m in sinks[owner]), timeout_s)
                else:
                    await _until_history(session, self.url, pid, timeout_s)
                await asyncio.sleep(0.1)
            for ws in sockets.values():
                await ws.close()
            for task in readers:
                task.cancel()
        return status, answer, sinks


def _is_final(msg: dict[str, Any], prompt_id: str) -> bool:
    return (
        msg["type"] == "executing"
        and msg["data"].get("node") is None
        and msg["data"].get("prompt_id") == prompt_id
    )


async def _until(cond: Any, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def _until_idle(session: aiohttp.ClientSession, url: str) -> None:
    """Earlier tests' prompts would add status broadcasts to this one's record."""
    for _ in range(3000):
        async with session.get(url + "/prompt") as resp:
            if (await resp.json())["exec_info"]["queue_remaining"] == 0:
                return
        await asyncio.sleep(0.01)
    raise AssertionError("the queue did not drain")


async def _until_history(
    session: aiohttp.ClientSession, url: str, prompt_id: str, timeout_s: float
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with session.get(f"{url}/history/{prompt_id}") as resp:
            if await resp.json():
                return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("no history entry in time")
        await asyncio.sleep(0.02)


def record(
    srv: StandinProcess, body: dict[str, Any], **kw: Any
) -> tuple[int, Any, dict[str, list[dict[str, Any]]]]:
    return asyncio.run(Recorder(srv.url).run(body, **kw))


def types(msgs: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in msgs]


# ---- startup and console -----------------------------------------------------------------------
def test_startup_lines_come_in_comfyui_order(srv: StandinProcess) -> None:
    err = srv.stderr_text()
    expected = [
        "Checkpoint files will always be loaded safely.",
        "Total VRAM ",
        "pytorch version: ",
        "Set vram state to: DISABLED",
        "Device: cpu",
        "Python version: ",
        "ComfyUI version: 0.8.0",
        "Starting server\n\n",
        f"To see the GUI go to: http://127.0.0.1:{srv.port}\n",
    ]
    positions = [err.index(line) for line in expected]
    assert positions == sorted(positions)
    ram_mb = psutil.virtual_memory().total // MIB
    assert re.search(rf"^Total VRAM {ram_mb} MB, total RAM {ram_mb} MB$", err, re.M)


def test_unknown_flag_exits_2_like_argparse(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, "--bogus-flag", wait_ready=False)
    assert proc.proc.wait(timeout=30) == 2
    assert "main.py: error: unrecognized arguments: --bogus-flag" in proc.stderr_text()


def test_user_directory_must_exist(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, "--user-directory", str(tmp_path / "missing"), wait_ready=False)
    assert proc.proc.wait(timeout=30) == 2
    assert f"{tmp_path / 'missing'} is not a valid directory." in proc.stderr_text()


def test_quick_test_for_ci_exits_0_without_binding(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, "--quick-test-for-ci", wait_ready=False)
    assert proc.proc.wait(timeout=30) == 0
    assert "Starting server" not in proc.stderr_text()


def test_second_instance_on_the_same_port_dies_after_node_import(
    srv: StandinProcess, tmp_path: Path
) -> None:
    proc = start_standin(tmp_path, port=srv.port, wait_ready=False)
    assert proc.proc.wait(timeout=30) == 1
    err = proc.stderr_text()
    assert "Traceback (most recent call last):" in err
    assert "OSError: [Errno 98]" in err
    assert err.index("ComfyUI version:") < err.index("Starting server")


def test_dont_print_server_log_stdout_and_verbose(standin: Any, tmp_path: Path) -> None:
    proc = standin(
        "--dont-print-server", "--log-stdout", "--verbose", "--temp-directory", str(tmp_path / "t")
    )
    assert "To see the GUI" not in proc.stdout_text() + proc.stderr_text()
    assert "Set vram state to: DISABLED" in proc.stdout_text()
    assert "Set vram state to" not in proc.stderr_text()
    assert f"Setting temp directory to: {tmp_path / 't' / 'temp'}" in proc.stdout_text()
    assert "Database URL: sqlite:///:memory:" in proc.stdout_text()  # a DEBUG line


def test_temp_directory_is_wiped_at_start(standin: Any, tmp_path: Path) -> None:
    stale = tmp_path / "base" / "temp" / "stale.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    standin(base_dir=tmp_path / "base")
    assert not stale.exists()


@pytest.mark.parametrize(
    ("flags", "state"),
    [
        (["--cpu"], "DISABLED"),
        ([], "NORMAL_VRAM"),
        (["--normalvram"], "NORMAL_VRAM"),
        (["--lowvram"], "LOW_VRAM"),
        (["--novram"], "NO_VRAM"),
        (["--highvram"], "HIGH_VRAM"),
        (["--gpu-only"], "HIGH_VRAM"),
    ],
    ids=["cpu", "default", "normalvram", "lowvram", "novram", "highvram", "gpu-only"],
)
def test_vram_flags_set_the_vram_state(
    tmp_path: Path, gpu_dir: Path, flags: list[str], state: str
) -> None:
    proc = start_standin(
        tmp_path,
        "--quick-test-for-ci",
        "--disable-smart-memory",
        *flags,
        fake_gpu=gpu_dir,
        cpu=False,
        wait_ready=False,
    )
    assert proc.proc.wait(timeout=30) == 0
    err = proc.stderr_text()
    assert f"Set vram state to: {state}\n" in err
    assert err.index(f"Set vram state to: {state}") < err.index("Disabling smart memory management")


def test_vram_flags_are_mutually_exclusive(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, "--lowvram", wait_ready=False)  # plus --cpu
    assert proc.proc.wait(timeout=30) == 2
    assert "error: argument --lowvram: not allowed with argument --cpu" in proc.stderr_text()


def test_sigint_prints_stopped_server(tmp_path: Path) -> None:
    proc = start_standin(tmp_path)
    assert proc.stop() == 0
    assert "\nStopped server\n" in proc.stderr_text()


# ---- endpoint shapes ---------------------------------------------------------------------------
def test_system_stats_shape_on_cpu(srv: StandinProcess) -> None:
    stats = srv.get_json("/system_stats")
    assert set(stats) == {"system", "devices"}
    system = stats["system"]
    for key in (
        "os",
        "ram_total",
        "ram_free",
        "comfyui_version",
        "required_frontend_version",
        "python_version",
        "pytorch_version",
        "embedded_python",
        "argv",
    ):
        assert key in system
    assert system["os"] == "linux" and system["comfyui_version"] == "0.8.0"
    assert "--port" in system["argv"] and str(srv.port) in system["argv"]
    (device,) = stats["devices"]
    assert device["name"] == "cpu" and device["type"] == "cpu" and device["index"] is None
    assert device["vram_total"] == system["ram_total"] == psutil.virtual_memory().total


@pytest.mark.parametrize(
    "path",
    [
        "/system_stats",
        "/prompt",
        "/queue",
        "/history",
        "/features",
        "/object_info/EmptyImage",
        "/embeddings",
    ],
)
def test_every_route_has_an_api_alias(srv: StandinProcess, path: str) -> None:
    plain, aliased = srv.get_json(path), srv.get_json("/api" + path)
    assert type(plain) is type(aliased)
    if path != "/system_stats":
        assert plain == aliased


def test_internal_logs_ring_and_no_api_alias(srv: StandinProcess) -> None:
    logs = srv.get_json("/internal/logs")
    assert isinstance(logs, str)
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+ - Set vram state to: DISABLED", logs)
    raw = srv.get_json("/internal/logs/raw")
    assert set(raw) == {"entries", "size"} and set(raw["size"]) == {"cols", "rows"}
    # started without a terminal, a real server reports $COLUMNS x $LINES or 80x24, never null
    assert all(isinstance(v, int) and v > 0 for v in raw["size"].values())
    assert 0 < len(raw["entries"]) <= 300 and set(raw["entries"][0]) == {"t", "m"}
    with pytest.raises(Exception, match="404"):
        srv.get_json("/api/internal/logs")


def test_log_ring_keeps_the_last_300_writes(standin: Any) -> None:
    proc = standin()
    record(
        proc,
        {"prompt": one_node("SoftOOM", kind="softmax", count=400), "client_id": "r"},
        owner="r",
    )
    proc.wait_for_stderr("Prompt executed in")
    entries = proc.get_json("/internal/logs/raw")["entries"]
    assert len(entries) == 300
    assert entries[-1]["m"].startswith("Prompt executed in")
    assert not any("Set vram state to" in e["m"] for e in entries)


def test_features_shape(srv: StandinProcess) -> None:
    assert srv.get_json("/features") == {
        "supports_preview_metadata": True,
        "max_upload_size": 100.0 * MIB,
        "extension": {"manager": {"supports_v4": True}},
    }


def test_get_prompt_reports_queue_remaining(srv: StandinProcess) -> None:
    assert srv.get_json("/prompt") == {"exec_info": {"queue_remaining": 0}}


def test_object_info_v1_entry(srv: StandinProcess) -> None:
    info = srv.get_json("/object_info/EmptyImage")["EmptyImage"]
    assert info["input"]["required"]["width"] == [
        "INT",
        {"default": 512, "min": 1, "max": 16384, "step": 1},
    ]
    assert info["input_order"] == {"required": ["width", "height", "batch_size", "color"]}
    assert (
        info["output"] == ["IMAGE"]
        and info["output_is_list"] == [False]
        and info["output_name"] == ["IMAGE"]
    )
    assert (
        info["python_module"] == "nodes"
        and info["output_node"] is False
        and info["name"] == "EmptyImage"
    )


def test_object_info_widgets_the_ui_converter_needs(srv: StandinProcess) -> None:
    everything = srv.get_json("/object_info")
    seed = everything["StandinSampler"]["input"]["required"]["seed"]
    assert seed[0] == "INT" and seed[1]["control_after_generate"] is True
    image = everything["LoadImage"]["input"]["required"]["image"]
    assert isinstance(image[0], list) and image[1] == {"image_upload": True}
    v1_combo = everything["ImageScaleBy"]["input"]["required"]["upscale_method"]
    assert v1_combo == [["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]]
    v3 = everything["ImageScaleToTotalPixels"]
    assert v3["input"]["required"]["upscale_method"] == [
        "COMBO",
        {"options": ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]},
    ]
    assert v3["python_module"] == "comfy_extras.nodes_post_processing"
    assert everything["SaveImage"]["input"]["hidden"] == {
        "prompt": "PROMPT",
        "extra_pnginfo": "EXTRA_PNGINFO",
    }
    assert everything["PreviewAny"]["output_node"] is True
    assert srv.get_json("/object_info/NoSuchNode") == {}


# ---- validation --------------------------------------------------------------------------------
VALIDATION_CASES = [
    pytest.param(
        {"1": {"class_type": "Missing", "inputs": {}}},
        "invalid_prompt",
        "Cannot execute because node Missing does not exist.",
        "Node ID '#1'",
        {},
        id="unknown-class",
    ),
    pytest.param(
        {"1": {"inputs": {}}},
        "invalid_prompt",
        "Cannot execute because a node is missing the class_type property.",
        "Node ID '#1'",
        {},
        id="no-class-type",
    ),
    pytest.param(
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
            }
        },
        "prompt_no_outputs",
        "Prompt has no outputs",
        "",
        {},
        id="no-outputs",
    ),
    pytest.param(
        one_node("EmptyImage", width=0, height=8, batch_size=1, color=0),
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "",
        {"1": ("value_smaller_than_min", ["2"], "Value 0 smaller than min of 1: width")},
        id="below-min",
    ),
    pytest.param(
        one_node("ImageScaleBy", image=["9", 0], upscale_method="x", scale_by=1.0),
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        None,
        None,
        id="bad-link",
    ),
    pytest.param(
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
            },
            "2": {
                "class_type": "ImageScaleBy",
                "inputs": {"image": ["1", 0], "upscale_method": "cubic", "scale_by": 1.0},
            },
            "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
        },
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "",
        {
            "2": (
                "value_not_in_list",
                ["3"],
                "Value not in list: upscale_method: 'cubic' not in ['nearest-exact', 'bilinear', 'area', 'bicubic', 'lanczos']",
            )
        },
        id="not-in-list",
    ),
    pytest.param(
        one_node("EmptyImage", height=8, batch_size=1, color=0),
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "",
        {"1": ("required_input_missing", ["2"], "Required input is missing: width")},
        id="missing-input",
    ),
    pytest.param(
        one_node("EmptyImage", width="wide", height=8, batch_size=1, color=0),
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "",
        {
            "1": (
                "invalid_input_type",
                ["2"],
                "Failed to convert an input value to a INT value: width, wide, invalid literal for int() with base 10: 'wide'",
            )
        },
        id="not-an-int",
    ),
    pytest.param(
        {
            "1": {
                "class_type": "CheckpointLoaderSimple",
                "inputs": {"ckpt_name": "sdxl.safetensors"},
            },
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        },
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "",
        {
            "1": (
                "value_not_in_list",
                ["2"],
                "Value not in list: ckpt_name: 'sdxl.safetensors' not in []",
            )
        },
        id="missing-model",
    ),
    pytest.param(
        one_node("LoadImage", image="nope.png"),
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "",
        {
            "1": (
                "custom_validation_failed",
                ["2"],
                "Custom validation failed for node: image - Invalid image file: nope.png",
            )
        },
        id="missing-input-image",
    ),
    pytest.param(
        {"1": {"class_type": "SaveImage", "inputs": {"filename_prefix": "x"}}},
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        "Required input is missing: images",
        {"1": ("required_input_missing", ["1"], "Required input is missing: images")},
        id="output-node-itself",
    ),
]


@pytest.mark.parametrize(("prompt", "kind", "message", "details", "node_errors"), VALIDATION_CASES)
def test_invalid_prompts_get_comfyui_400_bodies(
    srv: StandinProcess,
    prompt: dict[str, Any],
    kind: str,
    message: str,
    details: str | None,
    node_errors: dict[str, Any] | None,
) -> None:
    status, body = srv.post_json("/prompt", {"prompt": prompt})
    assert status == 400
    assert set(body) == {"error", "node_errors"}
    assert set(body["error"]) == {"type", "message", "details", "extra_info"}
    assert body["error"]["type"] == kind and body["error"]["message"] == message
    if details is not None:
        assert body["error"]["details"] == details
    if node_errors is not None:
        got = {
            nid: (
                e["errors"][0]["type"],
                e["dependent_outputs"],
                f"{e['errors'][0]['message']}: {e['errors'][0]['details']}",
            )
            for nid, e in body["node_errors"].items()
        }
        assert got == node_errors
        for entry in body["node_errors"].values():
            assert set(entry) == {"errors", "dependent_outputs", "class_type"}
            assert set(entry["errors"][0]) == {"type", "message", "details", "extra_info"}


def test_missing_prompt_is_no_prompt(srv: StandinProcess) -> None:
    status, body = srv.post_json("/prompt", {"client_id": "x"})
    assert status == 400 and body["error"]["type"] == "no_prompt" and body["node_errors"] == {}


def test_invalid_prompt_is_logged_after_got_prompt(srv: StandinProcess) -> None:
    srv.post_json(
        "/prompt", {"prompt": one_node("EmptyImage", width=0, height=8, batch_size=1, color=0)}
    )
    err = srv.wait_for_stderr("Output will be ignored")
    tail = err[err.rindex("got prompt") :]
    for line in [
        "Failed to validate prompt for output 2:",
        "* EmptyImage 1:",
        "  - Value 0 smaller than min of 1: width",
        "Output will be ignored",
        "invalid prompt: {'type': 'prompt_outputs_failed_validation'",
    ]:
        assert line in tail


def test_partly_valid_prompt_is_accepted_with_node_errors(srv: StandinProcess) -> None:
    prompt = blur_prompt(color=11)
    prompt["3"] = {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}}
    prompt["4"] = {
        "class_type": "EmptyImage",
        "inputs": {"width": 0, "height": 8, "batch_size": 1, "color": 0},
    }
    status, body = srv.post_json("/prompt", {"prompt": prompt})
    assert status == 200
    assert set(body) == {"prompt_id", "number", "node_errors"}
    assert list(body["node_errors"]) == ["4"]
    _wait(lambda: srv.get_json(f"/history/{body['prompt_id']}") != {})
    entry = srv.get_json(f"/history/{body['prompt_id']}")[body["prompt_id"]]
    assert entry["prompt"][4] == ["2"]  # only the valid output ran
    assert list(entry["outputs"]) == ["2"]


# ---- execution, routing, message order ---------------------------------------------------------
SUCCESS_ORDER = [
    "status",  # on connect, with sid
    "status",  # queued
    "status",  # taken by the worker
    "execution_start",
    "execution_cached",
    "progress_state",
    "executing",
    "progress_state",
    "progress_state",
    "executing",
    "executed",
    "progress_state",
    "execution_success",
    "status",  # task done
    "executing",  # node: null
]


#: as observed on a real ComfyUI v0.8.0 for a failing first node (comfyui-facts.md 11)
ERROR_ORDER = [
    "status",
    "status",
    "status",
    "execution_start",
    "execution_cached",
    "progress_state",
    "executing",
    "execution_error",
    "status",
    "executing",
]


def test_success_messages_go_only_to_the_owner_in_comfyui_order(srv: StandinProcess) -> None:
    owner = uuid.uuid4().hex
    status, answer, sinks = record(
        srv,
        {"prompt": blur_prompt(color=101), "client_id": owner},
        owner=owner,
        observers=("watchdog",),
    )
    assert status == 200
    msgs = sinks[owner]
    assert types(msgs) == SUCCESS_ORDER
    assert msgs[0]["data"]["sid"] == owner
    pid = answer["prompt_id"]
    assert [m["data"]["node"] for m in msgs if m["type"] == "executing"] == ["1", "2", None]
    executed = next(m for m in msgs if m["type"] == "executed")["data"]
    assert (
        executed["node"] == "2" and executed["display_node"] == "2" and executed["prompt_id"] == pid
    )
    assert executed["output"]["images"][0]["type"] == "temp"
    assert re.fullmatch(
        r"ComfyUI_temp_[a-z]{5}_00001_\.png", executed["output"]["images"][0]["filename"]
    )
    for m in msgs:
        if m["type"] in ("execution_start", "execution_cached", "execution_success"):
            assert m["data"]["prompt_id"] == pid and isinstance(m["data"]["timestamp"], int)
    state = next(m for m in msgs if m["type"] == "progress_state")["data"]
    assert state["nodes"]["1"]["state"] == "running" and set(state["nodes"]["1"]) == {
        "value",
        "max",
        "state",
        "node_id",
        "prompt_id",
        "display_node_id",
        "parent_node_id",
        "real_node_id",
    }
    assert set(types(sinks["watchdog"])) == {"status"}


def test_history_is_written_before_the_final_executing(srv: StandinProcess) -> None:
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(srv.url.replace("http", "ws") + "/ws?clientId=hist")
            await ws.receive()
            async with session.post(
                srv.url + "/prompt", json={"prompt": blur_prompt(color=102), "client_id": "hist"}
            ) as resp:
                pid = (await resp.json())["prompt_id"]
            async for msg in ws:
                data = json.loads(msg.data)
                if _is_final(data, pid):
                    async with session.get(f"{srv.url}/history/{pid}") as resp:
                        seen.update(await resp.json())
                    break
            await ws.close()

    asyncio.run(scenario())
    (entry,) = seen.values()
    assert set(entry) == {"prompt", "outputs", "status", "meta"}
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
    assert [m[0] for m in entry["status"]["messages"]] == [
        "execution_start",
        "execution_cached",
        "execution_success",
    ]
    assert entry["meta"]["2"] == {
        "node_id": "2",
        "display_node": "2",
        "parent_node": None,
        "real_node_id": "2",
    }


def test_identical_repost_executes_nothing(srv: StandinProcess) -> None:
    body = {"prompt": blur_prompt(color=103), "client_id": "cache"}
    record(srv, body, owner="cache")
    _, answer, sinks = record(srv, body, owner="cache")
    msgs = sinks["cache"]
    cached = next(m for m in msgs if m["type"] == "execution_cached")["data"]["nodes"]
    assert sorted(cached) == ["1", "2"]
    assert [m["data"]["node"] for m in msgs if m["type"] == "executing"] == [None]
    executed = [m["data"] for m in msgs if m["type"] == "executed"]
    assert [e["node"] for e in executed] == ["2"] and executed[0]["output"]["images"]
    entry = srv.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]
    assert entry["outputs"]["2"]["images"]


def test_free_memory_drops_the_cache(srv: StandinProcess) -> None:
    body = {"prompt": blur_prompt(color=104), "client_id": "free"}
    record(srv, body, owner="free")
    assert srv.post_json("/free", {"free_memory": True})[0] == 200
    _, _, sinks = record(srv, body, owner="free")
    cached = next(m for m in sinks["free"] if m["type"] == "execution_cached")["data"]["nodes"]
    assert cached == []


def test_error_message_order_payload_and_console(srv: StandinProcess) -> None:
    prompt = one_node("Fail", message="standin boom", exception="ValueError")
    status, answer, sinks = record(srv, {"prompt": prompt, "client_id": "err"}, owner="err")
    assert status == 200
    assert types(sinks["err"]) == ERROR_ORDER
    error = next(m for m in sinks["err"] if m["type"] == "execution_error")["data"]
    assert set(error) == {
        "prompt_id",
        "node_id",
        "node_type",
        "executed",
        "exception_message",
        "exception_type",
        "traceback",
        "current_inputs",
        "current_outputs",
        "timestamp",
    }
    assert (
        error["exception_message"] == "standin boom\n" and error["exception_type"] == "ValueError"
    )
    assert error["node_id"] == "1" and error["node_type"] == "Fail" and error["executed"] == []
    assert error["current_inputs"] == {"message": ["standin boom"], "exception": ["ValueError"]}
    # every node the output cache has keys for (a real v0.8.0 lists the prompt's nodes)
    assert sorted(error["current_outputs"]) == ["1", "2"]
    assert all(isinstance(line, str) for line in error["traceback"])
    entry = srv.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]
    assert entry["status"]["status_str"] == "error" and entry["status"]["completed"] is False
    assert entry["status"]["messages"][-1] == ["execution_error", error]
    err = srv.wait_for_stderr("ValueError: standin boom")
    tail = err[err.rindex("!!! Exception during processing !!! standin boom") :]
    assert "Traceback (most recent call last):" in tail and "Got an OOM" not in tail
    assert re.search(
        r"Prompt executed in \d+\.\d\d seconds", srv.wait_for_stderr("Prompt executed in")
    )


def test_interrupt_stops_the_running_prompt(srv: StandinProcess) -> None:
    async def interrupt(session: aiohttp.ClientSession, pid: str) -> None:
        await asyncio.sleep(0.3)
        async with session.post(srv.url + "/interrupt", json={"prompt_id": pid}) as resp:
            assert resp.status == 200

    prompt = one_node("Sleep", seconds=30.0)
    _, answer, sinks = record(
        srv, {"prompt": prompt, "client_id": "intr"}, owner="intr", during=interrupt
    )
    msgs = sinks["intr"]
    assert types(msgs) == [*ERROR_ORDER[:7], "execution_interrupted", *ERROR_ORDER[8:]]
    interrupted = next(m for m in msgs if m["type"] == "execution_interrupted")["data"]
    assert set(interrupted) == {"prompt_id", "node_id", "node_type", "executed", "timestamp"}
    assert interrupted["node_id"] == "1" and interrupted["node_type"] == "Sleep"
    entry = srv.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]
    assert entry["status"]["status_str"] == "error" and entry["status"]["completed"] is False
    err = srv.wait_for_stderr("Processing interrupted")
    assert f"Interrupting prompt {answer['prompt_id']}" in err


def test_prompt_without_client_id_broadcasts_only_progress(srv: StandinProcess) -> None:
    _, _, sinks = record(
        srv, {"prompt": one_node("Sleep", seconds=0.05, value="x")}, owner=None, observers=("obs",)
    )
    seen = set(types(sinks["obs"]))
    assert {"status", "progress", "progress_state"} <= seen
    assert not seen & {
        "execution_start",
        "execution_cached",
        "executing",
        "executed",
        "execution_success",
    }


def test_queue_items_are_five_elements_without_secrets(srv: StandinProcess) -> None:
    extra = {
        "extra_pnginfo": {"workflow": {"id": "wf-1", "nodes": []}},
        "api_key_comfy_org": "SECRET-KEY",
        "auth_token_comfy_org": "SECRET-TOKEN",
    }
    pid = "my-own-prompt-id"
    status, body = srv.post_json(
        "/prompt",
        {
            "prompt": one_node("Sleep", seconds=30.0),
            "client_id": "q",
            "prompt_id": pid,
            "extra_data": extra,
        },
    )
    assert status == 200 and body["prompt_id"] == pid and isinstance(body["number"], int)
    try:
        pending_pid = "queued-behind"
        srv.post_json(
            "/prompt", {"prompt": one_node("Sleep", seconds=0.01), "prompt_id": pending_pid}
        )
        # the worker thread takes the first prompt off the queue when it gets to it, as
        # ComfyUI's does: a /queue read straight after the POST may still see it pending
        seen: list[dict[str, Any]] = []
        _wait(lambda: seen.append(srv.get_json("/queue")) or len(seen[-1]["queue_running"]) == 1)
        queue = seen[-1]
        (running,) = queue["queue_running"]
        assert len(running) == 5 and running[1] == pid and running[4] == ["2"]
        assert (
            running[3]["client_id"] == "q"
            and running[3]["extra_pnginfo"]["workflow"]["id"] == "wf-1"
        )
        assert isinstance(running[3]["create_time"], int)
        assert "SECRET" not in json.dumps(queue)
        assert [item[1] for item in queue["queue_pending"]] == [pending_pid]
        assert srv.get_json(f"/history/{pid}") == {}
        assert srv.get_json("/prompt") == {"exec_info": {"queue_remaining": 2}}
        assert srv.post_json("/queue", {"delete": [pending_pid]})[0] == 200
        assert srv.get_json("/queue")["queue_pending"] == []
    finally:
        srv.post_json("/interrupt", {})
    _wait(lambda: srv.get_json(f"/history/{pid}") != {})
    assert "SECRET" not in json.dumps(srv.get_json("/history"))


def test_history_max_items_delete_and_clear(srv: StandinProcess) -> None:
    for color in (201, 202, 203):
        record(srv, {"prompt": blur_prompt(color=color), "client_id": "h"}, owner="h")
    newest = srv.get_json("/history?max_items=2")
    everything = srv.get_json("/history")
    assert list(newest) == list(everything)[-2:]
    victim = next(iter(newest))
    assert srv.post_json("/history", {"delete": [victim]})[0] == 200
    assert victim not in srv.get_json("/history")
    assert srv.post_json("/history", {"clear": True})[0] == 200
    assert srv.get_json("/history") == {}


def test_soft_oom_warnings_are_logged_and_the_prompt_succeeds(srv: StandinProcess) -> None:
    _, answer, _ = record(
        srv,
        {"prompt": one_node("SoftOOM", kind="vae_decode", count=2), "client_id": "soft"},
        owner="soft",
    )
    entry = srv.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]
    assert entry["status"]["status_str"] == "success"
    err = srv.stderr_text()
    assert (
        err.count(
            "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.\n"
        )
        >= 2
    )


def test_save_image_writes_png_with_prompt_and_workflow(srv: StandinProcess) -> None:
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 32, "height": 32, "batch_size": 2, "color": 7},
        },
        "2": {
            "class_type": "SaveImage",
            "inputs": {"images": ["1", 0], "filename_prefix": "sub/Out"},
        },
    }
    workflow = {"id": "wf", "nodes": [{"id": 1, "type": "EmptyImage"}]}
    _, answer, _ = record(
        srv,
        {
            "prompt": prompt,
            "client_id": "save",
            "extra_data": {"extra_pnginfo": {"workflow": workflow}},
        },
        owner="save",
    )
    images = srv.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]["outputs"]["2"][
        "images"
    ]
    assert [(i["filename"], i["subfolder"], i["type"]) for i in images] == [
        ("Out_00001_.png", "sub", "output"),
        ("Out_00002_.png", "sub", "output"),
    ]
    data = (srv.base_dir / "output" / "sub" / "Out_00001_.png").read_bytes()
    assert data.startswith(b"\x89PNG") and b"tEXtprompt\x00" in data and b"tEXtworkflow\x00" in data
    assert json.dumps(workflow).encode() in data


# ---- real memory -------------------------------------------------------------------------------
def test_allocate_ram_really_grows_rss(srv: StandinProcess) -> None:
    proc = psutil.Process(srv.pid)
    before = proc.memory_info().rss
    _, answer, _ = record(
        srv, {"prompt": one_node("AllocateRAM", mib=96), "client_id": "ram"}, owner="ram"
    )
    assert (
        srv.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]["status"]["status_str"]
        == "success"
    )
    # the output stays cached, so the memory stays resident after the prompt
    assert proc.memory_info().rss - before >= 90 * MIB


def test_cache_none_runs_every_node_again(standin: Any) -> None:
    proc = standin("--cache-none")
    body = {"prompt": blur_prompt(color=5), "client_id": "n"}
    record(proc, body, owner="n")
    _, _, sinks = record(proc, body, owner="n")
    assert [m["data"]["node"] for m in sinks["n"] if m["type"] == "executing"] == ["1", "2", None]


@pytest.mark.parametrize(
    ("prompt", "exception_type", "message_re"),
    [
        pytest.param(
            one_node("AllocateRAM", mib=2048), "MemoryError", r"^\n$", id="python-bytearray"
        ),
        pytest.param(
            one_node("EmptyImage", width=8192, height=8192, batch_size=4, color=0),
            "RuntimeError",
            r"^\[enforce fail at alloc_cpu\.cpp:127\] err == 0\. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes\. Error code 12 \(Cannot allocate memory\)\n$",
            id="torch-cpu-tensor",
        ),
        pytest.param(
            {
                "1": {
                    "class_type": "EmptyImage",
                    "inputs": {"width": 1024, "height": 1024, "batch_size": 1, "color": 0},
                },
                "2": {
                    "class_type": "ImageScaleBy",
                    "inputs": {"image": ["1", 0], "upscale_method": "bilinear", "scale_by": 4.0},
                },
                "3": {
                    "class_type": "SaveImage",
                    "inputs": {"images": ["2", 0], "filename_prefix": "big"},
                },
            },
            "numpy._core._exceptions._ArrayMemoryError",
            r"^Unable to allocate 192\. MiB for an array with shape \(4096, 4096, 3\) and data type float32\n$",
            id="numpy-array",
        ),
    ],
)
def test_address_space_limit_gives_real_memory_errors(
    rlimited: StandinProcess, prompt: dict[str, Any], exception_type: str, message_re: str
) -> None:
    status, answer, sinks = record(rlimited, {"prompt": prompt, "client_id": "as"}, owner="as")
    assert status == 200, answer
    error = next(m for m in sinks["as"] if m["type"] == "execution_error")["data"]
    assert error["exception_type"] == exception_type
    assert re.match(message_re, error["exception_message"]), error["exception_message"]
    assert rlimited.alive()
    assert "Got an OOM" not in rlimited.stderr_text()


@pytest.fixture(scope="module")
def rlimited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    # Room for one 4096x4096 image (192 MiB), not for a second one beside it.
    proc = start_standin(tmp_path_factory.mktemp("standin-rlimit"), rlimit_as_headroom_mib=300)
    yield proc
    proc.stop()


def _wait(cond: Any, timeout_s: float = 30.0) -> None:
    asyncio.run(_until(cond, timeout_s))


# ---- the fake GPU ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fakegpu")
    FakeGpuDir(root).create(
        [
            FakeDevice(0, "NVIDIA GeForce RTX 4060", 8 * 1024 * MIB, base_used_bytes=512 * MIB),
            FakeDevice(1, "NVIDIA GeForce RTX 3090", 24 * 1024 * MIB),
        ]
    )
    return root


@pytest.fixture(scope="module")
def gpu_srv(tmp_path_factory: pytest.TempPathFactory, gpu_dir: Path) -> Iterator[StandinProcess]:
    proc = start_standin(tmp_path_factory.mktemp("standin-gpu"), fake_gpu=gpu_dir)
    yield proc
    proc.stop()


def test_fake_gpu_startup_lines_and_system_stats(gpu_srv: StandinProcess) -> None:
    err = gpu_srv.stderr_text()
    assert re.search(r"^Total VRAM 8192 MB, total RAM \d+ MB$", err, re.M)
    assert "Set vram state to: NORMAL_VRAM\n" in err
    assert "Device: cuda:0 NVIDIA GeForce RTX 4060 : native\n" in err
    (device,) = gpu_srv.get_json("/system_stats")["devices"]
    assert device["name"] == "cuda:0 NVIDIA GeForce RTX 4060 : native"
    assert device["type"] == "cuda" and device["index"] == 0
    assert device["vram_total"] == 8 * 1024 * MIB
    assert device["vram_free"] == (8 * 1024 - 512 - 312) * MIB


def test_fake_gpu_usage_is_published_per_process(gpu_srv: StandinProcess, gpu_dir: Path) -> None:
    _, _answer, _ = record(
        gpu_srv, {"prompt": one_node("AllocateVRAM", mib=1000), "client_id": "v"}, owner="v"
    )
    usage = {p.pid: p for p in FakeGpuDir(gpu_dir).processes()}[gpu_srv.pid]
    assert usage.device_index == 0
    assert usage.used_bytes == (312 + 1000) * MIB  # the CUDA context plus the cached output
    stats = gpu_srv.get_json("/system_stats")["devices"][0]
    assert stats["torch_vram_total"] == 1000 * MIB


def test_fake_gpu_oom_reads_like_torch(gpu_srv: StandinProcess, gpu_dir: Path) -> None:
    # Another process on the card, as the seed guide's first check expects to see.
    FakeGpuDir(gpu_dir).report(
        FakeProcessUsage(os.getpid(), "other-app", 0, 2048 * MIB, 2048 * MIB)
    )
    try:
        _, _answer, sinks = record(
            gpu_srv, {"prompt": one_node("AllocateVRAM", mib=6144), "client_id": "oom"}, owner="oom"
        )
    finally:
        (gpu_dir / f"proc-{os.getpid()}.json").unlink()
    assert types(sinks["oom"]) == ERROR_ORDER
    error = next(m for m in sinks["oom"] if m["type"] == "execution_error")["data"]
    assert error["exception_type"] == "torch.OutOfMemoryError"
    message = error["exception_message"]
    assert message.startswith(
        "CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which "
    )
    assert (
        f"Process {os.getpid()} has 2.00 GiB memory in use. Including non-PyTorch memory, this process has "
        in message
    )
    assert (
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        in message
    )
    assert message.endswith(
        "\nThis error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before you might have accidentally set the batch_size to a large number."
    )
    err = gpu_srv.wait_for_stderr("Got an OOM, unloading all loaded models.")
    tail = err[err.rindex("!!! Exception during processing !!! CUDA out of memory.") :]
    assert "torch.OutOfMemoryError: CUDA out of memory." in tail
    assert tail.index("Memory summary: ") < tail.index("Got an OOM, unloading all loaded models.")
    assert gpu_srv.alive()


def test_cuda_device_flag_picks_the_device(standin: Any, gpu_dir: Path) -> None:
    proc = standin("--cuda-device", "1", "--lowvram", fake_gpu=gpu_dir)
    err = proc.stderr_text()
    assert "Set cuda device to: 1\n" in err and "Set vram state to: LOW_VRAM\n" in err
    assert "Device: cuda:0 NVIDIA GeForce RTX 3090 : native\n" in err
    assert {p.pid: p for p in FakeGpuDir(gpu_dir).processes()}[proc.pid].device_index == 1


def test_cuda_malloc_changes_the_backend_and_the_oom_text(standin: Any, gpu_dir: Path) -> None:
    proc = standin("--cuda-malloc", fake_gpu=gpu_dir)
    assert "Device: cuda:0 NVIDIA GeForce RTX 4060 : cudaMallocAsync\n" in proc.stderr_text()
    _, _, sinks = record(
        proc, {"prompt": one_node("AllocateVRAM", mib=64 * 1024), "client_id": "a"}, owner="a"
    )
    error = next(m for m in sinks["a"] if m["type"] == "execution_error")["data"]
    assert error["exception_type"] == "torch.OutOfMemoryError"
    assert error["exception_message"].startswith(
        "Allocation on device \nThis error means you ran out of memory on your GPU."
    )


def test_image_blur_works_on_the_device_and_runs_out_of_it(
    standin: Any, tmp_path: Path, gpu_dir: Path
) -> None:
    # 64 images of 2048x2048 are 3 GiB; the install keeps host RAM at 1/64 of that and VRAM whole.
    install = _tuned_install(tmp_path / "install", memory_factor=1 / 64, vram_factor=64.0)
    proc = standin(code_dir=install, fake_gpu=gpu_dir)
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 2048, "height": 2048, "batch_size": 64, "color": 0},
        },
        "2": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["1", 0], "blur_radius": 31, "sigma": 1.0},
        },
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }
    _, _, sinks = record(proc, {"prompt": prompt, "client_id": "blur"}, owner="blur")
    error = next(m for m in sinks["blur"] if m["type"] == "execution_error")["data"]
    assert error["node_type"] == "ImageBlur" and error["executed"] == ["1"]
    assert error["exception_type"] == "torch.OutOfMemoryError"
    assert error["exception_message"].startswith(
        "CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 8.00 GiB"
    )


def test_model_workflow_loads_samples_and_retries_vae_tiled(standin: Any, tmp_path: Path) -> None:
    small = tmp_path / "small-gpu"
    FakeGpuDir(small).create([FakeDevice(0, "NVIDIA GeForce GTX 1650", 2048 * MIB)])
    install = _tuned_install(tmp_path / "install", ram_factor=1 / 16)
    models = tmp_path / "base" / "models" / "checkpoints"
    models.mkdir(parents=True)
    with (models / "tiny.safetensors").open("wb") as fh:
        fh.truncate(32 * MIB)
    proc = standin(code_dir=install, fake_gpu=small, base_dir=tmp_path / "base")
    # A 2048x1536 batch of 16: the sampler fits (64 x latent), the regular VAE decode does not
    # (192 x latent), the tiled retry does (24 x latent).
    prompt = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny.safetensors"}},
        "2": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": 2048, "height": 1536, "batch_size": 16},
        },
        "3": {
            "class_type": "StandinSampler",
            "inputs": {
                "model": ["1", 0],
                "seed": 7,
                "steps": 3,
                "cfg": 7.0,
                "latent_image": ["2", 0],
                "denoise": 1.0,
            },
        },
        "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 2]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "wf"}},
    }
    _, answer, sinks = record(proc, {"prompt": prompt, "client_id": "wf"}, owner="wf")
    msgs = sinks["wf"]
    assert [m["data"]["value"] for m in msgs if m["type"] == "progress"] == [1, 2, 3]
    assert all(m["data"]["node"] == "3" for m in msgs if m["type"] == "progress")
    entry = proc.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]
    assert entry["status"]["status_str"] == "success" and len(entry["outputs"]["5"]["images"]) == 16
    err = proc.stderr_text()
    assert "Requested to load BaseModel\n" in err and "Requested to load AutoencoderKL\n" in err
    assert re.search(
        r"^loaded completely; \d+\.\d\d MB usable, 32\.00 MB loaded, full load: True$", err, re.M
    )
    assert (
        "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.\n"
        in err
    )


def _tuned_install(dest: Path, **tuning: Any) -> Path:
    import shutil

    from standin_proc import STANDIN_DIR

    shutil.copytree(STANDIN_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "user"))
    (dest / "standin_tuning.json").write_text(json.dumps(tuning))
    return dest


def test_memory_factor_in_the_install_scales_allocations(
    standin: Any, tmp_path: Path, gpu_dir: Path
) -> None:
    install = _tuned_install(tmp_path / "install", memory_factor=1.5)
    proc = standin(code_dir=install, fake_gpu=gpu_dir)
    record(proc, {"prompt": one_node("AllocateVRAM", mib=200), "client_id": "f"}, owner="f")
    usage = {p.pid: p for p in FakeGpuDir(gpu_dir).processes()}[proc.pid]
    assert usage.used_bytes == (312 + 300) * MIB


def test_old_torch_names_the_oom_class_torch_cuda(
    standin: Any, tmp_path: Path, gpu_dir: Path
) -> None:
    install = _tuned_install(tmp_path / "install", torch_version="2.3.1+cu121")
    proc = standin(code_dir=install, fake_gpu=gpu_dir)
    assert "pytorch version: 2.3.1+cu121\n" in proc.stderr_text()
    _, _, sinks = record(
        proc, {"prompt": one_node("AllocateVRAM", mib=64 * 1024), "client_id": "t"}, owner="t"
    )
    error = next(m for m in sinks["t"] if m["type"] == "execution_error")["data"]
    assert error["exception_type"] == "torch.cuda.OutOfMemoryError"
    assert "torch.cuda.OutOfMemoryError: CUDA out of memory." in proc.stderr_text()


def test_no_gpu_and_no_cpu_flag_fails_like_a_cuda_torch(tmp_path: Path) -> None:
    proc = start_standin(tmp_path, cpu=False, wait_ready=False)
    assert proc.proc.wait(timeout=30) == 1
    assert "RuntimeError: Found no NVIDIA driver on your system." in proc.stderr_text()


# ---- custom nodes ------------------------------------------------------------------------------
PACK_INIT = """
import standin_api

class Doubler:
    CATEGORY = "test"
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1})}}

    def run(self, value):
        return (value * 2,)

standin_api.scale_memory("AllocateVRAM", 2.0)
NODE_CLASS_MAPPINGS = {"Doubler": Doubler, "EmptyImage": Doubler}
NODE_DISPLAY_NAME_MAPPINGS = {"Doubler": "Doubler (pack)"}
"""


@pytest.fixture
def custom_nodes(tmp_path: Path) -> Path:
    base = tmp_path / "base"
    nodes = base / "custom_nodes"
    (nodes / "good-pack").mkdir(parents=True)
    (nodes / "good-pack" / "__init__.py").write_text(PACK_INIT)
    (nodes / "single_file.py").write_text(
        "NODE_CLASS_MAPPINGS = {'SingleFileNode': type('SingleFileNode', (), {'INPUT_TYPES': classmethod(lambda c: {'required': {}}), 'RETURN_TYPES': (), 'FUNCTION': 'f'})}\n"
    )
    (nodes / "broken-pack").mkdir()
    (nodes / "broken-pack" / "__init__.py").write_text(
        "raise ImportError('No module named kornia')\n"
    )
    (nodes / "no-mappings").mkdir()
    (nodes / "no-mappings" / "__init__.py").write_text("X = 1\n")
    (nodes / "off-pack.disabled").mkdir()
    (nodes / "off-pack.disabled" / "__init__.py").write_text("raise SystemExit('must not load')\n")
    (nodes / ".disabled" / "managed-off").mkdir(parents=True)
    (nodes / "notes.txt").write_text("ignored")
    return base


def test_custom_nodes_load_like_comfyui(custom_nodes: Path, tmp_path: Path, gpu_dir: Path) -> None:
    proc = start_standin(custom_nodes, fake_gpu=gpu_dir)
    try:
        err = proc.stderr_text()
        block = err[err.index("\nImport times for custom nodes:\n") :]
        lines = [line for line in block.splitlines()[2:] if line.strip()][:4]
        assert len(lines) == 4
        for line in lines:
            assert re.fullmatch(r" +\d+\.\d seconds( \(IMPORT FAILED\))?: .+", line)
        failed = {line.rsplit(": ", 1)[1] for line in lines if "(IMPORT FAILED)" in line}
        assert failed == {
            str(custom_nodes / "custom_nodes" / "broken-pack"),
            str(custom_nodes / "custom_nodes" / "no-mappings"),
        }
        assert (
            f"Cannot import {custom_nodes / 'custom_nodes' / 'broken-pack'} module for custom nodes: No module named kornia"
            in err
        )
        assert (
            f"Skip {custom_nodes / 'custom_nodes' / 'no-mappings'} module for custom nodes due to the lack of NODE_CLASS_MAPPINGS or NODES_LIST (need one)."
            in err
        )
        assert "must not load" not in err and "managed-off" not in err
        info = proc.get_json("/object_info")
        assert (
            info["Doubler"]["python_module"] == "custom_nodes.good-pack"
            and info["Doubler"]["display_name"] == "Doubler (pack)"
        )
        assert info["SingleFileNode"]["python_module"] == "custom_nodes.single_file"
        assert info["EmptyImage"]["python_module"] == "nodes"  # core names cannot be overridden
        # the pack doubled AllocateVRAM's memory
        record(proc, {"prompt": one_node("AllocateVRAM", mib=100), "client_id": "p"}, owner="p")
        assert {p.pid: p for p in FakeGpuDir(gpu_dir).processes()}[proc.pid].used_bytes == (
            312 + 200
        ) * MIB
    finally:
        proc.stop()


def test_disable_all_custom_nodes_with_whitelist(custom_nodes: Path) -> None:
    proc = start_standin(
        custom_nodes, "--disable-all-custom-nodes", "--whitelist-custom-nodes", "single_file.py"
    )
    try:
        err = proc.stderr_text()
        assert (
            "Skipping good-pack due to disable_all_custom_nodes and whitelist_custom_nodes" in err
        )
        info = proc.get_json("/object_info")
        assert "SingleFileNode" in info and "Doubler" not in info
    finally:
        proc.stop()
    proc = start_standin(custom_nodes, "--disable-all-custom-nodes")
    try:
        assert "Skipping loading of custom nodes" in proc.stderr_text()
        assert "Import times for custom nodes" not in proc.stderr_text()
    finally:
        proc.stop()


def test_custom_nodes_from_extra_model_paths_yaml(tmp_path: Path) -> None:
    pack = tmp_path / "elsewhere" / "testing-pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(PACK_INIT)
    models = tmp_path / "shared-models" / "checkpoints"
    models.mkdir(parents=True)
    (models / "tiny.safetensors").write_bytes(b"\0" * 4096)
    yaml_path = tmp_path / "extra.yaml"
    yaml_path.write_text(
        f"tests:\n  custom_nodes: {tmp_path / 'elsewhere'}\nmodels:\n  base_path: {tmp_path / 'shared-models'}\n  checkpoints: checkpoints\n"
    )
    proc = start_standin(tmp_path / "base", "--extra-model-paths-config", str(yaml_path))
    try:
        err = proc.stderr_text()
        assert f"Adding extra search path custom_nodes {tmp_path / 'elsewhere'}" in err
        assert f"Adding extra search path checkpoints {models}" in err
        info = proc.get_json("/object_info")
        assert "Doubler" in info
        assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] == [
            "tiny.safetensors"
        ]
        prompt = {
            "1": {
                "class_type": "CheckpointLoaderSimple",
                "inputs": {"ckpt_name": "tiny.safetensors"},
            },
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }
        _, answer, _ = record(proc, {"prompt": prompt, "client_id": "ck"}, owner="ck")
        assert (
            proc.get_json(f"/history/{answer['prompt_id']}")[answer["prompt_id"]]["status"][
                "status_str"
            ]
            == "success"
        )
    finally:
        proc.stop()


# ---- ComfyUI-Manager-style log file -------------------------------------------------------------
def test_manager_log_file_prefixes_and_rotates(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    port = None
    for _ in range(3):
        proc = start_standin(tmp_path, "--user-directory", str(user), manager_log=True, port=port)
        port = proc.port
        record(
            proc,
            {
                "prompt": one_node("Fail", message="logged failure", exception="RuntimeError"),
                "client_id": "m",
            },
            owner="m",
        )
        proc.wait_for_stderr("Prompt executed in")
        proc.stop()
    log = user / f"comfyui_{port}.log"
    assert (
        log.exists()
        and (user / f"comfyui_{port}.prev.log").exists()
        and (user / f"comfyui_{port}.prev2.log").exists()
    )
    assert not (user / f"comfyui_{port}.prev3.log").exists()
    text = log.read_text("utf-8")
    assert f"** Log path: {log}" in text
    lines = text.splitlines()
    stamp = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] ")
    assert any(stamp.match(line) and line.endswith("Set vram state to: DISABLED") for line in lines)
    tb_start = next(
        i for i, line in enumerate(lines) if line.endswith("Traceback (most recent call last):")
    )
    assert stamp.match(lines[tb_start])
    assert not stamp.match(lines[tb_start + 1])  # continuation lines of one write get no prefix
    assert any(line == "RuntimeError: logged failure" for line in lines)

"""The stand-in's aiohttp server: ComfyUI v0.8.0's endpoints, bodies and websocket routing.

Every route is registered at its plain path and again under ``/api``; ``/internal/*`` is a
sub-app without the alias (comfyui-facts.md 1.1). Messages from the worker thread go through one
asyncio queue, so clients see them in the order the worker produced them. Execution messages go
to the socket whose ``clientId`` equals the running prompt's ``client_id``; ``sid=None`` means
every socket (facts 1.10).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import struct
import sys
import time
import uuid
from typing import Any

import psutil
import standin_api as api
import standin_execution as ex
import standin_logging
import standin_nodes
from aiohttp import WSMsgType, web

#: Fault injection for client tests: websocket events never sent (``$OOM_STANDIN_WS_DROP``,
#: comma separated), e.g. ``executing`` to make a client fall back to polling history.
WS_DROP = frozenset(e for e in os.environ.get("OOM_STANDIN_WS_DROP", "").split(",") if e)

SERVER_FEATURE_FLAGS = {"supports_preview_metadata": True, "max_upload_size": 100 * 1024 * 1024}


class PromptServer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        comfyui_version: str,
        torch_version: str,
        device_name: str,
        max_upload_mb: float,
    ) -> None:
        self.loop = loop
        self.messages: asyncio.Queue[tuple[str | int, Any, str | None]] = asyncio.Queue()
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.sockets_metadata: dict[str, dict[str, Any]] = {}
        self.client_id: str | None = None
        self.last_node_id: str | None = None
        self.last_prompt_id: str | None = None
        self.number = 0
        self.comfyui_version = comfyui_version
        self.torch_version = torch_version
        self.device_name = device_name
        self.max_upload_bytes = int(max_upload_mb * 1024 * 1024)
        self.prompt_queue = ex.PromptQueue(self)
        self.app = web.Application(client_max_size=self.max_upload_bytes)
        self._routes = web.RouteTableDef()
        self._add_routes()

    # ---- sending ----------------------------------------------------------------------------
    def send_sync(self, event: str | int, data: Any, sid: str | None = None) -> None:
        self.loop.call_soon_threadsafe(self.messages.put_nowait, (event, data, sid))

    def queue_updated(self) -> None:
        self.send_sync("status", {"status": self.get_queue_info()})

    def get_queue_info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": self.prompt_queue.get_tasks_remaining()}}

    async def send(self, event: str | int, data: Any, sid: str | None = None) -> None:
        if isinstance(event, int):
            payload = struct.pack(">I", event) + struct.pack(">I", 2) + data
            await self._deliver(payload, sid, binary=True)
        elif event not in WS_DROP:
            await self._deliver(json.dumps({"type": event, "data": data}), sid, binary=False)

    async def _deliver(self, payload: str | bytes, sid: str | None, binary: bool) -> None:
        targets = (
            list(self.sockets.values())
            if sid is None
            else [self.sockets[sid]]
            if sid in self.sockets
            else []
        )
        for ws in targets:
            try:
                if binary:
                    await ws.send_bytes(payload)  # type: ignore[arg-type]
                else:
                    await ws.send_str(payload)  # type: ignore[arg-type]
            except (ConnectionError, RuntimeError) as err:
                logging.warning(f"send error: {err}")

    async def publish_loop(self) -> None:
        while True:
            event, data, sid = await self.messages.get()
            await self.send(event, data, sid)

    # ---- routes -----------------------------------------------------------------------------
    def _add_routes(self) -> None:
        r = self._routes

        @r.get("/ws")
        async def websocket_handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            sid = request.rel_url.query.get("clientId", "")
            if sid:
                self.sockets.pop(sid, None)
            else:
                sid = uuid.uuid4().hex
            self.sockets[sid] = ws
            try:
                await self.send("status", {"status": self.get_queue_info(), "sid": sid}, sid)
                if self.client_id == sid and self.last_node_id is not None:
                    await self.send("executing", {"node": self.last_node_id}, sid)
                first = True
                async for msg in ws:
                    if msg.type == WSMsgType.ERROR:
                        logging.warning(f"ws connection closed with exception {ws.exception()}")
                    elif msg.type == WSMsgType.TEXT:
                        try:
                            data = json.loads(msg.data)
                        except ValueError:
                            data = None
                        if first and isinstance(data, dict) and data.get("type") == "feature_flags":
                            self.sockets_metadata[sid] = {"feature_flags": data.get("data", {})}
                            await self.send("feature_flags", SERVER_FEATURE_FLAGS, sid)
                        first = False
            finally:
                if self.sockets.get(sid) is ws:
                    self.sockets.pop(sid, None)
                self.sockets_metadata.pop(sid, None)
            return ws

        @r.get("/prompt")
        async def get_prompt(request: web.Request) -> web.Response:
            return web.json_response(self.get_queue_info())

        @r.post("/prompt")
        async def post_prompt(request: web.Request) -> web.Response:
            logging.info("got prompt")
            try:
                json_data = await request.json()
            except ValueError:
                json_data = {}
            if not isinstance(json_data, dict):
                json_data = {}
            if "number" in json_data:
                number: float | int = float(json_data["number"])
            else:
                number = self.number
                if json_data.get("front"):
                    number = -number
                self.number += 1
            if "prompt" not in json_data:
                error = {
                    "type": "no_prompt",
                    "message": "No prompt provided",
                    "details": "No prompt provided",
                    "extra_info": {},
                }
                return web.json_response({"error": error, "node_errors": {}}, status=400)
            prompt = json_data["prompt"]
            prompt_id = str(json_data.get("prompt_id", uuid.uuid4()))
            partial = json_data.get("partial_execution_targets")
            valid = ex.validate_prompt(prompt, partial)
            extra_data = json_data.get("extra_data", {}) or {}
            if "client_id" in json_data:
                extra_data["client_id"] = json_data["client_id"]
            if valid[0]:
                sensitive = {
                    key: extra_data.pop(key)
                    for key in ex.SENSITIVE_EXTRA_DATA_KEYS
                    if key in extra_data
                }
                extra_data["create_time"] = int(time.time() * 1000)
                self.prompt_queue.put((number, prompt_id, prompt, extra_data, valid[2], sensitive))
                return web.json_response(
                    {"prompt_id": prompt_id, "number": number, "node_errors": valid[3]}
                )
            logging.warning(f"invalid prompt: {valid[1]}")
            return web.json_response({"error": valid[1], "node_errors": valid[3]}, status=400)

        @r.get("/queue")
        async def get_queue(request: web.Request) -> web.Response:
            running, pending = self.prompt_queue.get_current_queue()
            return web.json_response({"queue_running": running, "queue_pending": pending})

        @r.post("/queue")
        async def post_queue(request: web.Request) -> web.Response:
            json_data = await _json_or_empty(request)
            if json_data.get("clear"):
                self.prompt_queue.wipe_queue()
            for prompt_id in json_data.get("delete", []) or []:
                self.prompt_queue.delete_queue_item(lambda item, pid=prompt_id: item[1] == pid)
            return web.Response(status=200)

        @r.get("/history")
        async def get_history(request: web.Request) -> web.Response:
            query = request.rel_url.query
            max_items = int(query["max_items"]) if "max_items" in query else None
            offset = int(query.get("offset", -1))
            return web.json_response(
                self.prompt_queue.get_history(max_items=max_items, offset=offset)
            )

        @r.get("/history/{prompt_id}")
        async def get_history_item(request: web.Request) -> web.Response:
            return web.json_response(
                self.prompt_queue.get_history(prompt_id=request.match_info["prompt_id"])
            )

        @r.post("/history")
        async def post_history(request: web.Request) -> web.Response:
            json_data = await _json_or_empty(request)
            if json_data.get("clear"):
                self.prompt_queue.wipe_history()
            for prompt_id in json_data.get("delete", []) or []:
                self.prompt_queue.delete_history_item(prompt_id)
            return web.Response(status=200)

        @r.get("/system_stats")
        async def system_stats(request: web.Request) -> web.Response:
            return web.json_response(self.system_stats())

        @r.get("/object_info")
        async def object_info(request: web.Request) -> web.Response:
            out = {}
            for name, cls in ex.NODE_CLASS_MAPPINGS.items():
                try:
                    out[name] = standin_nodes.object_info_entry(
                        name, cls, ex.NODE_DISPLAY_NAME_MAPPINGS
                    )
                except Exception:
                    standin_nodes.log_node_import_error(name)
            return web.json_response(out)

        @r.get("/object_info/{node_class}")
        async def object_info_one(request: web.Request) -> web.Response:
            name = request.match_info["node_class"]
            cls = ex.NODE_CLASS_MAPPINGS.get(name)
            if cls is None:
                return web.json_response({})
            return web.json_response(
                {name: standin_nodes.object_info_entry(name, cls, ex.NODE_DISPLAY_NAME_MAPPINGS)}
            )

        @r.post("/free")
        async def free(request: web.Request) -> web.Response:
            json_data = await request.json()
            if json_data.get("unload_models", False):
                self.prompt_queue.set_flag("unload_models", True)
            if json_data.get("free_memory", False):
                self.prompt_queue.set_flag("free_memory", True)
            return web.Response(status=200)

        @r.post("/interrupt")
        async def interrupt(request: web.Request) -> web.Response:
            json_data = await _json_or_empty(request)
            prompt_id = json_data.get("prompt_id")
            if prompt_id:
                if prompt_id in self.prompt_queue.running_prompt_ids():
                    logging.info(f"Interrupting prompt {prompt_id}")
                    api.RUNTIME.interrupted.set()
                else:
                    logging.info(f"Prompt {prompt_id} is not currently running, skipping interrupt")
            else:
                logging.info("Global interrupt (no prompt_id specified)")
                api.RUNTIME.interrupted.set()
            return web.Response(status=200)

        @r.get("/features")
        async def features(request: web.Request) -> web.Response:
            return web.json_response(
                {
                    "supports_preview_metadata": True,
                    "max_upload_size": float(self.max_upload_bytes),
                    "extension": {"manager": {"supports_v4": True}},
                }
            )

        @r.get("/embeddings")
        async def embeddings(request: web.Request) -> web.Response:
            return web.json_response([])

        @r.get("/extensions")
        async def extensions(request: web.Request) -> web.Response:
            return web.json_response([])

        @r.get("/models")
        async def models(request: web.Request) -> web.Response:
            return web.json_response(sorted(api.RUNTIME.folder_paths))

        @r.get("/models/{folder}")
        async def models_in(request: web.Request) -> web.Response:
            folder = request.match_info["folder"]
            if folder not in api.RUNTIME.folder_paths:
                return web.Response(status=404)
            return web.json_response(api.get_filename_list(folder))

        @r.get("/view")
        async def view(request: web.Request) -> web.StreamResponse:
            query = request.rel_url.query
            roots = {
                "output": api.RUNTIME.output_dir,
                "input": api.RUNTIME.input_dir,
                "temp": api.RUNTIME.temp_dir,
            }
            root = roots.get(query.get("type", "output"))
            filename = query.get("filename", "")
            if (
                root is None
                or not filename
                or "/" in filename
                or "\\" in filename
                or filename.startswith(".")
            ):
                return web.Response(status=400)
            path = (root / query.get("subfolder", "") / filename).resolve()
            if not str(path).startswith(str(root.resolve())) or not path.is_file():
                return web.Response(status=404)
            return web.FileResponse(path)

        for route in list(r):
            assert isinstance(route, web.RouteDef)
            self.app.router.add_route(route.method, route.path, route.handler)
            self.app.router.add_route(route.method, "/api" + route.path, route.handler)

        internal = web.Application()

        async def logs(request: web.Request) -> web.Response:
            return web.json_response(
                "".join(f"{e['t']} - {e['m']}" for e in standin_logging.get_logs())
            )

        async def logs_raw(request: web.Request) -> web.Response:
            cols, rows = _terminal_size()
            return web.json_response(
                {"entries": standin_logging.get_logs(), "size": {"cols": cols, "rows": rows}}
            )

        async def folder_paths(request: web.Request) -> web.Response:
            return web.json_response(
                {k: [str(p) for p in v] for k, v in api.RUNTIME.folder_paths.items()}
            )

        internal.router.add_get("/logs", logs)
        internal.router.add_get("/logs/raw", logs_raw)
        internal.router.add_get("/folder_paths", folder_paths)
        self.app.add_subapp("/internal", internal)

    # ---- system_stats -----------------------------------------------------------------------
    def system_stats(self) -> dict[str, Any]:
        vm = psutil.virtual_memory()
        cuda = api.RUNTIME.device.cuda
        if cuda is None:
            device = {
                "name": "cpu",
                "type": "cpu",
                "index": None,
                "vram_total": vm.total,
                "vram_free": vm.available,
                "torch_vram_total": vm.total,
                "torch_vram_free": vm.available,
            }
        else:
            driver_free = cuda.device_free_bytes()
            device = {
                "name": self.device_name,
                "type": "cuda",
                "index": 0,
                "vram_total": cuda.device.total_bytes,
                "vram_free": driver_free + cuda.cached_bytes,
                "torch_vram_total": cuda.reserved_bytes,
                "torch_vram_free": cuda.cached_bytes,
            }
        return {
            "system": {
                "os": sys.platform,
                "ram_total": vm.total,
                "ram_free": vm.available,
                "comfyui_version": self.comfyui_version,
                "required_frontend_version": "1.35.9",
                "installed_templates_version": "0.7.67",
                "required_templates_version": "0.7.67",
                "python_version": sys.version,
                "pytorch_version": self.torch_version,
                "embedded_python": os.path.split(os.path.split(sys.executable)[0])[1]
                == "python_embeded",
                "argv": sys.argv,
            },
            "devices": [device],
        }


def _terminal_size() -> tuple[int, int]:
    """The console's size as ``/internal/logs/raw`` reports it: the terminal's, else
    $COLUMNS/$LINES, else 80x24 (a real server started without a terminal says 80x24)."""
    try:
        size = os.get_terminal_size()
    except OSError:
        size = shutil.get_terminal_size((80, 24))
    return size.columns, size.lines


async def _json_or_empty(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        data = await request.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


async def start_multi_address(
    server: PromptServer, addresses: list[tuple[str, int]], verbose: bool
) -> web.AppRunner:
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    if verbose:
        logging.info("Starting server\n")
    for host, port in addresses:
        site = web.TCPSite(runner, host, port)
        await site.start()
        shown = f"[{host}]" if ":" in host else host
        if verbose:
            logging.info(f"To see the GUI go to: http://{shown}:{port}")
    return runner

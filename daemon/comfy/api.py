"""ComfyUI's HTTP and websocket API as typed records, shared by the daemon's watcher and the bisect.

One client so that both read ComfyUI the same way (comfyui-facts.md 1): plain paths (the ``/api``
alias only exists since 2024-06, and old bisect commits must work), the 5-element queue items,
history entries with their ``status.messages``, and ``run_prompt``, which follows facts 1.11:
open the websocket with our ``clientId`` *before* posting, post with our ``client_id`` and our
``prompt_id``, wait for ``executing`` with ``node: null`` for that id (sent after history is
written), fall back to polling ``/history/{id}``, and call a dropped socket plus a server that no
longer answers a crash: history lives in memory and dies with the process.

Foreign errors (aiohttp, timeouts, bad JSON) become ``ComfyError`` with one line naming the URL.
A prompt ComfyUI refuses (HTTP 400) is not an error here: ``PostResult`` carries ``error`` and
``node_errors`` so the bisect can call the state untestable (a skip).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from oom_sentinel.daemon.core.errors import ComfyError

if TYPE_CHECKING:  # aiohttp (~11 MiB) loads with the first client: a daemon with no ComfyUI
    import aiohttp  # to watch stays without it

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ComfyClient",
    "ComfyWebSocket",
    "DeviceStats",
    "HistoryEntry",
    "LogEntry",
    "PostResult",
    "QueueItem",
    "QueueState",
    "RunKind",
    "RunOutcome",
    "SystemStats",
    "WsMessage",
]

#: Per HTTP request. /object_info on an install with hundreds of packs takes a few seconds.
DEFAULT_TIMEOUT_S = 30.0
#: How often run_prompt polls /history/{id} when the websocket is quiet.
DEFAULT_POLL_INTERVAL_S = 1.0


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return int(value)
    return None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# ---- records ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class QueueItem:
    """``[number, prompt_id, prompt, extra_data, outputs_to_execute]`` from /queue or history."""

    number: float
    prompt_id: str
    #: the API-format prompt, replayable as is
    prompt: Mapping[str, Any]
    extra_data: Mapping[str, Any]
    outputs_to_execute: tuple[str, ...]

    @property
    def client_id(self) -> str | None:
        return _opt_str(self.extra_data.get("client_id"))

    @property
    def workflow(self) -> Mapping[str, Any] | None:
        """The UI workflow the frontend sent in ``extra_pnginfo.workflow``, if any."""
        pnginfo = self.extra_data.get("extra_pnginfo")
        if isinstance(pnginfo, Mapping):
            wf = pnginfo.get("workflow")
            if isinstance(wf, Mapping):
                return wf
        return None

    @property
    def create_time_ms(self) -> int | None:
        return _opt_int(self.extra_data.get("create_time"))

    @classmethod
    def from_json(cls, raw: Any) -> QueueItem:
        if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) < 3:
            raise ValueError(f"not a queue item: {str(raw)[:80]}")
        extra = raw[3] if len(raw) > 3 and isinstance(raw[3], Mapping) else {}
        outputs = raw[4] if len(raw) > 4 and isinstance(raw[4], Sequence) else ()
        prompt = raw[2] if isinstance(raw[2], Mapping) else {}
        try:
            number = float(raw[0])
        except (TypeError, ValueError):
            number = 0.0
        return cls(number, str(raw[1]), prompt, extra, tuple(str(o) for o in outputs))


@dataclass(frozen=True, slots=True)
class QueueState:
    running: tuple[QueueItem, ...]
    #: in ComfyUI's heap order, not sorted
    pending: tuple[QueueItem, ...]

    @property
    def remaining(self) -> int:
        return len(self.running) + len(self.pending)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    prompt_id: str
    item: QueueItem | None
    #: UI outputs per node ({"images": [...]}, {"text": [...]}); partial after an error
    outputs: Mapping[str, Any]
    #: "success" | "error"; None on versions that kept no status
    status_str: str | None
    completed: bool | None
    #: (event, payload) pairs: execution_start, execution_cached, execution_success|error|interrupted
    messages: tuple[tuple[str, Mapping[str, Any]], ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def message(self, event: str) -> Mapping[str, Any] | None:
        for name, payload in self.messages:
            if name == event:
                return payload
        return None

    @property
    def execution_error(self) -> Mapping[str, Any] | None:
        """The ``execution_error`` payload (same as the websocket's), if the prompt failed."""
        return self.message("execution_error")

    @property
    def interrupted(self) -> bool:
        return self.message("execution_interrupted") is not None

    @property
    def succeeded(self) -> bool:
        return self.status_str == "success"

    @property
    def cached_nodes(self) -> tuple[str, ...]:
        cached = self.message("execution_cached")
        nodes = cached.get("nodes") if cached else None
        return tuple(str(n) for n in nodes) if isinstance(nodes, list) else ()

    @classmethod
    def from_json(cls, prompt_id: str, raw: Any) -> HistoryEntry:
        if not isinstance(raw, Mapping):
            raise ValueError(f"history entry {prompt_id} is not an object")
        item = None
        with contextlib.suppress(ValueError):
            item = QueueItem.from_json(raw.get("prompt"))
        status = status_raw if isinstance(status_raw := raw.get("status"), Mapping) else {}
        messages: list[tuple[str, Mapping[str, Any]]] = []
        for pair in status.get("messages") or []:
            if isinstance(pair, Sequence) and len(pair) == 2 and isinstance(pair[0], str):
                payload = pair[1] if isinstance(pair[1], Mapping) else {}
                messages.append((pair[0], payload))
        completed = status.get("completed")
        return cls(
            prompt_id=prompt_id,
            item=item,
            outputs=outputs_raw if isinstance(outputs_raw := raw.get("outputs"), Mapping) else {},
            status_str=_opt_str(status.get("status_str")),
            completed=completed if isinstance(completed, bool) else None,
            messages=tuple(messages),
            meta=meta_raw if isinstance(meta_raw := raw.get("meta"), Mapping) else {},
        )


@dataclass(frozen=True, slots=True)
class DeviceStats:
    name: str
    #: "cuda", "cpu", "mps", "xpu", ...
    type: str
    index: int | None
    vram_total_bytes: int | None
    #: driver-free plus PyTorch's cached-but-unused memory (facts 1.6)
    vram_free_bytes: int | None
    #: what PyTorch's allocator holds now (reserved), not a total
    torch_vram_total_bytes: int | None
    torch_vram_free_bytes: int | None


@dataclass(frozen=True, slots=True)
class SystemStats:
    os: str | None
    ram_total_bytes: int | None
    ram_free_bytes: int | None
    comfyui_version: str | None
    python_version: str | None
    pytorch_version: str | None
    embedded_python: bool | None
    #: the running instance's command line (since 2024-08-30)
    argv: tuple[str, ...] | None
    devices: tuple[DeviceStats, ...]
    raw: Mapping[str, Any]

    @classmethod
    def from_json(cls, raw: Any) -> SystemStats:
        if not isinstance(raw, Mapping):
            raise ValueError("system_stats is not an object")
        system = system_raw if isinstance(system_raw := raw.get("system"), Mapping) else {}
        devices = []
        for dev in raw.get("devices") or []:
            if not isinstance(dev, Mapping):
                continue
            devices.append(
                DeviceStats(
                    name=str(dev.get("name", "")),
                    type=str(dev.get("type", "")),
                    index=_opt_int(dev.get("index")),
                    vram_total_bytes=_opt_int(dev.get("vram_total")),
                    vram_free_bytes=_opt_int(dev.get("vram_free")),
                    torch_vram_total_bytes=_opt_int(dev.get("torch_vram_total")),
                    torch_vram_free_bytes=_opt_int(dev.get("torch_vram_free")),
                )
            )
        argv = system.get("argv")
        embedded = system.get("embedded_python")
        return cls(
            os=_opt_str(system.get("os")),
            ram_total_bytes=_opt_int(system.get("ram_total")),
            ram_free_bytes=_opt_int(system.get("ram_free")),
            comfyui_version=_opt_str(system.get("comfyui_version")),
            python_version=_opt_str(system.get("python_version")),
            pytorch_version=_opt_str(system.get("pytorch_version")),
            embedded_python=embedded if isinstance(embedded, bool) else None,
            argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
            devices=tuple(devices),
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One captured console write from ``/internal/logs/raw``."""

    time_iso: str
    text: str


@dataclass(frozen=True, slots=True)
class PostResult:
    """The answer to ``POST /prompt``: accepted (200) or refused (400) with the reasons."""

    status_code: int
    prompt_id: str | None
    number: float | None
    #: per-node validation errors; may be non-empty on a 200 (failing outputs were dropped)
    node_errors: Mapping[str, Any]
    #: {type, message, details, extra_info} when refused
    error: Mapping[str, Any] | None

    @property
    def accepted(self) -> bool:
        return self.status_code == 200 and self.prompt_id is not None

    @property
    def error_type(self) -> str | None:
        return _opt_str(self.error.get("type")) if self.error else None

    def describe(self) -> str:
        """One line for a log or a skip reason."""
        if self.accepted:
            return f"accepted as {self.prompt_id}"
        if not self.error:
            return f"refused (HTTP {self.status_code})"
        text = f"refused: {self.error.get('type')}: {self.error.get('message')}"
        details = self.error.get("details")
        if details:
            text += f" ({str(details).splitlines()[0]})"
        return text


@dataclass(frozen=True, slots=True)
class WsMessage:
    type: str
    data: Mapping[str, Any]

    @property
    def prompt_id(self) -> str | None:
        return _opt_str(self.data.get("prompt_id"))


RunKind = Literal["success", "error", "interrupted", "rejected", "crashed", "timeout"]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What became of one prompt run through ``ComfyClient.run_prompt``."""

    kind: RunKind
    prompt_id: str
    post: PostResult | None
    #: None when the server died (history is in memory) or never answered
    history: HistoryEntry | None
    #: the execution_error payload (from history, else from the websocket)
    error: Mapping[str, Any] | None
    #: websocket messages that concerned this prompt, in arrival order (status excluded)
    messages: tuple[WsMessage, ...]
    #: nodes that actually ran (an ``executing`` message each)
    executed_nodes: tuple[str, ...]
    cached_nodes: tuple[str, ...]
    #: why, for crashed / timeout / rejected
    detail: str | None
    elapsed_s: float


# ---- the websocket ---------------------------------------------------------------------------
class ComfyWebSocket:
    """Text messages of one ``/ws?clientId=`` connection; binary preview frames are skipped."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, url: str, client_id: str) -> None:
        self._ws = ws
        self.url = url
        self.client_id = client_id
        #: the ``sid`` of the first ``status`` message
        self.sid: str | None = None
        self.closed = False
        #: closed without a close frame from the server: the process or the network went away
        self.dropped = False

    async def receive(self, timeout_s: float | None = None) -> WsMessage | None:
        """The next text message; None once the connection is closed. Raises ``TimeoutError``."""
        import aiohttp

        while not self.closed:
            try:
                msg = await self._ws.receive(timeout=timeout_s)
            except (aiohttp.ClientError, ConnectionError):
                self._mark_closed(dropped=True)
                return None
            if msg.type == aiohttp.WSMsgType.TEXT:
                try:
                    parsed = json.loads(msg.data)
                except ValueError:
                    continue
                if not isinstance(parsed, Mapping) or not isinstance(parsed.get("type"), str):
                    continue
                data = data_raw if isinstance(data_raw := parsed.get("data"), Mapping) else {}
                message = WsMessage(parsed["type"], data)
                if message.type == "status" and self.sid is None:
                    self.sid = _opt_str(data.get("sid"))
                return message
            if msg.type == aiohttp.WSMsgType.BINARY:
                continue
            self._mark_closed(dropped=msg.type != aiohttp.WSMsgType.CLOSE)
        return None

    def _mark_closed(self, dropped: bool) -> None:
        self.closed = True
        self.dropped = self.dropped or dropped

    def __aiter__(self) -> ComfyWebSocket:
        return self

    async def __anext__(self) -> WsMessage:
        msg = await self.receive()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self._ws.close()


# ---- the client ------------------------------------------------------------------------------
class ComfyClient:
    """HTTP and websocket access to one ComfyUI instance.

    Use as ``async with ComfyClient("http://127.0.0.1:8188") as client: ...``. ``client_id`` is
    the websocket ``clientId`` and the ``client_id`` posted with prompts (a fresh one if None).
    """

    def __init__(
        self, base_url: str, client_id: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        # a query in the URL (``?token=...`` for a ComfyUI behind an auth proxy) goes with
        # every request, and stays out of ``base_url``, which error messages name
        parts = urlsplit(base_url.strip())
        self.query: tuple[tuple[str, str], ...] = tuple(parse_qsl(parts.query))
        self.base_url = urlunsplit(parts._replace(query="", fragment="")).rstrip("/")
        self.client_id = client_id or uuid.uuid4().hex
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ComfyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        return self._session

    def _fail(self, path: str, what: str) -> ComfyError:
        return ComfyError(f"ComfyUI at {self.base_url}{path}: {what}")

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, str] | None = None,
        ok_status: tuple[int, ...] = (200,),
        timeout_s: float | None = None,
    ) -> tuple[int, str]:
        import aiohttp

        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with session.request(
                method,
                self.base_url + path,
                json=json_body,
                params=[*self.query, *(params or {}).items()] or None,
                timeout=timeout,
            ) as resp:
                text = await resp.text(errors="replace")
                if resp.status not in ok_status:
                    first = text.strip().splitlines()[0][:200] if text.strip() else ""
                    raise self._fail(path, f"HTTP {resp.status}{': ' + first if first else ''}")
                return resp.status, text
        except TimeoutError as exc:
            raise self._fail(path, f"no answer within {timeout.total:g} s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise self._fail(path, f"cannot connect ({exc.os_error or exc})") from exc
        except aiohttp.ClientError as exc:
            raise self._fail(path, f"{type(exc).__name__}: {exc}") from exc

    async def _get_json(
        self, path: str, params: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> Any:
        _, text = await self._request("GET", path, params=params, timeout_s=timeout_s)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise self._fail(path, "answered with invalid JSON") from exc

    # ---- endpoints --------------------------------------------------------------------------
    async def system_stats(self, timeout_s: float | None = None) -> SystemStats:
        raw = await self._get_json("/system_stats", timeout_s=timeout_s)
        try:
            return SystemStats.from_json(raw)
        except ValueError as exc:
            raise self._fail("/system_stats", str(exc)) from exc

    async def queue(self) -> QueueState:
        raw = await self._get_json("/queue")
        if not isinstance(raw, Mapping):
            raise self._fail("/queue", "answered with something other than an object")
        out: dict[str, tuple[QueueItem, ...]] = {}
        for key in ("queue_running", "queue_pending"):
            items = []
            for entry in raw.get(key) or []:
                with contextlib.suppress(ValueError):
                    items.append(QueueItem.from_json(entry))
            out[key] = tuple(items)
        return QueueState(out["queue_running"], out["queue_pending"])

    async def queue_remaining(self) -> int | None:
        raw = await self._get_json("/prompt")
        info = raw.get("exec_info") if isinstance(raw, Mapping) else None
        return _opt_int(info.get("queue_remaining")) if isinstance(info, Mapping) else None

    async def history(
        self, prompt_id: str | None = None, max_items: int | None = None
    ) -> dict[str, HistoryEntry]:
        """All entries (or the newest ``max_items``), or the one for ``prompt_id`` ({} while it
        is pending or running)."""
        path = "/history" if prompt_id is None else f"/history/{prompt_id}"
        params = (
            {"max_items": str(max_items)} if max_items is not None and prompt_id is None else None
        )
        raw = await self._get_json(path, params=params)
        if not isinstance(raw, Mapping):
            raise self._fail(path, "answered with something other than an object")
        out: dict[str, HistoryEntry] = {}
        for pid, entry in raw.items():
            with contextlib.suppress(ValueError):
                out[str(pid)] = HistoryEntry.from_json(str(pid), entry)
        return out

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None:
        return (await self.history(prompt_id)).get(prompt_id)

    async def object_info(self, node_class: str | None = None) -> dict[str, Any]:
        path = "/object_info" if node_class is None else f"/object_info/{node_class}"
        raw = await self._get_json(path)
        if not isinstance(raw, dict):
            raise self._fail(path, "answered with something other than an object")
        return raw

    async def internal_logs(self) -> str:
        """The console ring as one string of ``<ISO time> - <text>`` pieces."""
        raw = await self._get_json("/internal/logs")
        if not isinstance(raw, str):
            raise self._fail("/internal/logs", "answered with something other than a string")
        return raw

    async def internal_logs_raw(self) -> tuple[LogEntry, ...]:
        raw = await self._get_json("/internal/logs/raw")
        entries = raw.get("entries") if isinstance(raw, Mapping) else None
        if not isinstance(entries, list):
            raise self._fail("/internal/logs/raw", "answered without an entries list")
        return tuple(
            LogEntry(str(e.get("t", "")), str(e.get("m", "")))
            for e in entries
            if isinstance(e, Mapping)
        )

    async def post_prompt(
        self,
        prompt: Mapping[str, Any],
        *,
        prompt_id: str | None = None,
        extra_data: Mapping[str, Any] | None = None,
        client_id: str | None = None,
    ) -> PostResult:
        body: dict[str, Any] = {"prompt": prompt, "client_id": client_id or self.client_id}
        if prompt_id is not None:
            body["prompt_id"] = prompt_id
        if extra_data:
            body["extra_data"] = dict(extra_data)
        status, text = await self._request("POST", "/prompt", json_body=body, ok_status=(200, 400))
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise self._fail("/prompt", f"HTTP {status} with invalid JSON") from exc
        if not isinstance(raw, Mapping):
            raise self._fail("/prompt", f"HTTP {status} with something other than an object")
        node_errors = (
            node_errors_raw
            if isinstance(node_errors_raw := raw.get("node_errors"), Mapping)
            else {}
        )
        if status == 200:
            number = raw.get("number")
            return PostResult(
                200,
                _opt_str(raw.get("prompt_id")),
                float(number) if isinstance(number, int | float) else None,
                node_errors,
                None,
            )
        error = raw.get("error")
        if isinstance(error, str):
            error = {"type": None, "message": error, "details": "", "extra_info": {}}
        return PostResult(
            status, None, None, node_errors, error if isinstance(error, Mapping) else None
        )

    async def free(self, *, unload_models: bool = True, free_memory: bool = False) -> None:
        await self._request(
            "POST", "/free", json_body={"unload_models": unload_models, "free_memory": free_memory}
        )

    async def interrupt(self, prompt_id: str | None = None) -> None:
        body = {"prompt_id": prompt_id} if prompt_id else None
        await self._request("POST", "/interrupt", json_body=body)

    async def wait_ready(
        self,
        timeout_s: float,
        *,
        poll_interval_s: float = 0.1,
        alive: Callable[[], bool] | None = None,
    ) -> SystemStats:
        """Poll ``/system_stats`` until it answers; ``alive`` (e.g. the process's poll) ends the
        wait early when the process has exited."""
        deadline = time.monotonic() + timeout_s
        last: ComfyError | None = None
        while True:
            if alive is not None and not alive():
                raise self._fail("/system_stats", "the process exited before it was ready")
            try:
                return await self.system_stats(
                    timeout_s=max(0.5, min(5.0, deadline - time.monotonic()))
                )
            except ComfyError as err:
                last = err
            if time.monotonic() >= deadline:
                raise self._fail(
                    "/system_stats", f"not ready within {timeout_s:g} s (last: {last})"
                )
            await asyncio.sleep(poll_interval_s)

    async def is_up(self) -> bool:
        try:
            await self._request("GET", "/prompt", timeout_s=3.0)
        except ComfyError:
            return False
        return True

    async def open_websocket(self, client_id: str | None = None) -> ComfyWebSocket:
        """Connect ``/ws?clientId=``; the caller closes it (or use ``websocket()``)."""
        import aiohttp

        cid = client_id or self.client_id
        url = (
            self.base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
            + f"/ws?clientId={cid}"
        )
        try:
            raw = await self._get_session().ws_connect(
                url, heartbeat=None, max_msg_size=0, params=list(self.query) or None
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ComfyError(
                f"ComfyUI at {url}: websocket did not open ({type(exc).__name__}: {exc})"
            ) from exc
        return ComfyWebSocket(raw, url, cid)

    @contextlib.asynccontextmanager
    async def websocket(self, client_id: str | None = None) -> AsyncIterator[ComfyWebSocket]:
        """A websocket session: ``async with client.websocket() as ws: async for msg in ws``."""
        ws = await self.open_websocket(client_id)
        try:
            yield ws
        finally:
            await ws.close()

    # ---- one prompt, start to finish --------------------------------------------------------
    async def run_prompt(
        self,
        prompt: Mapping[str, Any],
        timeout_s: float,
        *,
        prompt_id: str | None = None,
        extra_data: Mapping[str, Any] | None = None,
        alive: Callable[[], bool] | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        interrupt_on_timeout: bool = False,
    ) -> RunOutcome:
        """Post ``prompt`` and wait for its outcome (comfyui-facts.md 1.11).

        Raises ``ComfyError`` only when the prompt could not be submitted; once it is accepted,
        every ending is a ``RunOutcome`` (a dead server is ``crashed``, a deadline ``timeout``).
        """
        pid = prompt_id or str(uuid.uuid4())
        started = time.monotonic()
        deadline = started + timeout_s
        run = _RunState(pid)
        ws = await self.open_websocket()
        try:
            post = await self.post_prompt(prompt, prompt_id=pid, extra_data=extra_data)
            if not post.accepted:
                return run.outcome("rejected", post, None, post.describe(), started)
            while not run.finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    entry = await self._history_or_none(pid)
                    if entry is not None:
                        return run.outcome_from_history(post, entry, started)
                    if interrupt_on_timeout:
                        with contextlib.suppress(ComfyError):
                            await self.interrupt(pid)
                    return run.outcome(
                        "timeout", post, None, f"no outcome within {timeout_s:g} s", started
                    )
                if ws.closed:
                    if not await self._alive(alive):
                        return run.outcome("crashed", post, None, _crash_detail(ws), started)
                    # The socket went away but the server answers: reconnect, then poll.
                    await ws.close()
                    try:
                        ws = await self.open_websocket()
                    except ComfyError:
                        if not await self._alive(alive):
                            return run.outcome("crashed", post, None, _crash_detail(ws), started)
                        raise
                    entry = await self._history_or_none(pid)
                    if entry is not None:
                        return run.outcome_from_history(post, entry, started)
                    continue
                try:
                    msg = await ws.receive(timeout_s=min(left, poll_interval_s))
                except TimeoutError:
                    if alive is not None and not alive():
                        return run.outcome(
                            "crashed",
                            post,
                            None,
                            "the ComfyUI process exited with no terminal event",
                            started,
                        )
                    try:
                        entry = await self.history_entry(pid)
                    except ComfyError:
                        if not await self._alive(alive):
                            return run.outcome(
                                "crashed",
                                post,
                                None,
                                "ComfyUI stopped answering with no terminal event",
                                started,
                            )
                        continue
                    if entry is not None:
                        return run.outcome_from_history(post, entry, started)
                    continue
                if msg is not None:
                    run.see(msg)
            entry = await self._history_or_none(pid)
            if entry is not None:
                return run.outcome_from_history(post, entry, started)
            return run.outcome_from_messages(post, started)
        finally:
            await ws.close()

    async def _history_or_none(self, prompt_id: str) -> HistoryEntry | None:
        try:
            return await self.history_entry(prompt_id)
        except ComfyError:
            return None

    async def _alive(self, alive: Callable[[], bool] | None) -> bool:
        if alive is not None and not alive():
            return False
        return await self.is_up()


def _crash_detail(ws: ComfyWebSocket) -> str:
    how = "dropped" if ws.dropped else "closed"
    return f"the websocket {how} with no terminal event and ComfyUI no longer answers"


class _RunState:
    """What the websocket has told us about one prompt so far."""

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id
        self.messages: list[WsMessage] = []
        self.executed: list[str] = []
        self.cached: list[str] = []
        self.finished = False

    def see(self, msg: WsMessage) -> None:
        if msg.type == "status" or msg.prompt_id != self.prompt_id:
            return
        self.messages.append(msg)
        if msg.type == "execution_cached":
            nodes = msg.data.get("nodes")
            if isinstance(nodes, list):
                self.cached = [str(n) for n in nodes]
        elif msg.type == "executing":
            node = msg.data.get("node")
            if node is None:
                self.finished = True
            elif str(node) not in self.executed:
                self.executed.append(str(node))

    def _ws_payload(self, event: str) -> Mapping[str, Any] | None:
        for msg in self.messages:
            if msg.type == event:
                return msg.data
        return None

    def outcome(
        self,
        kind: RunKind,
        post: PostResult | None,
        history: HistoryEntry | None,
        detail: str | None,
        started: float,
    ) -> RunOutcome:
        error = (
            history.execution_error if history is not None else self._ws_payload("execution_error")
        )
        return RunOutcome(
            kind=kind,
            prompt_id=self.prompt_id,
            post=post,
            history=history,
            error=error,
            messages=tuple(self.messages),
            executed_nodes=tuple(self.executed),
            cached_nodes=tuple(self.cached) or (history.cached_nodes if history else ()),
            detail=detail,
            elapsed_s=time.monotonic() - started,
        )

    def outcome_from_history(
        self, post: PostResult, entry: HistoryEntry, started: float
    ) -> RunOutcome:
        if entry.succeeded:
            kind: RunKind = "success"
        elif entry.interrupted:
            kind = "interrupted"
        else:
            kind = "error"
        return self.outcome(kind, post, entry, None, started)

    def outcome_from_messages(self, post: PostResult, started: float) -> RunOutcome:
        if self._ws_payload("execution_success") is not None:
            return self.outcome("success", post, None, "history was not readable", started)
        if self._ws_payload("execution_interrupted") is not None:
            return self.outcome("interrupted", post, None, "history was not readable", started)
        if self._ws_payload("execution_error") is not None:
            return self.outcome("error", post, None, "history was not readable", started)
        return self.outcome("crashed", post, None, "finished without a readable outcome", started)

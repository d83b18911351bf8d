"""Watch ComfyUI through its own API: which prompt runs, how it ended, and what ComfyUI saw.

Most of what a crash report needs is not in any log: the exact prompt that was running (to
replay it), the UI workflow, the node that failed as ComfyUI names it, ComfyUI's own view of
memory. Only the API has them, and only for a while: history lives in the server's memory and
dies with it (comfyui-facts.md 1.4, 11).

How the API is read, and why:

- **Execution messages go only to the client that posted** (facts 1.10, 11): a watchdog's
  websocket sees ``status`` broadcasts and nothing else. So the websocket (our own ``clientId``)
  is only a wake-up hint: every ``status`` (a prompt queued, started or finished) triggers a
  ``GET /queue`` at once. ``/queue`` is also polled every 250 ms while something is queued or
  running, and every 10 s when idle. Idle cost is one small request every 10 s and a parked
  socket. Without a websocket (down, or turned off) the idle poll runs every second and also
  reads the newest history entry, so a prompt too short to be seen in the queue is still found.
- **The running item carries the prompt**: ``queue_running`` items are ``[number, id, prompt,
  extra_data, outputs]`` with the UI workflow in ``extra_data.extra_pnginfo.workflow``
  (facts 1.3), so the prompt is captured the moment it is seen, pending or running.
- **The outcome comes from history**: when an item leaves the queue, ``GET /history/{id}``
  gives ``status_str`` and the ``execution_error`` payload (the same as the websocket's), which
  ``classify_execution_error`` reads. ComfyUI removes an item from the queue and writes its
  history under one lock, so an item gone from the queue with no history was deleted, or its
  server restarted.
- **Prompts too fast to be seen in the queue**: the websocket's ``status`` broadcasts count
  prompts in (``queue_remaining`` grew) and out (it shrank). When the queue is empty again and
  fewer new prompts were seen than came in, or fewer were reported than went out, history is
  swept for the missing ones: every entry that went out since the counts started (the missing
  ones can be anywhere among them), then further back page by page until they are found. Both counts matter: a broadcast can overtake
  a ``/queue`` answer that predates its prompt, and the sweep that this answer triggers finds
  the prompt not finished yet; the count of prompts out still misses it at the next empty
  queue. When everything that went out was reported, no history is read.
- **A restart never needs a daemon restart**: a dropped websocket (no close frame) or a failed
  request ends the session; ``/system_stats`` is retried with backoff (0.1 s doubling to 2 s)
  until it answers again. On every (re)connect history is read back, page by page, to the
  newest prompt already reported (on the first connect: to when a daemon last watched, the
  service's horizon), so the prompts that ran while nobody watched are not lost. The watcher may report a prompt twice (a
  reconnect to the same server); the service deduplicates by prompt id against the runs table.

One asyncio event loop in one thread serves every instance; it never touches the service's
state. It hands immutable messages (``ApiStatus``, ``PromptStarted``, ``ApiContext``,
``PromptDone``) to a callback -- the service's inbox -- and the service's main thread acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from oom_sentinel.daemon.classify import classify_execution_error
from oom_sentinel.daemon.classify.events import OomEvent
from oom_sentinel.daemon.comfy.api import ComfyClient, HistoryEntry, QueueItem
from oom_sentinel.daemon.core.errors import ComfyError
from oom_sentinel.daemon.incidents.tracker import Observation
from oom_sentinel.daemon.service.workers import Worker

__all__ = [
    "ApiContext",
    "ApiStatus",
    "ComfyWatcher",
    "Outcome",
    "PromptDone",
    "PromptStarted",
    "WatchMessage",
    "WatchOptions",
    "done_from_history",
    "logs_tail",
    "next_backoff_s",
]

log = logging.getLogger(__name__)

#: how often the API watcher's loop notes that it turns (its worker's last-alive time)
HEARTBEAT_S = 10.0

Outcome = Literal["success", "error", "interrupted", "lost"]


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """Intervals of the API watcher (defaults measured to keep idle cost near zero)."""

    #: /queue poll while a prompt is queued or running (the sampler's active interval too)
    active_poll_s: float = 0.25
    #: /queue safety poll when idle and the websocket is up (status broadcasts wake us)
    idle_poll_s: float = 10.0
    #: /queue poll when idle and the websocket is down (nothing wakes us)
    idle_poll_no_ws_s: float = 1.0
    #: reconnect backoff: first retry after min, doubling up to max
    reconnect_min_s: float = 0.1
    reconnect_max_s: float = 2.0
    #: per HTTP request
    request_timeout_s: float = 10.0
    #: newest history entries read first on every (re)connect (then 4x more, page by page,
    #: until an entry already reported, one that ended before ``backfill_since_s``, or the
    #: start of the server's history)
    backfill_items: int = 64
    #: the first connect reads history back to here: when a daemon last watched (the
    #: prompts that ran while none did); None: the first page only
    backfill_since_s: float | None = None
    #: lines of /internal/logs kept for a snapshot
    logs_tail_lines: int = 200
    #: prompt ids remembered as reported (bounded)
    remembered_ids: int = 4096
    #: open a websocket for status broadcasts (off: poll only -- e.g. behind a proxy that
    #: does not pass websockets; prompts shorter than ``idle_poll_no_ws_s`` are then found in
    #: history by checking its newest entry on every idle poll)
    websocket: bool = True


# ---- messages to the service -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiStatus:
    """The instance's API answered (``connected``) or stopped answering."""

    instance: str
    url: str
    connected: bool
    at_s: float
    #: raw ``/system_stats`` on connect
    system_stats: Mapping[str, Any] | None = None
    #: whether our websocket is open (status broadcasts arrive)
    websocket: bool = False
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PromptStarted:
    """A prompt was seen running (its API prompt and UI workflow captured)."""

    instance: str
    prompt_id: str
    number: float
    prompt: Mapping[str, Any]
    workflow: Mapping[str, Any] | None
    client_id: str | None
    #: when we saw it running (its own start time comes with ``PromptDone``)
    seen_s: float


@dataclass(frozen=True, slots=True)
class ApiContext:
    """ComfyUI's view while a prompt runs: ``/system_stats`` and the tail of
    ``/internal/logs``, kept by the service for a snapshot written after the server died."""

    instance: str
    at_s: float
    system_stats: Mapping[str, Any] | None
    internal_logs: str | None


@dataclass(frozen=True, slots=True)
class PromptDone:
    """A prompt left the queue: its outcome, times, error and, for an OOM, the observation."""

    instance: str
    prompt_id: str
    outcome: Outcome
    #: the API prompt and UI workflow (from history, else from the queue item)
    prompt: Mapping[str, Any] | None
    workflow: Mapping[str, Any] | None
    number: float | None
    #: ComfyUI's own times: ``execution_start`` and the terminal message (epoch seconds)
    started_s: float | None
    ended_s: float | None
    #: when we learnt the outcome
    seen_s: float
    #: the ``execution_error`` payload
    error: Mapping[str, Any] | None = None
    #: the classified error (None: not an OOM, or no error)
    event: OomEvent | None = None
    #: the API's observation for the incident tracker (an OOM only)
    observation: Observation | None = None
    #: captured for the snapshot when the prompt ran out of memory
    system_stats: Mapping[str, Any] | None = None
    internal_logs: str | None = None
    #: nodes served from cache, and how many the prompt has
    cached_nodes: tuple[str, ...] = ()
    node_count: int | None = None
    #: found in history on (re)connect rather than watched as it ran
    backfill: bool = False
    detail: str | None = None


WatchMessage = ApiStatus | PromptStarted | ApiContext | PromptDone


# ---- pure helpers -------------------------------------------------------------------------------


def next_backoff_s(current_s: float, options: WatchOptions) -> float:
    """The next reconnect delay: double, clamped to ``[reconnect_min_s, reconnect_max_s]``."""
    return max(options.reconnect_min_s, min(options.reconnect_max_s, current_s * 2))


def logs_tail(text: str | None, lines: int) -> str | None:
    """The last ``lines`` lines of ``/internal/logs`` (``<ISO time> - <text>`` pieces)."""
    if text is None:
        return None
    parts = text.splitlines(keepends=True)
    return "".join(parts[-lines:]) if lines > 0 else ""


#: ComfyUI keeps at most this many history entries (comfyui-facts 1.4): no sweep reads more
MAXIMUM_HISTORY_SIZE = 10_000
#: a counting sweep also stops at entries that ended this long before its counters started
#: (the server's clock may differ a little from ours)
SWEEP_CLOCK_SLACK_S = 60.0


def _ms_to_s(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) / 1000.0


def _terminal(entry: HistoryEntry) -> tuple[Outcome, Mapping[str, Any] | None]:
    for name in ("execution_error", "execution_interrupted", "execution_success"):
        payload = entry.message(name)
        if payload is not None:
            outcome: Outcome = {
                "execution_error": "error",
                "execution_interrupted": "interrupted",
                "execution_success": "success",
            }[name]  # type: ignore[assignment]
            return outcome, payload
    if entry.succeeded:
        return "success", None
    return ("interrupted" if entry.interrupted else "error"), None


def ended_s(entry: HistoryEntry) -> float | None:
    """When a history entry's prompt ended (its terminal message's timestamp), if known."""
    _, terminal = _terminal(entry)
    return _ms_to_s(terminal.get("timestamp")) if terminal else None


def done_from_history(
    instance: str,
    entry: HistoryEntry,
    *,
    seen_s: float,
    fallback: QueueItem | None = None,
    backfill: bool = False,
) -> PromptDone:
    """What a history entry says about its prompt (pure). An OOM error carries an
    ``Observation`` of source ``api`` whose evidence names the prompt and the node."""
    outcome, terminal = _terminal(entry)
    item = entry.item or fallback
    start = entry.message("execution_start")
    started_s = _ms_to_s(start.get("timestamp")) if start else None
    ended_s = _ms_to_s(terminal.get("timestamp")) if terminal else None
    error = entry.execution_error
    event = classify_execution_error(error) if error is not None else None
    observation = None
    if event is not None and error is not None:
        evidence: dict[str, Any] = {"prompt_id": entry.prompt_id}
        for key in ("node_id", "node_type", "exception_type"):
            value = error.get(key)
            if isinstance(value, str):
                evidence[key] = value
        if item is not None:
            evidence["number"] = item.number
        observation = Observation(
            instance=instance,
            source="api",
            event=event,
            at_s=ended_s if ended_s is not None else seen_s,
            evidence=evidence,
        )
    prompt = item.prompt if item is not None else None
    return PromptDone(
        instance=instance,
        prompt_id=entry.prompt_id,
        outcome=outcome,
        prompt=prompt,
        workflow=item.workflow if item is not None else None,
        number=item.number if item is not None else None,
        started_s=started_s,
        ended_s=ended_s,
        seen_s=seen_s,
        error=error,
        event=event,
        observation=observation,
        cached_nodes=entry.cached_nodes,
        node_count=len(prompt) if isinstance(prompt, Mapping) else None,
        backfill=backfill,
    )


# ---- one instance -------------------------------------------------------------------------------


@dataclass
class _Tracked:
    item: QueueItem
    first_seen_s: float
    running: bool = False


@dataclass
class _Remembered:
    """Prompt ids already reported (bounded, oldest forgotten first)."""

    limit: int
    ids: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def add(self, prompt_id: str) -> None:
        self.ids[prompt_id] = None
        self.ids.move_to_end(prompt_id)
        while len(self.ids) > self.limit:
            self.ids.popitem(last=False)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self.ids


class _SessionLost(Exception):
    """The server stopped answering during a session."""


class _InstanceWatch:
    """The API of one ComfyUI: connect, follow its queue, report, reconnect."""

    def __init__(
        self,
        name: str,
        url: str,
        emit: Callable[[WatchMessage], None],
        options: WatchOptions,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.emit = emit
        self.options = options
        self.clock = clock
        self.client_id = f"oom-sentinel-{uuid.uuid4().hex[:12]}"
        self.connected = False
        self.ws_up = False
        self.tracked: dict[str, _Tracked] = {}
        self.reported = _Remembered(options.remembered_ids)
        self.kick = asyncio.Event()
        self.ws_dropped = False
        #: the websocket came back after a drop: the broadcasts in between are lost
        self.ws_reopened = False
        #: status broadcasts whose queue_remaining grew (prompts queued) vs new ids seen
        self.announced = 0
        self.seen_new = 0
        #: status broadcasts whose queue_remaining shrank (prompts out) vs prompts reported
        self.finished = 0
        self.reported_new = 0
        #: queue_remaining of the last broadcast (None: count from the next one)
        self._last_remaining: int | None = None
        #: when the counters above last started from zero (a sweep reads back to here)
        self._counting_since_s = clock()
        #: the first session reads history back to ``backfill_since_s``; later ones (the
        #: same daemon, a reconnect) back to the first prompt already reported
        self._first_session = True

    # -- the outer loop: connect, run a session, reconnect ------------------------------------
    async def run(self) -> None:
        client = ComfyClient(
            self.url, client_id=self.client_id, timeout_s=self.options.request_timeout_s
        )
        backoff = self.options.reconnect_min_s
        try:
            while True:
                try:
                    stats = await client.system_stats(timeout_s=self.options.request_timeout_s)
                except ComfyError as exc:
                    self._set_disconnected(str(exc))
                    await asyncio.sleep(backoff)
                    backoff = next_backoff_s(backoff, self.options)
                    continue
                backoff = self.options.reconnect_min_s
                await self._session(client, stats.raw)
        finally:
            await client.close()

    def _set_disconnected(self, reason: str) -> None:
        if not self.connected:
            return
        self.connected = False
        self.emit(ApiStatus(self.name, self.url, False, self.clock(), reason=reason))
        log.info("ComfyUI %r API at %s went away: %s", self.name, self.url, reason)

    async def _session(self, client: ComfyClient, stats: Mapping[str, Any]) -> None:
        self.connected = True
        self.ws_dropped = False
        self.ws_reopened = False
        self._last_remaining = None
        self._reset_counts()
        ws_task = asyncio.create_task(
            self._ws_loop(client) if self.options.websocket else asyncio.sleep(0),
            name=f"ws-{self.name}",
        )
        if self.options.websocket:
            # give the websocket a moment so the first status counts from the start
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), 0.5)
        self.emit(
            ApiStatus(
                self.name,
                self.url,
                True,
                self.clock(),
                system_stats=stats,
                websocket=self.ws_up,
            )
        )
        log.info("ComfyUI %r API at %s is up", self.name, self.url)
        reason = "the server stopped answering"
        try:
            with contextlib.suppress(ComfyError):
                await self._backfill(client)  # a failure shows at the next poll
            safety = False
            while True:
                self.kick.clear()
                if self.ws_dropped:
                    self.ws_dropped = False
                    if not await client.is_up():
                        reason = "the websocket dropped and the server no longer answers"
                        break
                try:
                    if self.ws_reopened:
                        # the broadcasts sent while the socket was down are lost: a prompt
                        # queued and done then was counted by nothing; history has it
                        await self._sweep(client, 8, backfill=False)
                        self.ws_reopened = False  # (after the sweep: a failed one is retried)
                    await self._poll(client, safety=safety)
                except (ComfyError, _SessionLost) as exc:
                    if not await client.is_up():
                        reason = str(exc)
                        break
                    continue
                safety = not await self._wait(self._interval())
        finally:
            ws_task.cancel()
            self.ws_up = False
            # gather, not suppress(CancelledError): a stop that cancels this session while it
            # waits here must end it, not let _guard start the session again
            await asyncio.gather(ws_task, return_exceptions=True)
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                self._lose_tracked()  # the server went away (not: the daemon is stopping)
                self._set_disconnected(reason)

    def _reset_counts(self) -> None:
        self.announced = self.seen_new = self.finished = self.reported_new = 0
        self._counting_since_s = self.clock()

    def _interval(self) -> float:
        if self.tracked or (self._last_remaining or 0) > 0:
            return self.options.active_poll_s
        return self.options.idle_poll_s if self.ws_up else self.options.idle_poll_no_ws_s

    async def _wait(self, timeout_s: float) -> bool:
        """Wait for a kick or ``timeout_s``; True when kicked."""
        try:
            await asyncio.wait_for(self.kick.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- the websocket: status broadcasts are the wake-up hint --------------------------------
    async def _ws_loop(self, client: ComfyClient) -> None:
        backoff = self.options.reconnect_min_s
        opened = False
        while True:
            try:
                ws = await client.open_websocket(self.client_id)
            except ComfyError:
                self.ws_up = False
                self.ws_dropped = True
                self.kick.set()
                await asyncio.sleep(backoff)
                backoff = next_backoff_s(backoff, self.options)
                continue
            backoff = self.options.reconnect_min_s
            if opened:
                self.ws_reopened = True  # the session sweeps history for the gap
            opened = True
            self.ws_up = True
            self._last_remaining = None  # ComfyUI greets a new socket with the current status
            try:
                while True:
                    msg = await ws.receive()
                    if msg is None:
                        break
                    if msg.type == "status":
                        self._on_status(msg.data)
                        self.kick.set()
                    elif msg.type == "execution_interrupted":
                        self.kick.set()
            finally:
                await ws.close()
                self.ws_up = False
            self.ws_dropped = True
            self.kick.set()
            await asyncio.sleep(self.options.reconnect_min_s)

    def _on_status(self, data: Mapping[str, Any]) -> None:
        status = data.get("status")
        info = status.get("exec_info") if isinstance(status, Mapping) else None
        remaining = info.get("queue_remaining") if isinstance(info, Mapping) else None
        if not isinstance(remaining, int) or isinstance(remaining, bool):
            return
        if self._last_remaining is not None:
            if remaining > self._last_remaining:
                self.announced += remaining - self._last_remaining
            else:
                self.finished += self._last_remaining - remaining
        self._last_remaining = remaining

    # -- polling ------------------------------------------------------------------------------
    async def _poll(self, client: ComfyClient, *, safety: bool = False) -> None:
        """One look at the queue. ``safety``: the idle timer fired (no broadcast woke us):
        the newest history entry is also checked, for a prompt whose broadcasts were lost."""
        state = await client.queue()
        now = self.clock()
        present: set[str] = set()
        started: list[_Tracked] = []
        for running, items in ((True, state.running), (False, state.pending)):
            for item in items:
                present.add(item.prompt_id)
                tracked = self.tracked.get(item.prompt_id)
                if tracked is None:
                    if item.prompt_id in self.reported:
                        continue
                    tracked = _Tracked(item, now)
                    self.tracked[item.prompt_id] = tracked
                    self.seen_new += 1
                if running and not tracked.running:
                    tracked.running = True
                    started.append(tracked)
        for tracked in started:
            item = tracked.item
            self.emit(
                PromptStarted(
                    self.name,
                    item.prompt_id,
                    item.number,
                    item.prompt,
                    item.workflow,
                    item.client_id,
                    now,
                )
            )
        for prompt_id in [p for p in self.tracked if p not in present]:
            await self._finish(client, self.tracked[prompt_id])
            del self.tracked[prompt_id]
        if started:
            await self._context(client)
        if state.remaining == 0 and not self.tracked:
            if not self.ws_up:
                self._last_remaining = 0  # no broadcasts to keep it true: the poll is all we have
            missing = max(self.announced - self.seen_new, self.finished - self.reported_new)
            # the missing prompts are anywhere among all that went out since the counters
            # started, not only the newest: read them all, then further back if need be
            span = max(self.announced, self.finished)
            since = self._counting_since_s - SWEEP_CLOCK_SLACK_S
            self._reset_counts()
            if missing > 0:
                await self._sweep(client, span + 2, backfill=False, want=missing, since_s=since)
            elif (not self.ws_up or safety) and await self._newest_is_new(client):
                # no status broadcasts to count prompts by (or, on the idle safety poll,
                # some were lost): back to the newest one reported
                await self._sweep(client, 8, backfill=False)

    async def _newest_is_new(self, client: ComfyClient) -> bool:
        newest = await client.history(max_items=1)
        return any(pid not in self.reported for pid in newest)

    async def _finish(self, client: ComfyClient, tracked: _Tracked) -> None:
        prompt_id = tracked.item.prompt_id
        entry = await client.history_entry(prompt_id)
        if entry is None:
            if tracked.running:
                self._report(self._lost(tracked, "gone from the queue with no history entry"))
            return
        await self._report_entry(client, entry, fallback=tracked.item, backfill=False)

    def _lost(self, tracked: _Tracked, detail: str) -> PromptDone:
        item = tracked.item
        return PromptDone(
            instance=self.name,
            prompt_id=item.prompt_id,
            outcome="lost",
            prompt=item.prompt,
            workflow=item.workflow,
            number=item.number,
            started_s=None,
            ended_s=None,
            seen_s=self.clock(),
            node_count=len(item.prompt),
            detail=detail,
        )

    def _lose_tracked(self) -> None:
        """The server went away: prompts seen running end as lost (history died with it)."""
        for tracked in self.tracked.values():
            if tracked.running:
                self._report(self._lost(tracked, "the server went away while it ran"))
        self.tracked.clear()

    async def _report_entry(
        self,
        client: ComfyClient,
        entry: HistoryEntry,
        *,
        fallback: QueueItem | None,
        backfill: bool,
    ) -> None:
        if entry.prompt_id in self.reported:
            return
        done = done_from_history(
            self.name, entry, seen_s=self.clock(), fallback=fallback, backfill=backfill
        )
        if done.event is not None:
            stats, logs = await self._stats_and_logs(client)
            done = _with_context(done, stats, logs)
        self._report(done)

    def _report(self, done: PromptDone) -> None:
        self.reported.add(done.prompt_id)
        if not done.backfill:  # a backfilled prompt went out before we counted
            self.reported_new += 1
        self.emit(done)

    async def _backfill(self, client: ComfyClient) -> None:
        since = None  # a reconnect: back to the newest prompt already reported
        if self._first_session:
            # the first: back to when a daemon last watched; on a first start ever, the
            # newest page only (older prompts are recorded, never alarmed on)
            first = self.options.backfill_since_s
            since = first if first is not None else self.clock()
        self._first_session = False
        await self._sweep(client, self.options.backfill_items, backfill=True, since_s=since)

    async def _sweep(
        self,
        client: ComfyClient,
        max_items: int,
        *,
        backfill: bool,
        want: int | None = None,
        since_s: float | None = None,
    ) -> None:
        """Report the finished history entries not reported yet, newest ``max_items`` first,
        then 4x as many, page by page, until: ``want`` new ones were found (a counting sweep),
        or (without ``want``) the page holds a prompt reported before this sweep; or it holds
        one that ended before ``since_s``; or the server's history has no more."""
        size = max(1, max_items)
        mine: set[str] = set()
        while True:
            entries = await client.history(max_items=size)
            known = older = False
            for entry in entries.values():
                if entry.prompt_id in self.reported and entry.prompt_id not in mine:
                    known = True
                end = ended_s(entry)
                if since_s is not None and end is not None and end < since_s:
                    older = True
                if entry.prompt_id in self.tracked or entry.prompt_id in self.reported:
                    continue
                if entry.status_str is None and not entry.messages:
                    continue  # not finished (an old ComfyUI writes history without status)
                await self._report_entry(client, entry, fallback=None, backfill=backfill)
                mine.add(entry.prompt_id)
            if len(entries) < size or size >= MAXIMUM_HISTORY_SIZE or older:
                return
            if (len(mine) >= want) if want is not None else known:
                return
            size = min(size * 4, MAXIMUM_HISTORY_SIZE)

    async def _stats_and_logs(
        self, client: ComfyClient
    ) -> tuple[Mapping[str, Any] | None, str | None]:
        stats_r, logs_r = await asyncio.gather(
            client.system_stats(), client.internal_logs(), return_exceptions=True
        )
        stats = stats_r.raw if not isinstance(stats_r, BaseException) else None
        text = logs_r if isinstance(logs_r, str) else None
        return stats, logs_tail(text, self.options.logs_tail_lines)

    async def _context(self, client: ComfyClient) -> None:
        stats, logs = await self._stats_and_logs(client)
        if stats is not None or logs is not None:
            self.emit(ApiContext(self.name, self.clock(), stats, logs))


def _with_context(
    done: PromptDone, stats: Mapping[str, Any] | None, logs: str | None
) -> PromptDone:
    return replace(done, system_stats=stats, internal_logs=logs)


# ---- the watcher: one loop, one thread, every instance ------------------------------------------


class ComfyWatcher:
    """Runs one ``_InstanceWatch`` per instance on an asyncio loop in its own thread.

    ``set_instances({name: url})`` (any thread) adds, re-points and drops instances;
    ``emit`` is called on the watcher's thread with each ``WatchMessage`` and must only hand it
    over (the service puts it in its inbox and wakes its loop).
    """

    def __init__(
        self,
        emit: Callable[[WatchMessage], None],
        options: WatchOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.emit = emit
        self.options = options or WatchOptions()
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the watcher's thread, running the asyncio loop (service.workers)
        self.worker = Worker("api", self._main, thread_name="comfy-watch")
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._watches: dict[str, _InstanceWatch] = {}
        self._ready = threading.Event()

    def start(self) -> None:
        if not self.worker.start():
            return
        self._ready.wait(10.0)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._heartbeat)
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _heartbeat(self) -> None:
        """The loop turns: the worker's last-alive time (a timer every HEARTBEAT_S)."""
        self.worker.beat()
        if self._loop is not None:
            self._loop.call_later(HEARTBEAT_S, self._heartbeat)

    def set_instances(self, urls: Mapping[str, str]) -> None:
        """Watch exactly these instances (name → API URL)."""
        if self._loop is None:
            raise RuntimeError("ComfyWatcher.start() first")
        wanted = {name: url.rstrip("/") for name, url in urls.items() if url}
        self._loop.call_soon_threadsafe(self._apply, wanted)

    def _apply(self, wanted: Mapping[str, str]) -> None:
        for name in list(self._tasks):
            url, task = self._tasks[name]
            if wanted.get(name) != url:
                task.cancel()
                del self._tasks[name]
                self._watches.pop(name, None)
        assert self._loop is not None
        for name, url in wanted.items():
            if name in self._tasks:
                continue
            watch = _InstanceWatch(name, url, self._emit, self.options, self.clock)
            task = self._loop.create_task(self._guard(watch), name=f"watch-{name}")
            self._tasks[name] = (url, task)
            self._watches[name] = watch

    async def _guard(self, watch: _InstanceWatch) -> None:
        """Restart a watch that failed on something unexpected, instead of going blind."""
        while True:
            try:
                await watch.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the API watcher of %r failed; restarting it", watch.name)
                await asyncio.sleep(self.options.reconnect_max_s)

    def _emit(self, message: WatchMessage) -> None:
        try:
            self.emit(message)
        except Exception:
            log.exception("could not hand over %s", type(message).__name__)

    def is_alive(self) -> bool:
        """Whether the watcher's thread and its event loop run (a worker the watchdog checks)."""
        loop = self._loop
        return self.worker.is_alive() and loop is not None and loop.is_running()

    def connected(self) -> dict[str, bool]:
        """Which instances' APIs answer now (for status; read from any thread)."""
        return {name: w.connected for name, w in list(self._watches.items())}

    def watched(self) -> Iterable[str]:
        return tuple(self._watches)

    def stop(self, timeout_s: float = 5.0) -> None:
        loop = self._loop
        if loop is None or not self.worker.started:
            return
        self.worker.request_stop()

        async def shutdown() -> None:
            tasks = [task for _, task in self._tasks.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.clear()
            loop.stop()

        if self.worker.is_alive() and not loop.is_closed():  # a dead watcher has no loop left
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self.worker.join(timeout_s)
        self._loop = None

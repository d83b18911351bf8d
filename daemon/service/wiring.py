"""The watchdog's wiring and its main loop: what ``oom-sentinel run`` is.

Data flows one way (DESIGN §3): sources → events → incidents → snapshot → store/alerts. The
loop reads like earlyoom's ``poll_loop``: read what the sources have, decide (classifier,
incident tracker), act (write snapshots, save rows, commit log offsets), then sleep until a
file event, a source's message, the tracker's next deadline or the safety poll.

Threads, and why each exists:

- the **main thread** runs the loop and is the only one that touches the log followers, the
  record assemblers, the tracker and the snapshot writer -- one writer, no locks in the core;
- an **APScheduler** ``BackgroundScheduler`` runs the periodic jobs: the memory sampler
  (1 s, 250 ms while a prompt runs), discovery of installs that appear later, retention. Jobs
  hand results to the loop through a queue and wake it;
- the **watchdog observer** (inside ``LogTailManager``) only sets a wake-up flag;
- the **API watcher** (``comfy_watch``: one asyncio loop for every instance) follows each
  ComfyUI's queue and history and hands ``PromptStarted``/``PromptDone``/``ApiStatus`` records
  to the loop through the same inbox;
- the **process watcher** (``process_watch``) sleeps on pidfds until a ComfyUI process ends,
  gathers the kernel's kill evidence and hands a ``ProcessExit`` to the inbox.

Only the main thread touches the tracker, the store and the snapshot writer. A prompt that runs
out of memory is reported by the API (node, prompt, workflow), often by the log too (numbers),
and merged by the tracker; the snapshot carries ``prompt.json``/``workflow.json`` and the
``process``, ``kernel``, ``system_stats`` and ``internal_logs`` sections. Every prompt becomes a
``runs`` row (``runs.py``); an OOM's row is written only after its snapshot, so a crash in
between re-reads the prompt from ComfyUI's history instead of losing it.

Exactly-once across ``kill -9``: a log record's offset is committed only after the incident it
belongs to counted it durably -- its snapshot on disk and its row saved together with the ids of
the records it counted (``incident_records``), storm repeats included. A re-read record whose
id is stored is skipped; every snapshot also lists the records it counted, so one whose row was
lost (killed between the two writes) gets its row and records back at start-up; an incident
whose storm was not closed is resumed from the store, so a storm that spans a restart stays one
snapshot. Positions are committed while a backlog is worked through (every
``BACKLOG_BATCH_RECORDS`` records or ``BACKLOG_BATCH_S``), and a snapshot that could not be
written (full disk) is retried every ``SNAPSHOT_RETRY_S`` while its records keep their hold.
So a crash anywhere costs at most a re-read, never a duplicate or a loss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psutil
from apscheduler.schedulers.background import BackgroundScheduler

from oom_sentinel.config.settings import LoadedSettings, Settings, load_settings
from oom_sentinel.daemon.advice import AdviceContext, ComfyInstance, GpuProcess, advise
from oom_sentinel.daemon.alert_dispatch import AlertDispatcher
from oom_sentinel.daemon.atomic import write_json_atomic
from oom_sentinel.daemon.classify import classify_record
from oom_sentinel.daemon.comfy_watch import (
    ApiContext,
    ApiStatus,
    ComfyWatcher,
    PromptDone,
    PromptStarted,
    WatchOptions,
)
from oom_sentinel.daemon.discovery import DiscoveredInstance, describe_install, discover_instances
from oom_sentinel.daemon.errors import ConfigError, SentinelError, StoreError
from oom_sentinel.daemon.events import Pool
from oom_sentinel.daemon.gpu_select import select_gpu_probe
from oom_sentinel.daemon.heap import release_free_heap
from oom_sentinel.daemon.host_probe import PsutilHostProbe
from oom_sentinel.daemon.incidents import (
    CloseIncident,
    CountSoftOom,
    FoldedRecord,
    Incident,
    IncidentTracker,
    Observation,
    TrackerConfig,
    UpdateIncident,
    WriteSnapshot,
)
from oom_sentinel.daemon.kernel_oom import SystemRoots
from oom_sentinel.daemon.logtail import LogLine, LogTailManager
from oom_sentinel.daemon.notifiers import build_channels
from oom_sentinel.daemon.probes import MemorySample
from oom_sentinel.daemon.process_watch import (
    ProcessExit,
    ProcessWatcher,
    kernel_section,
    kill_observation,
    process_section,
)
from oom_sentinel.daemon.processes import (
    ComfyProcess,
    find_comfy_processes,
    process_exists,
    process_for,
)
from oom_sentinel.daemon.records import Record, RecordAssembler
from oom_sentinel.daemon.redact import redact, redact_text
from oom_sentinel.daemon.retention import prune_snapshots
from oom_sentinel.daemon.runs import RunRecord, has_run, record_run, run_from_done
from oom_sentinel.daemon.sdnotify import Notifier, watchdog_interval_s
from oom_sentinel.daemon.snapshot import (
    HostFacts,
    InstanceInfo,
    Snapshot,
    SnapshotContent,
    SnapshotRef,
    clean_leftovers,
    collect_host_facts,
    iso_utc,
    list_snapshots,
    parse_iso_utc,
    snapshot_records,
    snapshots_dir,
    write_snapshot,
)
from oom_sentinel.daemon.state_history import InstallStateTracker
from oom_sentinel.daemon.store import IncidentRow, Store
from oom_sentinel.daemon.timeline import Sampler, Timeline, to_csv

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.metrics import MetricsExporter

__all__ = ["RunOptions", "Service", "WatchedInstance", "run_service"]

log = logging.getLogger("oom_sentinel")

#: After the last line of a file, a pending record is closed this soon when nothing follows:
#: ComfyUI writes a traceback in one write, so 50 ms of quiet means the record is whole.
RECORD_IDLE_S = 0.05
#: How many recent snapshots are read at start-up to learn which log records are handled.
RECOVERY_SNAPSHOTS = 200
#: Lines after the OOM record kept for log.txt (ComfyUI's "Memory summary" and "Got an OOM"
#: follow the traceback).
AFTER_LINES = 60
#: log.txt is bounded in bytes as well as lines: a line is kept up to this many characters
#: (a 50 MB line must not make every later snapshot 63 MB), the whole text up to LOG_TEXT_BYTES
CONTEXT_LINE_CHARS = 4096
LOG_TEXT_BYTES = 256 * 1024
#: How often ``status.json`` (read by ``oom-sentinel status``) is refreshed.
STATUS_INTERVAL_S = 5.0
STATUS_FILE = "status.json"  # cli_run.STATUS_FILE reads it
#: A prompt whose server went away waits this long for the process watcher to say whether the
#: OS killed it (evidence collection may run journalctl, which has a 5 s timeout).
LOST_RUN_GRACE_S = 15.0
#: Prompts (API prompt, workflow, error context) kept for snapshots written after the fact.
CAPTURED_PROMPTS = 64
#: Prompt ids remembered as handled without asking the store again.
RECENT_PROMPT_IDS = 4096
#: Log record ids remembered as read (soft OOMs included) without asking the store again.
RECENT_RECORD_IDS = 20_000
#: store meta key: the last time this daemon was alive, so a prompt that failed while it was
#: down (found in history at the next connect) still becomes an incident
META_LAST_ALIVE = "last_alive_s"
#: glibc heap trims: the first once start-up work is done, then periodically
HEAP_TRIM_FIRST_S = 15.0
HEAP_TRIM_INTERVAL_S = 600.0
#: while a backlog is read, incidents are acted on and read positions saved at least this often
#: (in records and in seconds), so a restart in the middle repeats little work
BACKLOG_BATCH_RECORDS = 16
BACKLOG_BATCH_S = 0.25
#: a snapshot that could not be written (disk full, permissions) is tried again this often
SNAPSHOT_RETRY_S = 2.0
#: read the kernel log from this file instead of /dev/kmsg (a ``kmsg``-format capture: what a
#: container without /dev/kmsg can be given, and how the suite shows the daemon a kernel kill)
KMSG_ENV = "OOM_SENTINEL_KMSG"


@dataclass(frozen=True)
class RunOptions:
    """Command-line additions to the settings, for a one-off run without a config file."""

    data_dir: str | None = None
    watch_logs: tuple[str, ...] = ()
    #: ComfyUI instances named by URL (``http://host:port``) or install PATH
    comfyui: tuple[str, ...] = ()


@dataclass
class WatchedInstance:
    """One ComfyUI the daemon watches; refreshed by discovery (pid and flags change)."""

    name: str
    path: str | None
    url: str | None
    log_paths: tuple[str, ...]
    pid: int | None = None
    python: str | None = None
    source: str = "config"
    process: ComfyProcess | None = None
    #: the user gave the URL (or port): discovery must not change it
    url_fixed: bool = False

    def info(self) -> InstanceInfo:
        return InstanceInfo(name=self.name, path=self.path, url=self.url)


@dataclass
class _LogKeyState:
    """Per followed log: its record assembler, recent lines and where it was read up to."""

    instance: str
    assembler: RecordAssembler = field(default_factory=RecordAssembler)
    #: (path, start_offset, text) of recent lines, for log.txt
    recent: deque[tuple[str, int, str]] = field(default_factory=lambda: deque(maxlen=400))
    path: str | None = None
    end_offset: int = 0
    last_line_at: float = 0.0


@dataclass(frozen=True)
class _Held:
    key: str
    path: str
    start_offset: int
    #: emission order: the oldest hold of a key is where its read position must stay
    seq: int


@dataclass
class _Unwritten:
    """An incident whose snapshot or row could not be written yet, with the records it
    counted meanwhile (they keep their hold on the log position until it is)."""

    incident: Incident
    records: list[FoldedRecord]
    retry_at_s: float
    #: the snapshot is on disk (its id, or "" when the row already has it): only the row and
    #: the records are missing -- a full disk fails SQLite's writes too
    snapshot_id: str | None = None


@dataclass
class _Captured:
    """What the API gave for one prompt, kept for its snapshot."""

    instance: str
    prompt: Mapping[str, Any] | None
    workflow: Mapping[str, Any] | None
    seen_s: float
    done: PromptDone | None = None


@dataclass(frozen=True)
class _LostRun:
    """A prompt whose server went away, waiting for the process watcher's verdict."""

    run: RunRecord
    since_s: float


@dataclass(frozen=True)
class _PendingRun:
    """An OOM run, written once its incident counted its API record (snapshot on disk)."""

    run: RunRecord
    #: the API observation's record id (``_api_record_id``)
    record_id: str


def _record_id(key: str, record: Record) -> str:
    digest = hashlib.sha1(record.text.encode("utf-8", "replace")).hexdigest()[:16]
    return f"{key}|{record.start_offset}|{digest}"


def _api_record_id(instance: str, prompt_id: str) -> str:
    """The record id of a prompt's API error: one prompt fails once."""
    return f"api|{instance}|{prompt_id}"


def _record_time(record: Record, fallback: float) -> float:
    """The record's own time (Manager/Desktop prefix, local time) where it has one."""
    stamp = record.timestamp
    if not stamp:
        return fallback
    text = stamp.strip("[] ").replace("T", " ")
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    return fallback


def _row_from_snapshot(data: Mapping[str, Any], snapshot_id: str) -> IncidentRow | None:
    """The store row of a snapshot whose row was lost (the daemon died between the two)."""
    try:
        inc = data["incident"]
        event = data.get("event") or {}
        first = parse_iso_utc(str(inc["first_seen"])) or 0.0
        last = parse_iso_utc(str(inc["last_seen"])) or first
        return IncidentRow(
            id=str(inc["id"]),
            snapshot_id=snapshot_id,
            instance=str((data.get("instance") or {}).get("name") or ""),
            pool=str(event.get("pool") or "gpu"),
            backend=str(event.get("backend") or "unknown"),
            node_type=event.get("node_type"),
            exception_type=event.get("exception_type"),
            first_seen_s=first,
            last_seen_s=last,
            count=int(inc.get("count") or 1),
            sources=tuple(str(s) for s in data.get("sources") or ()),
            summary=str(data.get("summary") or ""),
            fingerprint=str(inc.get("fingerprint") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _clip_line(text: str) -> str:
    """A log line as kept for context: at most CONTEXT_LINE_CHARS characters."""
    if len(text) <= CONTEXT_LINE_CHARS:
        return text
    return f"{text[:CONTEXT_LINE_CHARS]} [... {len(text) - CONTEXT_LINE_CHARS} characters cut]"


def _bounded_context(header: str, before: Sequence[str], after: Sequence[str]) -> str:
    """log.txt's text within LOG_TEXT_BYTES: the record and what follows it first, then as
    many of the lines before it as fit (the oldest go first)."""
    budget = LOG_TEXT_BYTES - len(header.encode("utf-8", "replace")) - 1
    kept_after: list[str] = []
    for line in after:
        cost = len(line.encode("utf-8", "replace")) + 1
        if cost > budget:
            break
        kept_after.append(line)
        budget -= cost
    kept_before: list[str] = []
    for line in reversed(before):
        cost = len(line.encode("utf-8", "replace")) + 1
        if cost > budget:
            break
        kept_before.append(line)
        budget -= cost
    kept_before.reverse()
    return "\n".join([header, *kept_before, *kept_after])


def advice_context(sections: Mapping[str, Any], memory: Any) -> AdviceContext:
    """What advice can use beyond the message: other GPU users, second instances, flags."""
    process = sections.get("process") or {}
    others = tuple(
        GpuProcess(pid=p["pid"], name=p.get("name"), bytes=p.get("used_bytes"))
        for p in process.get("other_gpu_processes") or ()
        if not p.get("comfyui")
    )
    instances = tuple(
        ComfyInstance(pid=p["pid"], port=p.get("port"), bytes=p.get("gpu_used_bytes"))
        for p in process.get("other_instances") or ()
        if p.get("shares_gpu")  # the one rule (processes.shares_gpu) doctor uses too
    )
    flags = process.get("flags") or {}
    total_vram = None
    total_ram = None
    if memory is not None:
        totals = [g.total_bytes for g in memory.gpus if g.total_bytes is not None]
        total_vram = max(totals) if totals else None
        total_ram = memory.host.ram_total_bytes if memory.host is not None else None
    stats: Mapping[str, Any] = sections.get("system_stats") or {}
    raw_system = stats.get("system")
    system: Mapping[str, Any] = raw_system if isinstance(raw_system, Mapping) else {}
    return AdviceContext(
        other_gpu_processes=others,
        other_instances=instances,
        launch_flags=tuple(flags.get("memory_args") or ()),
        total_vram_bytes=total_vram,
        total_ram_bytes=total_ram,
        platform=system.get("os") if isinstance(system.get("os"), str) else sys.platform,
        alloc_conf=process.get("pytorch_cuda_alloc_conf"),
    )


def _instance_name_for_url(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


class Service:
    """The daemon: build with settings, ``start()``, ``run(stop)``, ``close()``."""

    def __init__(
        self,
        loaded: LoadedSettings,
        options: RunOptions | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        on_incident: Callable[[Incident, SnapshotRef], None] | None = None,
    ) -> None:
        self.loaded = loaded
        self.settings: Settings = loaded.settings
        self.options = options or RunOptions()
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.on_incident = on_incident
        data_dir = self.options.data_dir or self.settings.resolved_data_dir()
        self.data_dir = Path(data_dir).expanduser()
        self.snapshots_dir = snapshots_dir(self.data_dir)
        self.instances: dict[str, WatchedInstance] = {}
        self._keys: dict[str, _LogKeyState] = {}
        self._holds: dict[str, _Held] = {}
        self._hold_seq = 0
        #: incidents whose snapshot write failed, retried while running (by incident id)
        self._unwritten: dict[str, _Unwritten] = {}
        #: record ids seen lately (recent snapshots' at start-up, then every record read);
        #: bounded -- the store's incident_records is the durable answer
        self._handled_records: OrderedDict[str, None] = OrderedDict()
        #: log lines before each OOM record, until its snapshot is written
        self._contexts: dict[str, tuple[str, ...]] = {}
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._explicit = bool(self.settings.instances or self.options.comfyui)
        self.notifier = Notifier(self.environ)
        self._watchdog_s = watchdog_interval_s(self.environ)
        self._last_ping = 0.0
        #: workers seen dead (each is logged once, by name)
        self._dead_workers: set[str] = set()
        self._host_facts: HostFacts | None = None
        self.store: Store | None = None
        self.tails: LogTailManager | None = None
        self.scheduler: BackgroundScheduler | None = None
        self.sampler: Sampler | None = None
        self.timeline: Timeline | None = None
        self.tracker = IncidentTracker(TrackerConfig.from_settings(self.settings.incidents))
        self.gpu_line = ""
        self.alerts: AlertDispatcher | None = None
        self.metrics: MetricsExporter | None = None
        self._reload_requested = threading.Event()
        self.incidents_written = 0
        self.last_incident: str | None = None
        self.started_s = clock()
        self._last_status = 0.0
        # -- the API and process watchers, and what they told us ------------------------------
        self.comfy_watch: ComfyWatcher | None = None
        self.process_watch: ProcessWatcher | None = None
        self._api_up: dict[str, bool] = {}
        #: instance -> (prompt_id, seen running at)
        self._running: dict[str, tuple[str, float]] = {}
        #: prompt_id -> what the API gave for it (prompt, workflow, error context)
        self._captured: OrderedDict[str, _Captured] = OrderedDict()
        #: instance -> the latest /system_stats and /internal/logs tail
        self._api_context: dict[str, ApiContext] = {}
        #: pid -> how it ended (the snapshot's process and kernel sections)
        self._exits: OrderedDict[int, ProcessExit] = OrderedDict()
        #: (pid, create time) of processes that ended: never watched again
        self._dead: set[tuple[int, float | None]] = set()
        #: prompts whose server went away, waiting for the process watcher's verdict
        self._lost: list[_LostRun] = []
        #: OOM runs written once their incident's snapshot is on disk
        self._pending_runs: list[_PendingRun] = []
        #: prompt ids the snapshots on disk were built from (read at start-up)
        self._handled_prompts: set[str] = set()
        #: prompt ids recorded (or pending) lately; the runs table is the durable record
        self._recorded: OrderedDict[str, None] = OrderedDict()
        self._sources: dict[str, frozenset[str]] = {}
        #: a prompt found in history (on connect) that ended after this moment becomes an
        #: incident: the last time a daemon on this data dir was alive, else now -- an OOM
        #: from before the first start is recorded as a run, not alarmed on
        self._api_horizon_s = self.started_s
        #: install states over time (state_history.py): runs' states, regression suspicion
        self.install_states: InstallStateTracker | None = None

    # -- start-up ----------------------------------------------------------------------------

    def start(self) -> str:
        """Self-test and start every source; returns the one summary line that is logged."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.store = Store.open(self.data_dir)
        self.snapshots_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for leftover in clean_leftovers(self.snapshots_dir):
            log.info("removed an unfinished snapshot left by a crash: %s", leftover)
        recent = self._recover()
        self._resume_storms()

        if self.settings.metrics.enabled or self.settings.fleet.listen:
            from oom_sentinel.daemon.metrics import MetricsExporter

            self.metrics = MetricsExporter(
                self.settings.metrics, clock=self.clock, fleet=self.settings.fleet
            )
            host, port = self.metrics.start()
            fleet = self.settings.fleet
            scheme = "https" if fleet.listen and fleet.tls_cert_file else "http"
            log.info("metrics on %s://%s:%d/metrics", scheme, host, port)
        upload_channel = None
        if self.settings.fleet.bucket_url:  # boto3 loads on the first upload, never before
            from oom_sentinel.daemon.bucket import BucketChannel

            upload_channel = BucketChannel(self.settings.fleet)
            log.info("snapshots are uploaded to %s", upload_channel.name)
        self.alerts = AlertDispatcher(
            self.store,
            self.settings,
            build_channels(self.settings, environ=self.environ),
            clock=self.clock,
            on_result=self.metrics.observe_alert_result if self.metrics is not None else None,
            upload_channel=upload_channel,
            snapshots_dir=self.snapshots_dir,
        )
        self._catch_up_fleet(recent)

        choice = select_gpu_probe(self.settings.gpu, self.environ)
        self.gpu_line = choice.line
        log.info("%s", choice.line)
        self.timeline = Timeline.from_settings(self.settings.sampling)
        self.sampler = Sampler(
            self.timeline,
            choice.probe,
            PsutilHostProbe(),
            self.settings.sampling,
            on_sample=self._on_sample if self.metrics is not None else None,
        )

        self.tails = LogTailManager(
            self.store, poll_interval_ms=self.settings.logs.poll_interval_ms
        )
        last_alive = self.store.get_meta(META_LAST_ALIVE)
        with contextlib.suppress(TypeError, ValueError):
            # it is written every STATUS_INTERVAL_S: anything after the last write - that
            # interval may have ended while no daemon watched
            if last_alive is not None:
                self._api_horizon_s = min(self.started_s, float(last_alive) - STATUS_INTERVAL_S)
        api = self.settings.api
        self.comfy_watch = ComfyWatcher(
            lambda m: self._post("api", m),
            WatchOptions(
                active_poll_s=self.settings.sampling.active_interval_ms / 1000,
                idle_poll_s=api.idle_poll_ms / 1000,
                websocket=api.websocket,
                # prompts that ran while no daemon watched are read back from history
                backfill_since_s=self._api_horizon_s,
            ),
        )
        self.comfy_watch.start()
        kmsg = self.environ.get(KMSG_ENV)
        self.process_watch = ProcessWatcher(
            lambda m: self._post("process", m),
            roots=SystemRoots(kmsg=Path(kmsg)) if kmsg else None,
            memory=self.timeline.snapshot,
        )
        self.process_watch.start()
        log.info("process watcher: %s", self.process_watch.backend)
        for inst in self._configured_instances():
            self._adopt(inst)
        if self.settings.discovery.enabled or self._explicit:
            self._merge_discovered(self._discover())
        for path in (*self.settings.logs.extra, *self.options.watch_logs):
            self._follow(path, instance=self._instance_for_extra_log(path))
        self.tails.start()
        # The first poll fixes where each file is read from (its end, for a file never seen
        # before), so everything written after the ready line is read, even a record that
        # lands just before ComfyUI-Manager rotates the file.
        self._handle_lines(self.tails.poll(), self.clock())
        self._sync_watchers()

        self.scheduler = BackgroundScheduler(timezone="UTC", daemon=True)
        self.sampler.start(self.scheduler)
        if self.settings.discovery.enabled or self._explicit:
            self.scheduler.add_job(
                self._discovery_job,
                "interval",
                seconds=self.settings.discovery.interval_s,
                id="discovery",
                coalesce=True,
                max_instances=1,
            )
        self.scheduler.add_job(
            self._retention_job, "interval", hours=1, id="retention", coalesce=True
        )
        # a minute after start (the first captures and the API handshake are done), then
        # every ten: a few ms of glibc work that keeps RSS near what is live
        self.scheduler.add_job(
            release_free_heap,
            "interval",
            seconds=HEAP_TRIM_INTERVAL_S,
            next_run_time=datetime.now(UTC) + timedelta(seconds=HEAP_TRIM_FIRST_S),
            id="heap-trim",
            coalesce=True,
        )
        if self.settings.install_state.enabled:
            self.install_states = InstallStateTracker(
                self.store, self.settings.install_state, clock=self.clock
            )
            self.install_states.start(self.scheduler)
            self.install_states.update(self.instances.values())
        self.scheduler.start()
        self.alerts.start()
        self._retention_job()
        summary = self.summary()
        log.info("%s", summary)
        if not self.instances and not self._keys:
            log.info(
                "no ComfyUI install found yet; looking again every %d s (running ComfyUI "
                "processes, ~/ComfyUI, the Windows portable build, ComfyUI Desktop)",
                self.settings.discovery.interval_s,
            )
        return summary

    def summary(self) -> str:
        parts = []
        for inst in self.instances.values():
            where = f"pid {inst.pid}" if inst.pid else (inst.path or inst.url or "")
            parts.append(f"{inst.name} ({where})")
        insts = ", ".join(parts) if parts else "none yet"
        return (
            f"watching {len(self.instances)} ComfyUI instance(s): {insts}; "
            f"{len(self._keys)} log file(s); {self.gpu_line}; data in {self.data_dir}"
        )

    def _configured_instances(self) -> list[WatchedInstance]:
        out: list[WatchedInstance] = []
        for i, cfg in enumerate(self.settings.instances):
            url = cfg.url or (f"http://127.0.0.1:{cfg.port}" if cfg.port else None)
            if cfg.path:
                described = describe_install(Path(cfg.path).expanduser(), name=cfg.name)
                inst = self._from_discovered(described, source="config")
            elif url:
                inst = WatchedInstance(
                    name=_instance_name_for_url(url),
                    path=None,
                    url=url,
                    log_paths=(),
                    source="config",
                )
            else:
                raise ConfigError(f"{self.loaded.source}: instances[{i}]: needs a path or a url")
            if cfg.name:
                inst.name = cfg.name
            if url:
                inst.url, inst.url_fixed = url, True  # the user's URL: discovery keeps it
            inst.log_paths = tuple(dict.fromkeys((*inst.log_paths, *cfg.logs)))
            out.append(inst)
        for target in self.options.comfyui:
            if target.startswith(("http://", "https://")):
                out.append(
                    WatchedInstance(
                        name=_instance_name_for_url(target),
                        path=None,
                        url=target.rstrip("/"),
                        log_paths=(),
                        source="cli",
                        url_fixed=True,
                    )
                )
            else:
                path = Path(target).expanduser()
                if not path.is_dir():
                    raise ConfigError(f"--comfyui {target}: not a directory or an http URL")
                out.append(self._from_discovered(describe_install(path), source="cli"))
        return out

    @staticmethod
    def _from_discovered(d: DiscoveredInstance, *, source: str | None = None) -> WatchedInstance:
        return WatchedInstance(
            name=d.name,
            path=d.path,
            url=d.url,
            log_paths=tuple(d.log_paths),
            pid=d.pid,
            python=d.python,
            source=source or d.source,
            process=d.process,
        )

    def _discover(self) -> tuple[DiscoveredInstance, ...]:
        """Runs in the scheduler thread (and once at start): every process is walked."""
        procs: list[ComfyProcess] = []
        try:
            if self.settings.discovery.processes:
                procs = list(find_comfy_processes())
        except Exception:  # psutil may fail on exotic systems; discovery is best effort
            log.exception("could not list processes; discovery continues with locations only")
            procs = []
        home = self.environ.get("HOME") or str(Path.home())
        found = discover_instances(home=home, environ=self.environ, processes=procs)
        if self._explicit:
            # Only processes of the instances the user named: match them by install path.
            known = {os.path.realpath(i.path) for i in list(self.instances.values()) if i.path}
            return tuple(
                d for d in found if d.pid is not None and os.path.realpath(d.path) in known
            )
        return found

    def _discovery_job(self) -> None:
        self._inbox.put(("discovered", self._discover()))
        if self.tails is not None:
            self.tails.wake()

    def _retention_job(self) -> None:
        try:
            removed = prune_snapshots(
                self.snapshots_dir,
                max_count=self.settings.snapshots.max_count,
                max_age_days=self.settings.snapshots.max_age_days,
                now_s=self.clock(),
                store=self.store,
            )
        except SentinelError as exc:
            log.warning("retention: %s", exc)
            return
        if removed:
            log.info("retention: removed %d old snapshot(s)", len(removed))

    # -- instances and their logs --------------------------------------------------------------

    def _adopt(self, inst: WatchedInstance) -> None:
        existing = self.instances.get(inst.name)
        if existing is None:
            self.instances[inst.name] = inst
            log.info(
                "watching ComfyUI %r (%s)%s",
                inst.name,
                inst.path or inst.url,
                f", pid {inst.pid}" if inst.pid else "",
            )
        else:
            if inst.pid != existing.pid and inst.pid is not None:
                log.info("ComfyUI %r is running as pid %d", inst.name, inst.pid)
            existing.pid = inst.pid
            existing.process = inst.process
            existing.python = inst.python or existing.python
            existing.log_paths = tuple(dict.fromkeys((*existing.log_paths, *inst.log_paths)))
            if inst.url and not existing.url_fixed:
                existing.url = inst.url
            inst = existing
        for path in inst.log_paths:
            self._follow(path, instance=inst.name)

    def _merge_discovered(self, found: Iterable[DiscoveredInstance]) -> None:
        by_path = {os.path.realpath(i.path): i for i in self.instances.values() if i.path}
        for d in found:
            match = by_path.get(os.path.realpath(d.path))
            inst = self._from_discovered(d)
            if match is not None:
                inst.name = match.name
                inst.source = match.source
            self._adopt(inst)
        self._sync_watchers()

    def _follow(self, path: str, *, instance: str) -> None:
        assert self.tails is not None
        key = os.path.abspath(os.path.expanduser(path))
        if key in self._keys:
            return
        self._keys[key] = _LogKeyState(instance=instance)
        self.tails.add(key)
        log.info("following %s (%s)", key, instance)

    def _instance_for_extra_log(self, path: str) -> str:
        """A log named with --watch-log belongs to the instance whose install holds it."""
        real = os.path.realpath(os.path.expanduser(path))
        for inst in self.instances.values():
            if inst.path and real.startswith(os.path.realpath(inst.path) + os.sep):
                return inst.name
        return os.path.basename(path) or path

    # -- ComfyUI's API and processes ------------------------------------------------------------

    def _sync_watchers(self) -> None:
        """Point the API watcher at every instance's URL and the process watcher at every
        known, living process; the sampler follows the same pids, and the install-state
        tracker the same installs and restarts. Called after every change to the instances
        (discovery, an API (re)connect, a process's end, a reload), so the loop need not."""
        if self.comfy_watch is not None:
            self.comfy_watch.set_instances(
                {name: inst.url for name, inst in self.instances.items() if inst.url}
            )
        if self.process_watch is not None:
            watching = self.process_watch.watching()
            for name, inst in self.instances.items():
                proc = inst.process
                if proc is not None and (proc.pid, proc.create_time_s) in self._dead:
                    inst.pid, inst.process = None, None  # a stale discovery of a dead process
                    proc = None
                if proc is None:
                    if name in watching:
                        self.process_watch.forget(name)
                elif watching.get(name) != proc.pid:
                    self.process_watch.watch(name, proc)
        if self.sampler is not None:
            self.sampler.set_watched(i.pid for i in self.instances.values() if i.pid)
        if self.install_states is not None:
            self.install_states.update(self.instances.values())

    def _lookup_process(self, inst: WatchedInstance) -> ComfyProcess | None:
        """The running ComfyUI process of ``inst``: by install path, else by URL."""
        try:
            procs = find_comfy_processes()
        except Exception:
            log.exception("could not list processes")
            return None
        live = (p for p in procs if (p.pid, p.create_time_s) not in self._dead)
        return process_for(live, path=inst.path, url=inst.url)

    def _refresh_sources(self) -> None:
        """Tell the tracker which sources watch each instance now, so a snapshot waits only
        for those (a log that does not exist yet, or an API that is down, is not waited for)."""
        reading: set[str] = set()
        if self.tails is not None:
            for key, follower in self.tails.followers.items():
                state = self._keys.get(key)
                if state is None or state.instance in reading:
                    continue
                # read already, or there to be read at the next poll (a file that does not
                # exist yet -- Manager's log before its first start -- is not waited for)
                if follower.state.path is not None or os.path.exists(key):
                    reading.add(state.instance)
        watching = self.process_watch.watching() if self.process_watch is not None else {}
        for name in set(self.instances) | reading:
            sources = set()
            if name in reading:
                sources.add("log")
            if self._api_up.get(name):
                sources.add("api")
            if name in watching:
                sources.add("process")
            frozen = frozenset(sources)
            if self._sources.get(name) != frozen:
                self._sources[name] = frozen
                self.tracker.set_available_sources(name, frozen)

    def _on_api(self, message: Any) -> None:
        if isinstance(message, PromptDone):
            self._on_prompt_done(message)
        elif isinstance(message, PromptStarted):
            self._on_prompt_started(message)
        elif isinstance(message, ApiContext):
            self._api_context[message.instance] = message
        elif isinstance(message, ApiStatus):
            self._on_api_status(message)

    def _on_api_status(self, status: ApiStatus) -> None:
        self._api_up[status.instance] = status.connected
        inst = self.instances.get(status.instance)
        if status.connected:
            self._api_context[status.instance] = ApiContext(
                status.instance, status.at_s, status.system_stats, None
            )
            if inst is not None:
                proc = self._lookup_process(inst)
                if proc is not None and (inst.process is None or inst.process.pid != proc.pid):
                    log.info("ComfyUI %r is running as pid %d", inst.name, proc.pid)
                    inst.pid, inst.process = proc.pid, proc
                    if not inst.python:
                        inst.python = proc.interpreter
                    self._sync_watchers()
        self._refresh_sources()

    def _capture(
        self,
        prompt_id: str,
        instance: str,
        prompt: Mapping[str, Any] | None,
        workflow: Mapping[str, Any] | None,
        seen_s: float,
        done: PromptDone | None = None,
    ) -> None:
        old = self._captured.get(prompt_id)
        entry = _Captured(
            instance,
            prompt if prompt is not None else (old.prompt if old else None),
            workflow if workflow is not None else (old.workflow if old else None),
            old.seen_s if old else seen_s,
            done or (old.done if old else None),
        )
        self._captured[prompt_id] = entry
        self._captured.move_to_end(prompt_id)
        while len(self._captured) > CAPTURED_PROMPTS:
            self._captured.popitem(last=False)

    def _on_prompt_started(self, started: PromptStarted) -> None:
        self._capture(
            started.prompt_id, started.instance, started.prompt, started.workflow, started.seen_s
        )
        self._running[started.instance] = (started.prompt_id, started.seen_s)
        self._update_sampling()

    def _update_sampling(self) -> None:
        if self.sampler is not None:
            self.sampler.set_active(bool(self._running))

    def _on_prompt_done(self, done: PromptDone) -> None:
        running = self._running.get(done.instance)
        started_s = None
        if running is not None and running[0] == done.prompt_id:
            started_s = running[1]
            del self._running[done.instance]
            self._update_sampling()
        captured = self._captured.get(done.prompt_id)
        if started_s is None and captured is not None:
            started_s = captured.seen_s
        if done.prompt_id in self._recorded:
            return
        assert self.store is not None
        self._recorded[done.prompt_id] = None
        while len(self._recorded) > RECENT_PROMPT_IDS:
            self._recorded.popitem(last=False)
        if has_run(self.store, done.instance, done.prompt_id):
            return  # reported again after a reconnect
        self._capture(done.prompt_id, done.instance, done.prompt, done.workflow, done.seen_s, done)
        inst = self.instances.get(done.instance)
        pid = inst.pid if inst is not None else None
        exited = self._recent_exit(done.instance) if done.outcome == "lost" else None
        if exited is not None and pid is None:
            pid = exited.process.pid  # its peak is that process's, though it is gone now
        run = self._run_of(done, pid=pid, started_s=started_s)
        if done.outcome == "lost":
            if exited is not None:  # the process watcher spoke first
                self._save_run(self._lost_outcome(run, exited))
            elif pid is None:
                self._save_run(run)  # no process to ask: crashed
            else:
                self._lost.append(_LostRun(run, self.clock()))
            return
        obs = done.observation
        rid = _api_record_id(done.instance, done.prompt_id)
        if obs is not None:
            counted_by = self._counted_by(rid)
            if counted_by is not None:
                # counted before a restart (its snapshot was written, its run row was not):
                # the row names that incident, and nothing is counted again
                self._save_run(dataclasses.replace(run, incident_id=counted_by))
                return
        fresh = not done.backfill or (done.ended_s or done.seen_s) >= self._api_horizon_s
        if obs is not None and fresh and done.prompt_id not in self._handled_prompts:
            # the workflow is part of what makes a storm "the same failure" (incidents.py)
            extra = {"record_id": rid}
            if run.fingerprint:
                extra["workflow_fingerprint"] = run.fingerprint
            obs = dataclasses.replace(obs, evidence={**obs.evidence, **extra})
            if not obs.event.recovered:
                self._pending_runs.append(_PendingRun(run, rid))
                self._apply(self.tracker.observe(obs, self.clock()))
                return
            self._apply(self.tracker.observe(obs, self.clock()))
        self._save_run(run)

    def _recent_exit(self, instance: str) -> ProcessExit | None:
        now = self.clock()
        for exit in reversed(self._exits.values()):
            if exit.instance == instance and now - exit.death.died_at_s < LOST_RUN_GRACE_S:
                return exit
        return None

    def _lost_outcome(self, run: RunRecord, exit: ProcessExit) -> RunRecord:
        """A lost prompt's run, once its process's end is known: killed or crashed."""
        incident_id = None
        if exit.os_kill:
            for inc in self.tracker.open_incidents():
                if inc.instance == exit.instance and inc.pool is Pool.KILLED_BY_OS:
                    incident_id = inc.id
        outcome = "killed" if exit.os_kill else ("sigkill" if exit.sigkill else "crashed")
        return dataclasses.replace(
            run,
            outcome=outcome,
            incident_id=incident_id,
            pid=run.pid or exit.process.pid,
        )

    def _run_of(self, done: PromptDone, *, pid: int | None, started_s: float | None) -> RunRecord:
        """The run row, measured now: one fresh sample closes the memory window."""
        if self.sampler is not None and done.outcome != "lost":
            self.sampler.sample_once()
        samples = self.timeline.snapshot() if self.timeline is not None else ()
        now = self.clock()
        state_id = None
        if self.install_states is not None:
            inst = self.instances.get(done.instance)
            proc = inst.process if inst is not None else None
            state_id = self.install_states.state_id_for_run(
                done.instance,
                started_s=done.started_s or started_s or done.seen_s,
                process_start_s=proc.create_time_s if proc and proc.pid == pid else None,
            )
        return run_from_done(
            done,
            recorded_s=now,
            pid=pid,
            samples=samples,
            started_s=started_s,
            window_end_s=now,
            install_state_id=state_id,
        )

    def _save_run(self, run: RunRecord) -> None:
        assert self.store is not None
        try:
            new = record_run(self.store, run)
        except SentinelError as exc:
            log.error("could not record run %s: %s", run.prompt_id, exc)
            return
        log.debug("run %s on %s: %s", run.prompt_id, run.instance, run.outcome)
        if new and self.metrics is not None:  # each prompt counted once, like its row
            self.metrics.observe_prompt(
                run.instance,
                run.outcome,
                peak_vram_bytes=run.peak_vram_bytes,
                peak_ram_bytes=run.peak_rss_bytes,
                duration_s=run.duration_s,
            )

    def _flush_runs(self) -> None:
        """Write the rows of OOM runs whose incident has counted them (snapshot on disk)."""
        if not self._pending_runs:
            return
        keep: list[_PendingRun] = []
        for pending in self._pending_runs:
            incident_id = self._counted_by(pending.record_id)
            if incident_id is None:
                keep.append(pending)  # its snapshot is not written yet
                continue
            self._save_run(dataclasses.replace(pending.run, incident_id=incident_id))
        self._pending_runs = keep

    def _expire_lost_runs(self, now: float) -> None:
        """Prompts whose server went away and no process exit explained it: crashed."""
        if not self._lost:
            return
        keep: list[_LostRun] = []
        for lost in self._lost:
            if now - lost.since_s >= LOST_RUN_GRACE_S:
                self._save_run(lost.run)
            else:
                keep.append(lost)
        self._lost = keep

    def _on_process_exit(self, exit: ProcessExit) -> None:
        proc = exit.process
        self._dead.add((proc.pid, proc.create_time_s))
        self._exits[proc.pid] = exit
        while len(self._exits) > CAPTURED_PROMPTS:
            self._exits.popitem(last=False)
        inst = self.instances.get(exit.instance)
        if inst is not None and inst.pid == proc.pid:
            inst.pid, inst.process = None, None
        # the prompt it was running: still marked running, or just reported lost (a prompt
        # seen after the death runs on the restarted ComfyUI and is left alone)
        prompt_id: str | None = None
        running = self._running.get(exit.instance)
        if running is not None and running[1] <= exit.death.died_at_s:
            prompt_id = running[0]
            del self._running[exit.instance]
            self._update_sampling()
        lost_here = [lost for lost in self._lost if lost.run.instance == exit.instance]
        if prompt_id is None and lost_here:
            prompt_id = lost_here[-1].run.prompt_id
        if exit.os_kill:
            obs = kill_observation(exit, prompt_id=prompt_id)
            self._apply(self.tracker.observe(obs, self.clock()))
        for lost in lost_here:
            self._lost.remove(lost)
            self._save_run(self._lost_outcome(lost.run, exit))
        self._sync_watchers()
        self._refresh_sources()

    # -- snapshot content from the API and the processes ----------------------------------------

    def _snapshot_extras(
        self, incident: Incident, inst: WatchedInstance, memory: Any
    ) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None, dict[str, Mapping[str, Any]]]:
        """``prompt.json``, ``workflow.json`` and the optional sections for one incident."""
        prompt_id: str | None = None
        exit: ProcessExit | None = None
        for obs in incident.observations:
            pid_value = obs.evidence.get("prompt_id")
            if prompt_id is None and isinstance(pid_value, str):
                prompt_id = pid_value
            killed = obs.evidence.get("pid") if obs.source == "process" else None
            if exit is None and isinstance(killed, int):
                exit = self._exits.get(killed)
        if prompt_id is None and incident.instance in self._running:
            prompt_id = self._running[incident.instance][0]
        captured = self._captured.get(prompt_id) if prompt_id else None
        sections: dict[str, Mapping[str, Any]] = {}
        proc = exit.process if exit is not None else inst.process
        gpu_procs = tuple(memory.gpu_processes) if memory is not None else ()
        own: set[int] = set()
        if proc is not None and exit is None:
            with contextlib.suppress(psutil.Error, OSError):
                own.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        try:
            comfy = [p for p in find_comfy_processes() if process_exists(p.pid, p.create_time_s)]
        except Exception:
            comfy = []
        sections["process"] = process_section(
            proc, gpu_processes=gpu_procs, own_pids=own, comfy_processes=comfy, exit=exit
        )
        if exit is not None:
            sections["kernel"] = kernel_section(exit.death, exit.evidence, exit.basis)
        done = captured.done if captured is not None else None
        context = self._api_context.get(incident.instance)
        stats = done.system_stats if done is not None and done.system_stats else None
        logs = done.internal_logs if done is not None and done.internal_logs else None
        stats_at = logs_at = done.seen_s if done is not None else None
        if stats is None and context is not None and context.system_stats is not None:
            stats, stats_at = context.system_stats, context.at_s
        if logs is None and context is not None and context.internal_logs is not None:
            logs, logs_at = context.internal_logs, context.at_s
        if stats is not None:
            sections["system_stats"] = {
                "captured": iso_utc(stats_at) if stats_at else None,
                **dict(stats),
            }
        if logs is not None:
            sections["internal_logs"] = {
                "captured": iso_utc(logs_at) if logs_at else None,
                "lines": logs.count("\n"),
                "tail": logs,
            }
        prompt = captured.prompt if captured is not None else None
        workflow = captured.workflow if captured is not None else None
        return prompt, workflow, sections

    # -- recovery ------------------------------------------------------------------------------

    def _recover(self) -> list[Snapshot]:
        """Learn which log records recent snapshots were built from, and give any snapshot
        that missed its store row (killed between the two writes) its row. Returns those
        snapshots, newest first."""
        assert self.store is not None
        snaps, problems = list_snapshots(self.snapshots_dir, newest=RECOVERY_SNAPSHOTS)
        for problem in problems:
            log.warning("snapshots: %s", problem)
        for snap in snaps:
            for obs in snap.data.get("observations") or []:
                evidence = obs.get("evidence") or {} if isinstance(obs, dict) else {}
                rid = evidence.get("record_id")
                if isinstance(rid, str):
                    self._remember_record(rid)
                prompt_id = evidence.get("prompt_id")
                if isinstance(prompt_id, str) and obs.get("source") == "api":
                    self._handled_prompts.add(prompt_id)
            if self.store.incident_for_snapshot(snap.id) is None:
                row = _row_from_snapshot(snap.data, snap.id)
                if row is not None:
                    self.store.save_incident(row, snapshot_records(snap.data))
                    log.info("snapshot %s had no store row; restored it", snap.id)
        return snaps

    def _catch_up_fleet(self, recent: Sequence[Snapshot]) -> None:
        """At start: a snapshot that a crash kept out of the bucket's queue (killed between
        writing it and queueing it), or one written before bucket_url was set, is queued now
        if it is younger than the alerts' retry_max_age_s (the outbox keeps each once: one
        already queued, sent or given up is left alone); and each instance's latest incident
        is named in the metrics again, with the time it was recorded."""
        now = self.clock()
        if self.alerts is not None and self.alerts.upload_channel is not None:
            max_age_s = self.settings.alerts.retry_max_age_s
            for snap in recent:
                created_s = parse_iso_utc(snap.created)
                if created_s is not None and now - created_s <= max_age_s:
                    self._queue_upload(snap.instance_name, snap.id, snap.path)
        if self.metrics is not None:
            named: set[str] = set()
            for snap in recent:  # newest first: the first of each instance is its latest
                created_s = parse_iso_utc(snap.created)
                if snap.instance_name in named or created_s is None:
                    continue
                named.add(snap.instance_name)
                regression = snap.data.get("regression")
                self.metrics.set_last_incident(
                    snap.instance_name,
                    str(snap.event.get("pool") or ""),
                    str(snap.event.get("node_type") or ""),
                    snap.id,
                    regression=isinstance(regression, dict) and regression.get("suspected") is True,
                    at_s=created_s,
                )

    def _resume_storms(self) -> None:
        """Re-admit the incidents whose storm was still open when the daemon stopped, so the
        storm's next repeat grows the same incident instead of writing a second snapshot."""
        assert self.store is not None
        now = self.clock()
        for row in self.store.open_incidents():
            last = self.store.incident_records(row.id, failure=row.count)
            self.tracker.resume(row.to_incident(), now, last_failure=last)
            log.debug("resumed open incident %s (count %d)", row.id, row.count)

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        assert self.tails is not None
        self.notifier.ready(self.summary())
        while not stop.is_set():
            now = self.clock()
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            self._refresh_sources()
            self._drain_inbox()
            self._handle_lines(self.tails.poll(), now)
            self._flush_idle_records(now)
            self._apply(self.tracker.tick(self.clock()))
            if self._unwritten:
                self._retry_unwritten(self.clock())
            if self.alerts is not None:
                self.alerts.tick()
            self._expire_lost_runs(self.clock())
            self._flush_runs()
            self._commit_offsets()
            self._ping_watchdog(now)
            if now - self._last_status >= STATUS_INTERVAL_S:
                self._write_status(now)
            if stop.is_set():
                break
            self.tails.wait(self._wait_timeout(self.clock()))

    def wake(self) -> None:
        if self.tails is not None:
            self.tails.wake()

    def _wait_timeout(self, now: float) -> float:
        timeout = self.settings.logs.poll_interval_ms / 1000
        deadline = self.tracker.next_deadline()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - now))
        if any(s.assembler.pending_start_offset is not None for s in self._keys.values()):
            timeout = min(timeout, RECORD_IDLE_S)
        if self._watchdog_s is not None:
            timeout = min(timeout, max(0.0, self._last_ping + self._watchdog_s - now))
        if self._lost:
            oldest = min(lost.since_s for lost in self._lost)
            timeout = min(timeout, max(0.0, oldest + LOST_RUN_GRACE_S - now))
        if self._unwritten:
            retry = min(u.retry_at_s for u in self._unwritten.values())
            timeout = min(timeout, max(0.0, retry - now))
        return timeout

    def _post(self, kind: str, payload: Any) -> None:
        """Hand a watcher's record to the main loop (any thread)."""
        self._inbox.put((kind, payload))
        self.wake()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            try:
                if kind == "discovered":
                    self._merge_discovered(payload)
                elif kind == "api":
                    self._on_api(payload)
                elif kind == "process":
                    self._on_process_exit(payload)
            except SentinelError as exc:
                log.error("could not handle a %s report: %s", kind, exc)

    def _handle_lines(self, lines: Sequence[LogLine], now: float) -> None:
        observations: list[Observation] = []
        batch_start = time.monotonic()
        for line in lines:
            if observations and (
                len(observations) >= BACKLOG_BATCH_RECORDS
                or time.monotonic() - batch_start >= BACKLOG_BATCH_S
            ):
                # A backlog: act on what was read so far and save the positions, so a restart
                # in the middle of it repeats at most one batch.
                self._apply(self.tracker.observe_many(observations, self.clock()))
                observations = []
                self._commit_offsets()
                batch_start = time.monotonic()
            state = self._keys.get(line.key)
            if state is None:
                continue
            if state.path is not None and (
                line.path != state.path or line.start_offset != state.end_offset
            ):
                # a record never spans two files (or a gap): close the pending one first
                for record in state.assembler.flush():
                    self._on_record(line.key, state, state.path, record, now, observations)
            state.recent.append((line.path, line.start_offset, _clip_line(line.text)))
            for record in state.assembler.feed(line.text, line.start_offset, line.end_offset):
                self._on_record(line.key, state, line.path, record, now, observations)
            state.path = line.path
            state.end_offset = line.end_offset
            state.last_line_at = now
        if observations:
            self._apply(self.tracker.observe_many(observations, self.clock()))

    def _flush_idle_records(self, now: float) -> None:
        observations: list[Observation] = []
        for key, state in self._keys.items():
            if state.assembler.pending_start_offset is None or state.path is None:
                continue
            if now - state.last_line_at >= RECORD_IDLE_S:
                for record in state.assembler.flush():
                    self._on_record(key, state, state.path, record, now, observations)
        if observations:
            self._apply(self.tracker.observe_many(observations, self.clock()))

    def _on_record(
        self,
        key: str,
        state: _LogKeyState,
        path: str,
        record: Record,
        now: float,
        out: list[Observation],
    ) -> None:
        event = classify_record(record.text)
        if event is None:
            return
        rid = _record_id(key, record)
        if rid in self._handled_records or self._record_counted(rid):
            return  # an incident already counted it (re-read after a crash)
        self._remember_record(rid)
        if not event.recovered:
            self._hold_seq += 1
            self._holds[rid] = _Held(key, path, record.start_offset, self._hold_seq)
        out.append(
            Observation(
                instance=state.instance,
                source="log",
                event=event,
                at_s=_record_time(record, now),
                evidence={
                    "record_id": rid,
                    "log_path": path,
                    "start_offset": record.start_offset,
                    "end_offset": record.end_offset,
                    "line_no": record.line_no,
                },
            )
        )
        self._contexts[rid] = self._context_lines(state, path, record.start_offset)

    def _remember_record(self, rid: str) -> None:
        self._handled_records[rid] = None
        while len(self._handled_records) > RECENT_RECORD_IDS:
            self._handled_records.popitem(last=False)

    def _record_counted(self, rid: str) -> bool:
        return self._counted_by(rid) is not None

    def _counted_by(self, rid: str) -> str | None:
        """The incident that counted a source record, from the store (None: none yet)."""
        assert self.store is not None
        try:
            return self.store.counted_by(rid)
        except SentinelError as exc:
            log.warning("could not check whether a record was counted: %s", exc)
            return None

    def _context_lines(self, state: _LogKeyState, path: str, start: int) -> tuple[str, ...]:
        before = [text for p, off, text in state.recent if p == path and off < start][
            -self.settings.logs.context_lines :
        ]
        return tuple(before)

    # -- acting --------------------------------------------------------------------------------

    def _apply(self, actions: Iterable[Any]) -> None:
        assert self.store is not None
        for action in actions:
            if isinstance(action, WriteSnapshot):
                self._write(action.incident, action.records)
                continue  # _write alerts with the snapshot it wrote
            if isinstance(action, UpdateIncident):
                pending = self._unwritten.get(action.incident.id)
                if pending is not None:  # its snapshot or row is not saved yet: it carries these
                    pending.incident = action.incident
                    pending.records.extend(action.records)
                    continue
                try:
                    self.store.save_incident(
                        IncidentRow.from_incident(action.incident), action.records
                    )
                except SentinelError as exc:
                    log.error(
                        "could not save incident %s (trying again every %.0f s): %s",
                        action.incident.id,
                        SNAPSHOT_RETRY_S,
                        exc,
                    )
                    self._unwritten[action.incident.id] = _Unwritten(
                        action.incident,
                        list(action.records),
                        self.clock() + SNAPSHOT_RETRY_S,
                        snapshot_id="",
                    )
                    continue
                self._release(action.records)
            elif isinstance(action, CloseIncident) and action.incident.id in self._unwritten:
                self._unwritten[action.incident.id].incident = action.incident
                continue  # closed once its snapshot is written
            elif isinstance(action, CountSoftOom):
                log.info(
                    "ComfyUI %r recovered from a soft OOM (%d so far): %s",
                    action.instance,
                    action.count,
                    action.observation.event.message[:200],
                )
                if self.metrics is not None:
                    self.metrics.observe_soft_oom(action.instance)
            elif isinstance(action, CloseIncident):
                log.debug(
                    "incident %s closed after %d failure(s)",
                    action.incident.id,
                    action.incident.count,
                )
                try:
                    self.store.close_incident(action.incident.id, self.clock())
                except SentinelError as exc:
                    log.warning("could not close incident %s: %s", action.incident.id, exc)
            if self.metrics is not None and isinstance(action, (UpdateIncident, CloseIncident)):
                self.metrics.observe_incident(action.incident)
            if self.alerts is not None:
                self.alerts.handle(action)

    def _release(self, records: Iterable[FoldedRecord]) -> None:
        """The records are counted durably: their log positions may move past them."""
        for record in records:
            self._holds.pop(record.record_id, None)
            self._contexts.pop(record.record_id, None)

    def _retry_unwritten(self, now: float) -> None:
        """Write the snapshots that failed earlier (a full disk that has room again)."""
        for incident_id, pending in list(self._unwritten.items()):
            if now < pending.retry_at_s:
                continue
            current = self.tracker.current(incident_id)
            incident = current if current is not None else pending.incident
            del self._unwritten[incident_id]
            if pending.snapshot_id is not None:
                self._save_row(incident, pending.snapshot_id or None, pending.records)
            else:
                self._write(incident, pending.records, retry=True)
            if current is None and incident_id not in self._unwritten:
                # its storm ended while it waited: close it now that it is saved
                self._apply([CloseIncident(incident)])

    def _save_row(
        self, incident: Incident, snapshot_id: str | None, records: Sequence[FoldedRecord]
    ) -> None:
        """The row and the records it counted; on failure tried again while running (and a
        restart restores them from the snapshot, which lists its records)."""
        assert self.store is not None
        try:
            self.store.save_incident(IncidentRow.from_incident(incident, snapshot_id), records)
        except SentinelError as exc:
            log.error("could not save incident %s: %s", incident.id, exc)
            self._unwritten[incident.id] = _Unwritten(
                incident, list(records), self.clock() + SNAPSHOT_RETRY_S, snapshot_id or ""
            )
            return
        self._release(records)

    def _write(
        self, incident: Incident, records: Sequence[FoldedRecord] = (), *, retry: bool = False
    ) -> None:
        assert self.store is not None
        inst = self.instances.get(incident.instance) or WatchedInstance(
            name=incident.instance, path=None, url=None, log_paths=()
        )
        memory = self.sampler.sample_once() if self.sampler is not None else None
        if memory is None and self.timeline is not None:
            memory = self.timeline.latest()
        timeline_csv = to_csv(self.timeline.snapshot()) if self.timeline is not None else ""
        if self._host_facts is None:
            self._host_facts = collect_host_facts()
        prompt, workflow, sections = self._snapshot_extras(incident, inst, memory)
        advice = advise(incident.event, advice_context(sections, memory))
        parts = None
        if self.install_states is not None:
            parts = self.install_states.snapshot_parts(
                incident.instance,
                prompt=prompt,
                started_s=incident.first_seen_s,
                process_start_s=inst.process.create_time_s if inst.process else None,
            )
        if parts is not None:
            sections.update(parts.sections)
            advice = [parts.advice, *advice] if parts.advice is not None else advice
        suffix = parts.summary_suffix if parts is not None else None
        content = SnapshotContent(
            incident=dataclasses.replace(incident, summary=incident.summary + suffix)
            if suffix
            else incident,
            instance=inst.info(),
            host=self._host_facts,
            created_s=self.clock(),
            advice=tuple(advice),
            memory=memory,
            log_text=self._log_text(incident),
            timeline_csv=timeline_csv,
            prompt=prompt,
            workflow=workflow,
            sections=sections,
            records=tuple(records),
        )
        try:
            ref = write_snapshot(self.snapshots_dir, content)
        except SentinelError as exc:
            # Delayed, never dropped: its records keep their hold and it is tried again.
            if not retry:
                log.error(
                    "could not write the snapshot of incident %s (trying again every %.0f s): %s",
                    incident.id,
                    SNAPSHOT_RETRY_S,
                    exc,
                )
            self._unwritten[incident.id] = _Unwritten(
                incident, list(records), self.clock() + SNAPSHOT_RETRY_S
            )
            return
        if retry:
            log.info("snapshot of incident %s written on a later try", incident.id)
        self._save_row(incident, ref.id, records)
        self.incidents_written += 1
        self.last_incident = ref.id
        if self.metrics is not None:
            self.metrics.observe_incident(incident)
            regression = sections.get("regression") or {}
            self.metrics.observe_snapshot(
                incident, ref.id, regression=regression.get("suspected") is True
            )
        if self.alerts is not None:
            self.alerts.on_incident_written(incident, ref)
            if self.alerts.upload_channel is not None:
                self._queue_upload(incident.instance, ref.id, ref.path)
        log.warning("OOM on %s: %s -- snapshot %s", incident.instance, incident.summary, ref.path)
        if suffix:
            log.warning("suspected regression after an install change: run oom-bisect %s", ref.id)
        if self.on_incident is not None:
            try:
                self.on_incident(incident, ref)
            except Exception:
                log.exception("incident callback failed for %s", ref.id)

    def _queue_upload(self, instance: str, snapshot_id: str, path: Path) -> None:
        """[fleet] bucket_url: the finished (redacted) snapshot goes to the bucket, via the
        outbox (retried, kept across restarts)."""
        from oom_sentinel.daemon.bucket import upload_item

        assert self.alerts is not None
        item = upload_item(
            self.settings.fleet,
            snapshot_id=snapshot_id,
            path=path,
            instance=instance,
            created_s=self.clock(),
        )
        try:
            self.alerts.queue_upload(item)
        except StoreError as exc:
            log.error("could not queue the upload of snapshot %s: %s", snapshot_id, exc)

    def _log_text(self, incident: Incident) -> str:
        chunks: list[str] = []
        for obs in incident.observations:
            ev = obs.evidence
            if obs.source != "log" or "record_id" not in ev:
                continue
            key = str(ev["record_id"]).split("|", 1)[0]
            state = self._keys.get(key)
            before = list(self._contexts.get(str(ev["record_id"]), ()))
            after: list[str] = []
            if state is not None:
                after = [
                    text
                    for p, off, text in state.recent
                    if p == ev.get("log_path") and off >= int(ev.get("start_offset", 0))
                ][:AFTER_LINES]
            chunks.append(_bounded_context(f"==> {ev.get('log_path')} <==", before, after))
            break  # the first log record's neighbourhood tells the story
        return "\n".join(chunks) + ("\n" if chunks else "")

    def _commit_offsets(self) -> None:
        """Save each log's position: before its oldest record not yet counted durably (held,
        possibly in a file rotated since -- ``.prev.log``), else before the record still being
        assembled, else after the last line read."""
        assert self.tails is not None
        oldest: dict[str, _Held] = {}
        for held in self._holds.values():
            if held.key not in oldest or held.seq < oldest[held.key].seq:
                oldest[held.key] = held
        for key, state in self._keys.items():
            if state.path is None:
                continue
            path, offset = state.path, state.end_offset
            pending = state.assembler.pending_start_offset
            if pending is not None:
                offset = min(offset, pending)
            first_held = oldest.get(key)
            if first_held is not None:
                path, offset = first_held.path, first_held.start_offset
            try:
                self.tails.commit(key, path, offset)
            except SentinelError as exc:
                log.warning("could not save the read position of %s: %s", key, exc)
            except ValueError as exc:  # a position the follower no longer knows: keep the old
                log.debug("%s", exc)

    def status(self, now: float) -> dict[str, Any]:
        """What ``oom-sentinel status`` shows: what is watched, the last sample, incidents."""
        latest = self.timeline.latest() if self.timeline is not None else None
        sample: dict[str, Any] | None = None
        if latest is not None:
            sample = {
                "time_s": latest.time_s,
                "ram_total_bytes": latest.host.ram_total_bytes if latest.host else None,
                "ram_available_bytes": latest.host.ram_available_bytes if latest.host else None,
                "swap_used_bytes": latest.host.swap_used_bytes if latest.host else None,
                "gpus": [
                    {
                        "index": g.index,
                        "name": g.name,
                        "used_bytes": g.used_bytes,
                        "total_bytes": g.total_bytes,
                    }
                    for g in latest.gpus
                ],
                "processes": [
                    {"pid": t.root_pid, "rss_bytes": t.rss_bytes} for t in latest.process_trees
                ],
            }
        logs = []
        if self.tails is not None:
            for key, follower in self.tails.followers.items():
                st = follower.state
                logs.append(
                    {
                        "path": key,
                        "instance": self._keys[key].instance if key in self._keys else None,
                        "reading": st.path,
                        "offset": st.offset,
                        "error": st.error,
                    }
                )
        return {
            "pid": os.getpid(),
            "started_s": self.started_s,
            "updated_s": now,
            "config": str(self.loaded.source) if self.loaded.source else None,
            "data_dir": str(self.data_dir),
            "gpu": self.gpu_line,
            "wake": self.tails.wake_backend if self.tails is not None else None,
            "instances": [
                {
                    "name": i.name,
                    "path": i.path,
                    "url": i.url,
                    "pid": i.pid,
                    "source": i.source,
                    "api": self._api_up.get(i.name, False),
                    "running_prompt": (self._running.get(i.name) or (None,))[0],
                }
                for i in self.instances.values()
            ],
            "logs": logs,
            "last_sample": sample,
            "incidents_written": self.incidents_written,
            "last_incident": self.last_incident,
            # every worker thread's health (a dead one also stops systemd's watchdog ping)
            "workers": self.workers(),
        }

    def _write_status(self, now: float) -> None:
        self._last_status = now
        if self.store is not None:
            try:
                self.store.set_meta(META_LAST_ALIVE, f"{now:.3f}")
            except SentinelError as exc:
                log.debug("could not save %s: %s", META_LAST_ALIVE, exc)
        if self.metrics is not None and self.alerts is not None:
            try:
                self.metrics.set_alerts_pending(self.alerts.outbox.counts()["pending"])
            except SentinelError as exc:
                log.debug("could not count the alert outbox: %s", exc)
        try:
            # `oom-sentinel status` prints it: a ComfyUI URL's token must not be there
            write_json_atomic(self.data_dir / STATUS_FILE, redact(self.status(now)))
        except OSError as exc:
            log.debug("could not write %s: %s", STATUS_FILE, exc)

    def _ping_watchdog(self, now: float) -> None:
        if self._watchdog_s is None or now - self._last_ping < self._watchdog_s * 0.9:
            return
        if self.healthy():
            self.notifier.watchdog()
            self._last_ping = now

    def workers(self) -> dict[str, bool]:
        """Liveness of every worker thread (the watchdog pings only when all are alive): the
        scheduler (memory sampling, discovery, retention), the alert sender, the API watcher,
        the process watcher, the install-state watcher and the metrics server. A worker that
        dies is logged once by name; the log follower needs none (the main loop polls it)."""
        alive = {
            "scheduler": self.scheduler is not None and self.scheduler.running,
            "alerts": self.alerts is not None and self.alerts.is_alive(),
            "api": self.comfy_watch is not None and self.comfy_watch.is_alive(),
            "process": self.process_watch is not None and self.process_watch.is_alive(),
        }
        if self.install_states is not None:
            alive["install-state"] = self.install_states.is_alive()
        if self.metrics is not None:
            alive["metrics"] = self.metrics.is_alive()
            for name, ok in alive.items():
                self.metrics.set_worker_alive(name, ok)
        for name, ok in alive.items():
            if not ok and name not in self._dead_workers:
                self._dead_workers.add(name)
                log.error(
                    "the %s worker is dead: systemd's watchdog is no longer pinged, so the "
                    "service is restarted",
                    name,
                )
            elif ok:
                self._dead_workers.discard(name)
        return alive

    def healthy(self) -> bool:
        """Every worker alive: only then is systemd's watchdog pinged."""
        return all(self.workers().values())

    def _on_sample(self, sample: MemorySample) -> None:
        if self.metrics is not None:
            watched = {i.pid: i.name for i in list(self.instances.values()) if i.pid}
            self.metrics.observe_sample(sample, watched=watched)

    # -- reload ---------------------------------------------------------------------------

    def request_reload(self) -> None:
        """From the SIGHUP handler (or the Windows service): reload on the loop's next turn."""
        self._reload_requested.set()
        self.wake()

    def reload(self) -> bool:
        """Re-read the config; a bad new config keeps the old one running and says why."""
        self.notifier.reloading()
        try:
            loaded = load_settings(self.loaded.source)
            channels = build_channels(loaded.settings, environ=self.environ)
        except SentinelError as exc:
            log.error("reload failed, keeping the previous configuration: %s", exc)
            if self.metrics is not None:
                self.metrics.set_config_reload(False)
            self.notifier.ready(self.summary())
            return False
        old, new = self.settings, loaded.settings
        restart_needed = [
            name
            for name in ("data_dir", "metrics", "gpu", "fleet")
            if getattr(old, name) != getattr(new, name)
        ]
        self.loaded, self.settings = loaded, new
        logging.getLogger().setLevel(new.log_level.upper())
        if self.alerts is not None:
            self.alerts.reconfigure(new, channels)
        self.tracker.config = TrackerConfig.from_settings(new.incidents)
        for inst in self._configured_instances():
            self._adopt(inst)
        for path in new.logs.extra:
            self._follow(path, instance=self._instance_for_extra_log(path))
        self._sync_watchers()
        if self.metrics is not None:
            self.metrics.set_config_reload(True)
        log.info(
            "configuration reloaded from %s%s",
            loaded.source or "built-in defaults",
            f"; {', '.join(restart_needed)} change(s) need a restart" if restart_needed else "",
        )
        self.notifier.ready(self.summary())
        return True

    # -- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        self.notifier.stopping()
        with contextlib.suppress(OSError):
            (self.data_dir / STATUS_FILE).unlink()
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                self.scheduler.shutdown(wait=False)
        if self.alerts is not None:
            self.alerts.stop(timeout_s=2.0)
        if self.metrics is not None:
            self.metrics.stop()
        if self.comfy_watch is not None:
            self.comfy_watch.stop()
        if self.process_watch is not None:
            self.process_watch.stop()
        if self.install_states is not None:
            self.install_states.close()
        if self.tails is not None:
            self.tails.close()
        if self.sampler is not None:
            self.sampler.gpu.close()
        if self.store is not None:
            self.store.close()
        self.notifier.close()


def run_service(
    loaded: LoadedSettings,
    *,
    stop: threading.Event,
    on_ready: Callable[[str], None] | None = None,
    event_sink: Callable[[Incident, SnapshotRef], None] | None = None,
    options: RunOptions | None = None,
    install_signals: bool = False,
) -> int:
    """Run the daemon until ``stop`` is set; the entry point of every front end (CLI,
    systemd, the Windows service). Returns the exit status.

    ``install_signals`` (the CLI, on the main thread): SIGTERM/SIGINT set ``stop`` and SIGHUP
    reloads the config."""
    service = Service(loaded, options, on_incident=event_sink)
    if install_signals:
        install_signal_handlers(stop, service.request_reload)
    try:
        summary = service.start()
        if on_ready is not None:
            on_ready(summary)

        def wake_on_stop() -> None:
            stop.wait()
            service.wake()

        waker = threading.Thread(target=wake_on_stop, name="stop-waker", daemon=True)
        waker.start()
        service.run(stop)
    finally:
        service.close()
    return 0


def install_signal_handlers(
    stop: threading.Event, reload: Callable[[], None] | None = None
) -> None:
    """SIGTERM/SIGINT stop the loop (within one tick); SIGHUP asks for a config reload."""

    def handler(signum: int, frame: Any) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if reload is not None and hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda signum, frame: reload())


def configure_logging(level: str, environ: Mapping[str, str] | None = None) -> None:
    """Plain lines on stderr; under journald, ``<N>`` priority prefixes instead of times."""
    env = os.environ if environ is None else environ
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    if env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"):
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    # APScheduler logs every job run at INFO
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


_SYSLOG_PRIORITY = {"CRITICAL": 2, "ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}


class _RedactingFormatter(logging.Formatter):
    """Every daemon log line passes ``redact_text``: a ComfyUI URL's ``?token=``, an apprise
    URL or a token in an error message is masked whichever module logged it."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class _JournalFormatter(_RedactingFormatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prio = _SYSLOG_PRIORITY.get(record.levelname, 6)
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines())

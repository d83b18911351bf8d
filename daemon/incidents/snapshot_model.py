"""The typed ``snapshot.json``: the contract between the daemon, which writes it, and
``oom-bisect``, ``snapshots show`` and the restart recovery, which read it.

One definition of the document: the writer (``snapshot.build_snapshot``) builds these models
and dumps them, the readers validate the file into them, and ``snapshot.schema.json`` (shipped
next to this module for other tools) is generated from them (``snapshot_json_schema``;
``scripts/snapshot_schema.py`` rewrites the file, a test fails when it is stale).

What the models promise:

* the parts the daemon defines itself (incident, instance, memory, advice, files) are closed:
  an unknown key is an error, so a typo in the writer cannot ship;
* the parts other modules or later versions extend (the classifier's event, host facts, the
  ``process``/``kernel``/``system_stats``/``internal_logs`` sections, install states, the
  regression verdict) are open: unknown keys are kept as they are, and only the fields some
  reader relies on are typed;
* JSON types are strict (no ``"3"`` for 3, no ``true`` for 1), as the schema says;
* a field a newer writer added and an older snapshot lacks has a default; dumping with
  ``exclude_unset=True`` writes back only what was there, so the on-disk shape is unchanged.

Import cost: pydantic is already loaded at daemon start by ``config/settings.py``; this module
adds the model classes only (see ``benchmarks/snapshot_io.py`` for the read/write figures).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticUseDefault

from oom_sentinel.daemon.core.errors import InputError

if TYPE_CHECKING:
    from oom_sentinel.daemon.install.state import InstallState

__all__ = [
    "SCHEMA_FILE",
    "SCHEMA_VERSION",
    "AdviceEntry",
    "Attribution",
    "Budget",
    "EventModel",
    "FilesSection",
    "GpuEntry",
    "GpuProcessEntry",
    "HostMemory",
    "HostSection",
    "IncidentSection",
    "InstallStateSection",
    "InstanceSection",
    "LaterSection",
    "MemorySection",
    "ObservationEntry",
    "ProcessSection",
    "ProcessTreeEntry",
    "RecordEntry",
    "RegressionSection",
    "SnapshotDoc",
    "SnapshotHead",
    "SnapshotRecords",
    "flags_from_argv",
    "parse_snapshot_doc",
    "schema_text",
    "snapshot_json_schema",
    "validation_problem",
]

#: the ``schema_version`` this code writes and the newest it reads
SCHEMA_VERSION: Final = 1
SCHEMA_FILE = Path(__file__).parent / "snapshot.schema.json"

TIME_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z$"
ID_PATTERN = r"^[0-9]{8}T[0-9]{6}Z_[A-Za-z0-9._+-]+$"

#: UTC ISO 8601 with a ``Z``: ``2026-01-02T10:11:12.345Z``
Time = Annotated[str, Field(pattern=TIME_PATTERN)]
#: a size in bytes; null when unknown, never 0 for unknown
Bytes = Annotated[int, Field(ge=0)] | None

Pool = Literal["gpu", "gpu-fragmentation", "ram", "swap-pagefile", "unified-mps", "killed-by-os"]
Backend = Literal["cuda", "rocm", "mps", "xpu", "directml", "cpu", "unknown"]


class _Closed(BaseModel):
    """A part the daemon defines: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Open(BaseModel):
    """A part others extend: unknown keys are kept as written."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


# --- incident, instance, observations -------------------------------------------------------


class RecordEntry(_Open):
    """A source record (a log record) the incident had counted when the snapshot was written,
    with the failure it counts towards; a restart that finds the snapshot without its store
    row restores them, so none is counted twice."""

    id: str
    failure: Annotated[int, Field(ge=1)]
    source: str = ""
    rule: str = ""
    at_s: float = 0.0
    prompt_id: str | None = None


class IncidentSection(_Closed):
    """The incident as it stood when the snapshot was written; later storm repeats update only
    the store row."""

    id: Annotated[str, Field(min_length=1)]
    fingerprint: str
    first_seen: Time
    last_seen: Time
    count: Annotated[int, Field(ge=1)]
    #: absent in snapshots written before records were kept (and when there were none)
    records: list[RecordEntry] = []


class InstanceSection(_Closed):
    """The ComfyUI instance the incident happened on (path: its install; url: its API)."""

    name: str
    path: str | None
    url: str | None


class OtherProcessEntry(_Open):
    pid: int
    bytes: Bytes


class EventModel(_Open):
    """The classifier's OomEvent (``OomEvent.to_json()``); new fields may be added."""

    pool: Pool
    backend: Backend
    recovered: bool
    message: str
    exception_type: str | None = None
    node_type: str | None = None
    node_id: str | None = None
    gpu_index: int | None = None
    requested_bytes: Bytes = None
    total_bytes: Bytes = None
    free_bytes: Bytes = None
    allocated_bytes: Bytes = None
    reserved_unallocated_bytes: Bytes = None
    reserved_bytes: Bytes = None
    process_used_bytes: Bytes = None
    other_processes: list[OtherProcessEntry] = []
    #: the error named another process that held memory (its pid may be unknown)
    other_process_named: bool = False
    mps_allocated_bytes: Bytes = None
    mps_other_bytes: Bytes = None
    mps_max_allowed_bytes: Bytes = None
    killer: str | None = None
    killed_pid: int | None = None
    rule: str = ""
    count: Annotated[int, Field(ge=1)] = 1
    extra: dict[str, Any] = {}


class ObservationEntry(_Closed):
    """One source's record of the failure; ``event`` at the top merges them."""

    source: str
    at: Time
    event: EventModel
    evidence: dict[str, Any]


class AdviceEntry(_Closed):
    """One ranked suggestion: ``key`` is stable (e.g. "expandable-segments"), ``text`` is for
    people."""

    key: str
    text: str


# --- memory ---------------------------------------------------------------------------------


class GpuEntry(_Closed):
    index: int
    name: str
    uuid: str | None = None
    total_bytes: Bytes
    used_bytes: Bytes
    free_bytes: Bytes
    reserved_bytes: Bytes = None


class GpuProcessEntry(_Closed):
    pid: int
    device_index: int
    used_bytes: Bytes
    name: str | None
    cmdline: list[str] | None
    watched: bool = Field(default=False, description="part of a watched ComfyUI process tree")


class HostMemory(_Closed):
    ram_total_bytes: Bytes
    ram_available_bytes: Bytes
    swap_total_bytes: Bytes
    swap_used_bytes: Bytes
    commit_limit_bytes: Bytes = None
    committed_bytes: Bytes = None


class ProcessTreeEntry(_Closed):
    root_pid: int
    rss_bytes: Bytes
    peak_rss_bytes: Bytes = None


class MemorySection(_Closed):
    """The memory sample nearest the incident."""

    time: Time
    gpus: list[GpuEntry]
    gpu_processes: list[GpuProcessEntry]
    host: HostMemory | None
    process_trees: list[ProcessTreeEntry]


class HostSection(_Open):
    """Facts about the machine; later versions add driver and CUDA versions."""

    hostname: str
    os: str
    os_release: str
    kernel: str
    python: str
    cpu_count: int | None
    version: str


class FilesSection(_Closed):
    """The other files of the snapshot directory (null: not captured)."""

    log: Literal["log.txt"]
    timeline: Literal["timeline.csv"]
    prompt: Literal["prompt.json"] | None
    workflow: Literal["workflow.json"] | None


# --- optional sections ----------------------------------------------------------------------


class ProcessSection(_Open):
    """The ComfyUI process (``process_watch.process_section``): pid, argv, interpreter,
    executable, script, code_dir, install_dir, cwd, url, pytorch_cuda_alloc_conf,
    cuda_visible_devices, flags (the parsed launch flags), alive, exit, other_gpu_processes,
    other_instances, second_instance, conflicts. pid is null when the process was not
    found. Typed here: what ``oom-bisect`` replays it with."""

    pid: int | None = None
    argv: list[str] | None = None
    interpreter: str | None = None
    #: the parsed launch flags (an object); a word list in snapshots of early versions
    flags: dict[str, Any] | list[str] | None = None

    def flag_words(self) -> tuple[str, ...] | None:
        """The launch flags as words: those after ``main.py`` in ``argv``, else a recorded word
        list; None when the snapshot holds neither."""
        if self.argv is not None:
            return flags_from_argv(self.argv)
        if isinstance(self.flags, list):
            return tuple(self.flags)
        return None


def flags_from_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """The words after ``main.py`` in a recorded command line (none when it has no main.py)."""
    for i, word in enumerate(argv):
        if word.replace("\\", "/").rsplit("/", 1)[-1] == "main.py":
            return tuple(argv[i + 1 :])
    return ()


class LaterSection(_Open):
    """A section whose shape its writer owns (``kernel``: process_watch.kernel_section;
    ``system_stats``: ComfyUI's GET /system_stats; ``internal_logs``: the tail of GET
    /internal/logs). No reader depends on a field of it."""


class CoreEntry(_Open):
    commit: str | None


class NodeEntry(_Open):
    name: str
    kind: Literal["git", "cnr", "file", "folder"]
    disabled: bool


class InterpreterEntry(_Open):
    """What the interpreter said about itself (``InterpreterFacts.to_dict()``)."""

    executable: str | None = None


class Attribution(_Open):
    """How the failing prompt was attributed to this state (``state_history.attribute_run``):
    by the capture taken when its process started, the state in effect at the process or
    prompt start, or the current one; ambiguous when another state was in effect within the
    tolerance of the start (the later one is used)."""

    by: Literal["restart-capture", "process-start", "prompt-start", "current"]
    ambiguous: bool
    other_state_id: str | None
    other_observed_at: str | None
    reason: str


class InstallStateSection(_Open):
    """``install_state.InstallState.to_dict()``; in the ``install_state`` section also
    observed_at/observed_source (which capture or reflog entry it comes from) and the
    attribution. ``to_install_state`` rebuilds the record (its own checks name the field)."""

    format: Literal["oom-sentinel/install-state"]
    format_version: int
    state_id: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    source: str | None = None
    root: str | None = None
    captured_at_epoch_s: float | None = None
    comfyui: CoreEntry
    nodes: list[NodeEntry]
    pip: list[str] | None
    interpreter: InterpreterEntry | None
    observed_at: Time | None = None
    observed_source: str | None = Field(default=None, description="capture | reflog | manager")
    attribution: Attribution | None = None

    def to_install_state(self, where: str) -> InstallState:
        """The ``InstallState`` this section records (imported here: writing and listing
        snapshots need none of install_state's git and subprocess code)."""
        from oom_sentinel.daemon.install.state import InstallState

        return InstallState.from_dict(self.model_dump(mode="json", exclude_unset=True), where)


class LastGoodRun(_Open):
    prompt_id: str
    instance: str
    finished: Time | None
    state_id: str | None
    peak_vram_bytes: Bytes
    peak_ram_bytes: Bytes = Field(description="peak RSS of ComfyUI's process tree")
    peak_gpu_used_bytes: Bytes = Field(description="peak use of the whole GPU(s) it ran on")


class Budget(_Open):
    """An explicit memory threshold for ``oom-bisect`` (no writer in the daemon yet: a user
    or a farm may add it); 0 or null means none for that pool."""

    vram_bytes: Bytes = None
    ram_bytes: Bytes = None


class RegressionSection(_Open):
    """Whether this OOM is a suspected regression: the same workflow (match 'workflow') or,
    failing that, any workflow on this instance (match 'instance') succeeded under an
    earlier, different install state. suspected=false carries the reason."""

    suspected: bool
    reason: str = Field(description="one sentence: why suspected, or why not")
    match: Literal["workflow", "instance"] | None
    fingerprint: str | None
    bad_state_id: str | None
    last_good_state_id: str | None
    last_good_run: LastGoodRun | None
    diff: dict[str, Any] | None = Field(
        description="state_diff.StateDiff.to_dict() from last_good_state to bad_state; null "
        "unless suspected"
    )
    diff_summary: list[str]
    bisect_command: str | None = Field(
        description="'oom-bisect <this snapshot id>' when suspected, else null"
    )
    last_good_state: InstallStateSection | None = Field(
        description="the state the last good run ran under: oom-bisect's good endpoint"
    )
    bad_state: InstallStateSection | None = Field(
        description="the state the failing prompt ran under: oom-bisect's bad endpoint"
    )
    budget: Budget | None = None


# --- the document ---------------------------------------------------------------------------


class SnapshotDoc(_Closed):
    """One out-of-memory incident as recorded by oom-sentinel. Sizes are bytes; times are UTC
    ISO 8601. Unknown values are null, never 0. The optional sections are absent when the
    daemon had nothing for them."""

    schema_version: Literal[1]
    id: Annotated[str, Field(pattern=ID_PATTERN)]
    created: Time
    incident: IncidentSection
    instance: InstanceSection
    summary: str
    event: EventModel
    observations: list[ObservationEntry] = Field(
        description="Every source's record of the failure, in arrival order; 'event' merges them."
    )
    sources: list[str]
    advice: list[AdviceEntry] = Field(description="Ranked: the first item is the one to try first.")
    memory: MemorySection | None
    host: HostSection
    files: FilesSection
    process: ProcessSection | None = None
    kernel: LaterSection | None = None
    install_state: InstallStateSection | None = None
    regression: RegressionSection | None = None
    system_stats: LaterSection | None = None
    internal_logs: LaterSection | None = None
    dropped_sections: dict[str, str] = Field(
        default={},
        description="Optional sections the writer had that did not match their model, left "
        "out so the incident is still recorded: name -> the problem. Absent when none was.",
    )


def _or_default(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A listing's field that does not read as its type reads as unknown: one odd value must
    not hide a snapshot from ``snapshots list`` or the restart recovery."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticUseDefault() from None


_Lenient = WrapValidator(_or_default)
_AnyStr = Annotated[str | None, _Lenient]


class _HeadEvent(_Open):
    pool: _AnyStr = None
    backend: _AnyStr = None
    node_type: _AnyStr = None
    exception_type: _AnyStr = None


class _HeadInstance(_Open):
    name: Annotated[str, _Lenient] = ""
    path: _AnyStr = None


class _HeadIncident(_Open):
    count: Annotated[int | None, _Lenient] = None


class _HeadRegression(_Open):
    suspected: Annotated[bool, _Lenient] = False


class SnapshotHead(_Open):
    """What a listing needs, checked without the whole document: ``snapshots list``,
    ``doctor`` and the restart recovery read the newest hundreds, and one snapshot a later
    version wrote differently must not hide the others (``SnapshotDoc`` is the full check)."""

    schema_version: int
    created: str
    event: _HeadEvent
    instance: _HeadInstance
    summary: str
    incident: Annotated[_HeadIncident | None, _Lenient] = None
    regression: Annotated[_HeadRegression | None, _Lenient] = None


class _RawRecords(_Open):
    records: list[Any] = []


class SnapshotRecords(_Open):
    """Only the incident's records, unchecked: ``snapshot.snapshot_records`` checks each as a
    ``RecordEntry`` on its own, so one bad record does not lose the others."""

    incident: _RawRecords = _RawRecords()


# --- errors and the schema ------------------------------------------------------------------


def validation_problem(exc: ValidationError, within: str | None = None) -> str:
    """The first error of ``exc`` (the first under the top-level field ``within`` when given)
    as one line: the field's path and what is wrong with it (``event.pool: input should be
    'gpu', ... (got 'vram')``)."""
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if within is None or e["loc"][:1] == (within,)), errors[0])
    where = ""
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    message = " ".join(str(err["msg"]).split())
    message = message[:1].lower() + message[1:]
    if err["type"] not in ("missing", "extra_forbidden") and "input" in err:
        shown = json.dumps(err["input"], default=str)
        message += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{where or '(top level)'}: {message}"


def parse_snapshot_doc(data: Any, where: str) -> SnapshotDoc:
    """``data`` as a ``SnapshotDoc``; ``InputError`` "<where>: <field>: <problem>" if it is
    not one."""
    try:
        return SnapshotDoc.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{where}: {validation_problem(exc)}") from None


class _Schema(GenerateJsonSchema):
    """Pydantic's schema without a title on every property (the names say it), and each
    description (a docstring) on one line."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: Any, mode: Any = "validation") -> Any:
        return _one_line_descriptions(super().generate(schema, mode))


def _one_line_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: " ".join(v.split())
            if k == "description" and isinstance(v, str)
            else _one_line_descriptions(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_one_line_descriptions(v) for v in node]
    return node


def snapshot_json_schema() -> dict[str, Any]:
    """The JSON Schema of ``snapshot.json`` (what ``snapshot.schema.json`` ships)."""
    body = SnapshotDoc.model_json_schema(schema_generator=_Schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:oom-sentinel:snapshot-schema:{SCHEMA_VERSION}",
        "title": "oom-sentinel crash snapshot (snapshot.json)",
        **{k: v for k, v in body.items() if k != "title"},
    }


def schema_text() -> str:
    """``snapshot_json_schema()`` as the shipped file holds it."""
    return json.dumps(snapshot_json_schema(), indent=2, ensure_ascii=False) + "\n"

"""The typed ``report.json``: what ``oom-bisect`` writes when it finishes (bisect/session/report.py)
and the daemon reads back from a snapshot (``bisect_results.py``: ``snapshots show`` names the
culprits, the outbox sends one follow-up alert).

It lives on the daemon's side because the daemon never imports the bisect, and the bisect
may import the daemon: one definition for both ends. The bisect validates its report into
``BisectReport`` before writing it (a field of the wrong type fails in its tests, not in a
user's ``snapshots show``); the daemon validates what it reads.

Every field has a default: a report of an older or newer bisect, or one that stopped early,
lacks some. The parts only the bisect's own pages draw (steps, runs, the chart, the search
figures) are kept as written and typed loosely; the parts the daemon shows are typed.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["REPORT_FORMAT", "BisectReport", "CulpritDelta", "ReportCulpritEntry", "ReportRepo"]

#: ``format`` of the report this code writes
REPORT_FORMAT: Final = 1


class _Open(BaseModel):
    """Unknown keys are kept as written (a newer bisect adds some); JSON types are strict."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class CulpritDelta(_Open):
    """The culprit's own rise in peak against its parent state (``report.culprit_delta``):
    the headline pool's figures, and each measured pool's under ``pools``."""

    pool: Literal["vram", "ram"]
    parent_bytes: int | None = None
    bytes: int | None = None
    delta_bytes: int
    #: the culprit's run stopped early (an OOM, the threshold): its peak is a lower bound
    lower_bound: bool = False
    pools: dict[str, dict[str, Any]] = {}


class ReportCulpritEntry(_Open):
    """One culprit (or, under ``candidates``, one untested candidate) with what git knows."""

    repo: str | None = None
    label: str | None = None
    #: the value the repo took in the culprit's state: a commit, a version, "disabled" …
    commit: str | None = None
    previous: str | None = None
    subject: str | None = None
    author: str | None = None
    date: str | None = None
    files: list[str] = []
    url: str | None = None
    together: list[str] = []
    delta: CulpritDelta | None = None
    #: the report's own line for the delta (the daemon shows it as written)
    delta_text: str | None = None
    nodes: list[dict[str, Any]] = []
    #: the nodes whose peak rose, in words (bisect/measure/node_peaks.py)
    nodes_text: str | None = None
    allocator_history: dict[str, Any] | None = None
    history_text: str | None = None
    nodes_chart: dict[str, Any] | None = None


class ReportRepo(_Open):
    """One repo the bisect searched: its good and bad values and the candidates between."""

    repo: str
    label: str
    good: str
    bad: str
    candidates: int


class BisectReport(_Open):
    """``report.json``: the whole record of one bisect (``report.build_report``)."""

    format: int = REPORT_FORMAT
    tool: Literal["oom-bisect"] = "oom-bisect"
    generated: str | None = None
    install: str | None = None
    source: str | None = None
    #: found | ambiguous | not-reproduced | error | in-progress
    result: str = "unknown"
    message: str | None = None
    terms: dict[str, str] = {}
    threshold: dict[str, int | None] | None = None
    explicit_budget: bool = False
    pool: str = "any"
    repeat: int | Literal["auto"] = 1
    max_repeat: int | None = None
    rechecks: list[dict[str, Any]] = []
    runs_per_state: int = 1
    leak_variation: str | None = None
    workflow_sha256: str | None = None
    flags: list[str] = []
    repos: list[ReportRepo] = []
    culprits: list[ReportCulpritEntry] = []
    candidates: list[ReportCulpritEntry] = []
    search: dict[str, Any] | None = None
    chart: Any = None
    #: runs measured (not counting launches)
    measurements: int | None = None
    launches: int | None = None
    steps: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    #: the state to test next while the bisect is in progress
    next: dict[str, str] | None = None

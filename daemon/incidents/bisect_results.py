"""The answer to a snapshot's question: the ``oom-bisect`` reports attached to it.

``oom-bisect SNAPSHOT_ID`` writes its report into the snapshot when it finishes (``bisect/``,
then ``bisect-2/`` … for later runs; each folder appears whole, by one rename). This module is
the daemon's side of that: it reads the reports (``snapshots show`` names the culprits first,
``snapshots export`` ships them), and ``ReportWatch`` notices a new one so the alert outbox can
send one follow-up alert for it.

The daemon never imports the bisect: ``report.json`` is read into ``BisectReport``
(``bisect_report_model.py``, the model the bisect writes it from), where every field may be
missing (an older or newer bisect wrote it).

How the daemon learns of a finished bisect: attaching a report creates a folder in the snapshot
directory, which changes that directory's mtime. ``ReportWatch.scan`` lists the snapshots
directory (one ``scandir``) and looks inside only the snapshots whose mtime moved since the
last scan -- a few stat calls every ``SCAN_INTERVAL_S`` when nothing happens. A report is news
once: its alert key (``followup_key``) is looked up in the outbox before queueing, so a
restart that rescans everything queues nothing twice, and reports older than ``MAX_AGE_S``
(well inside the outbox's 30-day retention) are never news.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from oom_sentinel.daemon.alerts.policy import Alert, AlertKind, Severity
from oom_sentinel.daemon.core.redact import redact_text
from oom_sentinel.daemon.core.units import format_bytes
from oom_sentinel.daemon.incidents.bisect_report_model import BisectReport, ReportCulpritEntry

__all__ = [
    "FINAL_RESULTS",
    "AttachedReport",
    "ReportCulprit",
    "ReportWatch",
    "attached_reports",
    "followup_alert",
    "followup_key",
    "latest_report",
]

_FOLDER = re.compile(r"^bisect(?:-(\d+))?$")
#: results of a finished bisect that answer the question (an error answers nothing)
FINAL_RESULTS = frozenset({"found", "ambiguous", "not-reproduced"})
#: how often the daemon looks for new reports
SCAN_INTERVAL_S = 30.0
#: a report older than this when first seen is not news any more
MAX_AGE_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class ReportCulprit:
    label: str
    commit: str
    subject: str | None
    #: how much the change raised the peak, in words ("+1.52 GB"), when the report says
    delta: str | None = None
    #: the nodes where its memory rose, in words (``nodes_text``: "ImageScaleBy #2: 1.11 GiB →
    #: 1.86 GiB RAM"), when the report says
    nodes: str | None = None

    def line(self) -> str:
        commit = self.commit[:10] if re.match(r"^[0-9a-f]{40,64}$", self.commit) else self.commit
        text = f"{self.label} {commit}"
        if self.subject:
            text += f' "{self.subject}"'
        if self.delta:
            text += f" ({self.delta})"
        if self.nodes:
            text += f"; nodes: {self.nodes}"
        return text


@dataclass(frozen=True, slots=True)
class AttachedReport:
    """One attached ``bisect*/report.json``, the parts a user is told first."""

    folder: str
    path: Path
    result: str
    culprits: tuple[ReportCulprit, ...]
    message: str | None
    measurements: int | None
    mtime_s: float

    @property
    def html(self) -> Path | None:
        page = self.path / "report.html"
        return page if page.is_file() else None

    @property
    def finished(self) -> bool:
        return self.result in FINAL_RESULTS

    def headline(self) -> str:
        if self.result == "found" and self.culprits:
            n = len(self.culprits)
            return (
                f"oom-bisect found the change{'s' if n != 1 else ''} that made it run out of "
                "memory:"
            )
        if self.result == "ambiguous":
            return "oom-bisect narrowed it down but could not test every candidate:"
        if self.result == "not-reproduced":
            return "oom-bisect could not reproduce it: the good and the bad state behaved the same."
        return f"oom-bisect ended: {self.result}."

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "path": str(self.path),
            "result": self.result,
            "culprits": [
                {
                    "label": c.label,
                    "commit": c.commit,
                    "subject": c.subject,
                    "delta": c.delta,
                    "nodes": c.nodes,
                }
                for c in self.culprits
            ],
            "message": self.message,
            "measurements": self.measurements,
        }


def _text(value: str | None) -> str | None:
    return (value.strip() or None) if value is not None else None


def _delta(c: ReportCulpritEntry) -> str | None:
    """The culprit's own rise in peak: the report's own line (``delta_text``, written by
    ``oom_sentinel.bisect.session.report``), else the bytes of its ``delta`` object."""
    text = _text(c.delta_text)
    if text:
        return text
    if c.delta is None:
        return None
    value = c.delta.delta_bytes
    return f"{'+' if value >= 0 else '-'}{format_bytes(abs(value))}"


def _read(folder: Path) -> AttachedReport | None:
    """The report in ``folder``; None when it is missing or not a report this daemon reads
    (corrupt, or a field of another type than ``BisectReport`` says)."""
    page = folder / "report.json"
    try:
        mtime = page.stat().st_mtime
        doc = BisectReport.model_validate_json(page.read_bytes())
    except (OSError, ValidationError):
        return None
    culprits = tuple(
        ReportCulprit(
            _text(c.label) or _text(c.repo) or "?",
            _text(c.commit) or "?",
            _text(c.subject),
            _delta(c),
            _text(c.nodes_text),
        )
        for c in doc.culprits
    )
    return AttachedReport(
        folder=folder.name,
        path=folder,
        result=_text(doc.result) or "unknown",
        culprits=culprits,
        message=_text(doc.message),
        measurements=doc.measurements,
        mtime_s=mtime,
    )


def attached_reports(snapshot_dir: Path) -> list[AttachedReport]:
    """Every readable report attached to the snapshot, in the order they were attached."""
    found: list[tuple[int, Path]] = []
    try:
        names = os.listdir(snapshot_dir)
    except OSError:
        return []
    for name in names:
        m = _FOLDER.match(name)
        if m:
            found.append((int(m.group(1) or 1), snapshot_dir / name))
    out = []
    for _n, folder in sorted(found):
        report = _read(folder)
        if report is not None:
            out.append(report)
    return out


def latest_report(snapshot_dir: Path) -> AttachedReport | None:
    """The last finished report (else the last one of any result), or None."""
    reports = attached_reports(snapshot_dir)
    best = [r for r in reports if r.finished] or reports
    return best[-1] if best else None


def followup_key(snapshot_id: str, report: AttachedReport) -> str:
    return f"bisect-result:{snapshot_id}/{report.folder}"


def followup_alert(
    snapshot_id: str, snapshot_path: Path, report: AttachedReport, now: float
) -> Alert:
    """The one follow-up alert a finished bisect of a snapshot sends."""
    if report.result == "found" and report.culprits:
        names = ", ".join(c.label for c in report.culprits[:3])
        more = f" and {len(report.culprits) - 3} more" if len(report.culprits) > 3 else ""
        title = f"Culprit found for {snapshot_id}: {names}{more}"
        severity = Severity.WARNING
    else:
        title = f"Bisect of {snapshot_id} finished: {report.result}"
        severity = Severity.INFO
    lines = [report.headline()]
    lines += [f"  {c.line()}" for c in report.culprits]
    if report.message and not report.culprits:
        lines.append(f"  {report.message}")
    if report.measurements is not None:
        lines.append(f"Measurements: {report.measurements}")
    lines.append(f"Report: {report.html or report.path / 'report.json'}")
    lines.append(f"Read it: oom-sentinel snapshots show {snapshot_id}")
    return Alert(
        key=followup_key(snapshot_id, report),
        kind=str(AlertKind.BISECT_RESULT),
        severity=str(severity),
        title=redact_text(title),
        body=redact_text("\n".join(lines)),
        created_s=now,
        group=f"bisect:{snapshot_id}",
        snapshot_id=snapshot_id,
        snapshot_path=str(snapshot_path),
    )


class ReportWatch:
    """Notices reports attached since the last scan (see the module docstring). Not
    thread-safe: the daemon's main loop owns it."""

    def __init__(
        self,
        snapshots_dir: Path,
        *,
        interval_s: float = SCAN_INTERVAL_S,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.snapshots_dir = snapshots_dir
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self._mtimes: dict[str, float] = {}
        self._next_s = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_s

    def scan(
        self, now: float, known: Callable[[str], bool]
    ) -> list[tuple[str, Path, AttachedReport]]:
        """(snapshot id, its folder, report) for every finished report that is news: attached
        within ``max_age_s`` and whose follow-up key ``known`` does not know yet."""
        self._next_s = now + self.interval_s
        try:
            entries = list(os.scandir(self.snapshots_dir))
        except OSError:
            return []
        news: list[tuple[str, Path, AttachedReport]] = []
        seen: dict[str, float] = {}
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            seen[entry.name] = mtime
            if self._mtimes.get(entry.name) == mtime:
                continue
            for report in attached_reports(Path(entry.path)):
                if not report.finished or now - report.mtime_s > self.max_age_s:
                    continue
                if not known(followup_key(entry.name, report)):
                    news.append((entry.name, Path(entry.path), report))
        self._mtimes = seen
        return news

"""The shipped Grafana dashboard: every query's selectors match series the real exporter
served (scraped over HTTP, with the target labels the README's scrape config adds), every
``by (...)`` label and legend label exists on them, and the JSON is a dashboard Grafana
imports (panels with ids, positions, a datasource variable)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import snapshot_samples as samples
from click.testing import CliRunner
from prom_series import ScrapeRecorder

from oom_sentinel.config.settings import MetricsSettings
from oom_sentinel.daemon.alerts.notifiers import SendResult
from oom_sentinel.daemon.cli.fleet import DASHBOARD_FILE
from oom_sentinel.daemon.cli.main import main
from oom_sentinel.daemon.fleet.metrics import MetricsExporter

GIB = 1024**3
#: what a person picks in the dashboard's variables, and Grafana's built-in intervals
VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "1h",
    "$host": "gpu-01",
    "$instance": "main",
}
KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan",
}  # fmt: skip
Series = Mapping[str, str]


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]

    def matches(self, labels: Series) -> bool:
        for label, op, value in self.matchers:
            have = labels.get(label, "")
            ok = {
                "=": have == value,
                "!=": have != value,
                "=~": re.fullmatch(value, have) is not None,
                "!~": re.fullmatch(value, have) is None,
            }[op]
            if not ok:
                return False
        return True


_STRING = re.compile(r'"((?:\\.|[^"\\])*)"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"\x00(\d+)\x00"\s*,?')
#: a name that is not a function call, with the {#N} its matchers were replaced by
_IDENT = re.compile(r"(?<![\w$#])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()(\s*\{#\d+\})?")


def parse_query(expr: str) -> tuple[list[Selector], set[str]]:
    """A PromQL expression's series selectors, and the labels its grouping clauses name."""
    strings: list[str] = []

    def keep(m: re.Match[str]) -> str:
        strings.append(m.group(1).replace('\\"', '"').replace("\\\\", "\\"))
        return f'"\x00{len(strings) - 1}\x00"'

    text = _STRING.sub(keep, expr)
    grouped: set[str] = set()
    for m in _GROUPING.finditer(text):
        grouped |= {label.strip() for label in m.group(2).split(",") if label.strip()}
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    braces: list[tuple[tuple[str, str, str], ...]] = []

    def brace(m: re.Match[str]) -> str:
        body, matchers, pos = m.group(1), [], 0
        while pos < len(body.strip()):
            found = _MATCHER.match(body, pos)
            assert found, f"cannot read the label matchers {{{body}}} in {expr!r}"
            matchers.append((found.group(1), found.group(2), strings[int(found.group(3))]))
            pos = found.end()
        braces.append(tuple(matchers))
        return f"{{#{len(braces) - 1}}}"

    text = re.sub(r"\{([^}]*)\}", brace, text)
    selectors = []
    for m in _IDENT.finditer(text):
        name = m.group(1)
        if name in KEYWORDS:
            continue
        ref = m.group(2)
        matchers = braces[int(ref.strip()[2:-1])] if ref else ()
        selectors.append(Selector(name, matchers))
    assert selectors, f"no series selector in {expr!r}"
    return selectors, grouped


def _queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, expr, legend format) for every panel target and query variable."""

    def walk(panels: list[Any]) -> Iterator[tuple[str, str, str]]:
        for panel in panels:
            yield from walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                yield panel["title"], target["expr"], target.get("legendFormat", "")

    yield from walk(dashboard["panels"])
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"]["query"])
            assert m, var
            yield f"${var['name']}", m.group(1), "{{" + m.group(2) + "}}"


def _substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown dashboard variable in {expr!r}"
    return expr


@pytest.fixture(scope="module")
def served() -> list[Series]:
    """One scrape of an exporter that has seen everything the daemon reports."""
    exporter = MetricsExporter(MetricsSettings(listen="127.0.0.1:0"), version="9.9")
    incident = samples.incident()
    exporter.observe_sample(samples.memory(), watched={4242: "main"})
    exporter.observe_incident(incident)
    exporter.observe_snapshot(incident, "20260102T101112Z_gpu_KSampler")
    exporter.observe_soft_oom("main")
    exporter.observe_prompt(
        "main", "success", peak_vram_bytes=14 * GIB, peak_ram_bytes=9 * GIB, duration_s=42.0
    )
    exporter.set_worker_alive("sampler", True)
    exporter.observe_alert_result(SendResult("apprise:abc", "json://…", True, "sent"))
    exporter.observe_alert_result(SendResult("apprise:abc", "json://…", False, "500"))
    exporter.set_alerts_pending(0)
    host, port = exporter.start()
    recorder = ScrapeRecorder(
        f"http://{host}:{port}/metrics", job="oom-sentinel", host="gpu-01", port=9866
    )
    try:
        assert recorder.scrape()
    finally:
        exporter.stop()
    out = []
    for entry in recorder.input_series():
        name, _, rest = entry["series"].partition("{")
        labels = dict(re.findall(r'([a-zA-Z_]\w*)="((?:\\.|[^"\\])*)"', rest))
        out.append({"__name__": name, **labels})
    return out


def _matching(selector: Selector, served: list[Series]) -> list[Series]:
    return [s for s in served if s["__name__"] == selector.name and selector.matches(s)]


def check_query(expr: str, legend: str, served: list[Series]) -> list[str]:
    """What is wrong with one query (empty: every series it names is served)."""
    problems = []
    selectors, grouped = parse_query(_substitute(expr))
    matched: list[Series] = []
    for selector in selectors:
        found = _matching(selector, served)
        if not found:
            problems.append(f"no served series matches {selector.name}{list(selector.matchers)}")
        matched += found
    have = {label for s in matched for label in s}
    for label in sorted(grouped - have):
        problems.append(f"by/on label {label!r} is on none of its series")
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
        if label not in have:
            problems.append(f"legend label {label!r} is on none of its series")
    return problems


def test_every_query_matches_served_series(served: list[Series]) -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text("utf-8"))
    queries = list(_queries(dashboard))
    assert len(queries) >= 20
    problems = {
        f"{where}: {expr}": found
        for where, expr, legend in queries
        if (found := check_query(expr, legend, served))
    }
    assert problems == {}


def test_the_check_catches_a_series_the_exporter_does_not_serve(served: list[Series]) -> None:
    assert check_query("rate(oom_sentinel_nope_total[5m])", "", served) == [
        "no served series matches oom_sentinel_nope_total[]"
    ]
    assert check_query('oom_sentinel_soft_ooms_total{instance="other"}', "", served) != []
    assert check_query(
        "sum by (host, pid) (oom_sentinel_gpu_process_memory_bytes)", "", served
    ) == ["by/on label 'pid' is on none of its series"]
    assert check_query("oom_sentinel_comfyui_rss_bytes", "{{prompt_id}}", served) == [
        "legend label 'prompt_id' is on none of its series"
    ]


def test_the_parser_reads_selectors_and_grouping() -> None:
    selectors, grouped = parse_query(
        'histogram_quantile(0.95, sum by (host, le) (rate(a_bucket{job="x", host=~"g.*"}[5m])))'
        ' / on (host) group_left (gpu) b{c!="1"} offset 5m'
    )
    assert selectors == [
        Selector("a_bucket", (("job", "=", "x"), ("host", "=~", "g.*"))),
        Selector("b", (("c", "!=", "1"),)),
    ]
    assert grouped == {"host", "le", "gpu"}


def test_the_dashboard_covers_the_issue_and_imports() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text("utf-8"))
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "host", "instance"} <= names
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    text = " ".join(expr for _, expr, _ in _queries(dashboard))
    for needed in (
        "oom_sentinel_gpu_memory_used_bytes",  # memory per GPU
        "oom_sentinel_gpu_process_memory_bytes",  # ... and process
        "oom_sentinel_incidents_total",  # incidents by pool
        "oom_sentinel_last_incident_timestamp_seconds",  # ... and node
        "oom_sentinel_prompts_total",  # prompts
        "oom_sentinel_prompt_peak_vram_bytes_bucket",  # ... and their peaks
        "oom_sentinel_soft_ooms_total",  # soft OOMs
    ):
        assert needed in text
    assert all('host=~"$host"' in expr for _, expr, _ in _queries(dashboard) if "$" in expr)


def test_fleet_dashboard_prints_the_shipped_file() -> None:
    result = CliRunner().invoke(main, ["fleet", "dashboard"])
    assert result.exit_code == 0
    assert json.loads(result.output) == json.loads(DASHBOARD_FILE.read_text("utf-8"))

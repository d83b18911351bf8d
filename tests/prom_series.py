"""Turn real scrapes of the exporter into promtool input series, as a Prometheus with the
README's scrape config would store them.

Every scrape's text is parsed with prometheus_client's own parser; the target labels the
README's config adds (``job``, ``host``; ``instance`` = host:port where the series has none,
``honor_labels: true``) are added, and ``up`` is 1 for a scrape that answered and 0 for one
that did not -- the one series Prometheus writes itself. A series that disappears gets a
staleness marker, as Prometheus writes one after a scrape that no longer has it.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ScrapeRecorder", "series_name", "served_metric_names"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_name(name: str, labels: Mapping[str, str]) -> str:
    """``name{a="1",b="2"}`` (labels sorted), promtool's series notation."""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def served_metric_names(text: str) -> set[str]:
    """Every sample name in one scrape (``_total``, ``_bucket``, ``_sum``... included)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


class ScrapeRecorder:
    """Scrape ``url`` once per step; ``input_series()`` gives promtool's ``input_series``."""

    def __init__(self, url: str, *, job: str, host: str, port: int) -> None:
        self.url = url
        self.target = {"job": job, "host": host, "instance": f"{host}:{port}"}
        self.steps = 0
        self._values: dict[str, dict[int, float]] = {}
        self.texts: list[str] = []

    def scrape(self) -> bool:
        """One scrape; False when the exporter did not answer (``up`` 0)."""
        step = self.steps
        self.steps += 1
        try:
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                text = resp.read().decode()
        except OSError:
            self._put(series_name("up", self.target), step, 0.0)
            return False
        self.texts.append(text)
        self._put(series_name("up", self.target), step, 1.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = {**self.target, **sample.labels}  # honor_labels: the target yields
                self._put(series_name(sample.name, labels), step, float(sample.value))
        return True

    def _put(self, key: str, step: int, value: float) -> None:
        self._values.setdefault(key, {})[step] = value

    def input_series(self) -> list[dict[str, str]]:
        out = []
        for key, points in sorted(self._values.items()):
            values: list[str] = []
            seen = False
            for step in range(self.steps):
                if step in points:
                    values.append(repr(points[step]))
                    seen = True
                elif seen and step - 1 in points:
                    values.append("stale")
                else:
                    values.append("_")
            out.append({"series": key, "values": " ".join(values)})
        return out

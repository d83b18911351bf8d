"""Repeated captures leak nothing: open fds and child processes stay exactly flat, RSS stays
flat within allocator noise. The full 10,000-capture soak (minutes) is
``benchmarks/soak_install_state.py``; this is its CI-sized version, plus a check that the
same measurement does catch GitPython's leak when a Repo is left unclosed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from soak_install_state import small_install, soak, unclosed_repo_pattern  # noqa: E402

CAPTURES = 300
WARMUP = 50
#: RSS may wobble with the allocator; a leak of one Repo (+ its caches) per capture would be
#: far beyond this over 300 captures.
RSS_RATIO_MAX = 1.10


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_install(tmp_path_factory.mktemp("soak"))


@pytest.mark.slow
def test_repeated_captures_leave_fds_children_and_rss_flat(small: Path) -> None:
    r = soak(small, CAPTURES, WARMUP)
    print(
        f"\n{CAPTURES} captures: fds {r['fds_before']} -> {r['fds_after']}, "
        f"children {r['children_before']} -> {r['children_after']}, "
        f"RSS {r['rss_before_bytes'] / 2**20:.1f} -> {r['rss_after_bytes'] / 2**20:.1f} MiB "
        f"(ratio {r['rss_ratio']:.3f}), {r['capture_ms']:.1f} ms/capture"
    )
    assert r["fds_after"] == r["fds_before"]
    assert r["children_after"] == r["children_before"] == 0
    assert r["rss_ratio"] <= RSS_RATIO_MAX


def test_the_measurement_catches_an_unclosed_repo(small: Path) -> None:
    """Sensitivity check: the pattern capture avoids leaves git processes and pipes behind,
    and the same counters see it."""
    grown_fds, grown_children = unclosed_repo_pattern(small, 10)
    assert grown_fds > 0 and grown_children > 0

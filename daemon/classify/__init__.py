"""Read out-of-memory failures out of log text, a user's paste or a ComfyUI ``execution_error``.

One job per module:

- ``rules``: one record in, its ``OomEvent`` out (pure, never raises; the ``NEEDLES`` every
  rule needs);
- ``fold``: records in, events out, one failure seen twice folded into one; ``iter_findings``
  over lines (pure);
- ``prefilter``: where in raw bytes a needle occurs (Aho-Corasick when installed);
- ``scan``: a whole file in constant memory, only the windows around prefilter hits
  assembled (``scan_stream``, what ``diagnose`` runs);
- ``parallel``: a big regular file split over forked workers (loaded on demand).

The names other modules use are re-exported here, so ``from oom_sentinel.daemon.classify
import classify_record`` keeps meaning what it did when this was one module.
"""

from __future__ import annotations

from oom_sentinel.daemon.classify.fold import MERGE_GAP_LINES, Finding, iter_findings, scan_lines
from oom_sentinel.daemon.classify.prefilter import DEFAULT_PREFILTER, PREFILTERS, Prefilter
from oom_sentinel.daemon.classify.rules import (
    NEEDLES,
    classify_execution_error,
    classify_record,
    has_needle,
    parse_size,
)
from oom_sentinel.daemon.classify.scan import LOOKBEHIND_LINES, scan_stream

__all__ = [
    "DEFAULT_PREFILTER",
    "LOOKBEHIND_LINES",
    "MERGE_GAP_LINES",
    "NEEDLES",
    "PREFILTERS",
    "Finding",
    "Prefilter",
    "classify_execution_error",
    "classify_record",
    "has_needle",
    "iter_findings",
    "parse_size",
    "scan_lines",
    "scan_stream",
]

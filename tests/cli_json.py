"""The one JSON object a ``--json`` command printed (not a test module): oom-bisect ``run`` and
``fit`` answer so, and a test reads the answer, the exit status and stderr together."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def json_answer(proc: subprocess.CompletedProcess[str]) -> tuple[int, dict[str, Any], str]:
    """(exit status, the printed JSON object, stderr); no JSON on stdout fails the test with
    the exit status and the end of stderr (why it printed none)."""
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (exit {proc.returncode}):\n{proc.stderr[-4000:]}") from None
    return proc.returncode, doc, proc.stderr

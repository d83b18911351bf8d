"""N prompts of 5-25 ms through the stand-in (one in four an OOM), the daemon SIGKILLed at a
third and back at two thirds: run rows, lost, doubled, incidents (the figures the suite's
tests/test_watch_fast_prompts.py asserts for 600).

    .venv/bin/python benchmarks/fast_prompts.py [--prompts 600]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fast_prompts import run_fast_prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=600)
    args = parser.parse_args()
    kill_at, back_at = args.prompts // 3, 2 * args.prompts // 3
    with tempfile.TemporaryDirectory() as tmp:
        f = run_fast_prompts(Path(tmp), args.prompts, kill_at, back_at)
    print(f"fast prompts: {f.line(kill_at, back_at)}")
    ok = not f.lost and not f.doubled and f.snapshots == len(f.ooms) and not f.no_incident_id
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

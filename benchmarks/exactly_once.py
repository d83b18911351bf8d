"""The exactly-once probe at 1,000 failures: Manager rotations every few failures and kill -9
of the real daemon at random moments (in storms, in backlogs); prints records, kills,
rotations, lost and duplicated (see tests/exactly_once.py for how each is measured).

    .venv/bin/python benchmarks/exactly_once.py [--records 1000] [--kills 40] [--seed 11]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.exactly_once import run_stress


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run_stress(Path(tmp), records=args.records, kills=args.kills, seed=args.seed)
    print(f"exactly once: {figures.line()}")
    for problem in figures.problems:
        print(f"problem: {problem}")
    ok = (figures.lost, figures.duplicated) == (0, 0) and not figures.problems
    print("none lost, none duplicated" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

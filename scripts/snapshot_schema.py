"""Regenerate ``daemon/incidents/snapshot.schema.json`` from the snapshot models
(``daemon/incidents/snapshot_model.py``), the one definition of ``snapshot.json``.

    .venv/bin/python scripts/snapshot_schema.py          # rewrite the shipped file
    .venv/bin/python scripts/snapshot_schema.py --check  # exit 1 when it is stale

``tests/test_snapshot_model.py`` fails when the shipped file differs from the models, so a
change to a model lands together with its schema.
"""

from __future__ import annotations

import argparse
import sys

from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.incidents.snapshot_model import SCHEMA_FILE, schema_text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is stale")
    args = parser.parse_args()
    # the source tree's file, not an installed copy's (an editable install points here)
    target = SCHEMA_FILE
    wanted = schema_text()
    current = target.read_text("utf-8") if target.is_file() else ""
    if args.check:
        if current != wanted:
            print(f"{target}: stale; run scripts/snapshot_schema.py", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        write_text_atomic(target, wanted, mode=0o644)
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

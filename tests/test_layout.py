"""The package imports as oom_sentinel.* while its code sits in the card's top-level folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = ["daemon", "bisect", "config", "windows_service"]


@pytest.mark.parametrize("folder", TOP_LEVEL)
def test_top_level_folder_has_no_init(folder: str) -> None:
    assert (ROOT / folder).is_dir()
    assert not (ROOT / folder / "__init__.py").exists()


def test_stdlib_bisect_and_random_import_from_repo_root() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import random, bisect; print(bisect.__file__, random.random() < 1)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    path, ok = proc.stdout.split()
    assert ok == "True"
    assert Path(path).name == "bisect.py" and Path(path).parent != ROOT


def test_namespace_imports() -> None:
    import oom_sentinel.bisect.cli.main
    import oom_sentinel.config.settings
    import oom_sentinel.daemon.cli.main
    import oom_sentinel.windows_service.paths  # noqa: F401

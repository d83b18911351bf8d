"""The suite is hermetic: it never reads the user's config or data dirs, and it never attaches
to a ComfyUI it did not start. A "foreign" ComfyUI (a user's, or a second copy of the suite's)
is started outside this session's temp root: discovery, a daemon with process discovery on and
``find_comfy_processes`` do not see it -- and without the scope they do, so the check bites."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from daemon_harness import Daemon, wait_for
from fake_comfy_install import make_install, start_comfy, stop

from oom_sentinel.config.settings import APP_NAME, SYSTEM_CONFIG, config_search_path
from oom_sentinel.daemon.comfy.processes import PROCESS_SCOPE_ENV, find_comfy_processes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def foreign_comfy() -> Iterator[int]:
    """A ComfyUI-looking server outside the session's temp root, as another user's would be."""
    root = Path(tempfile.mkdtemp(prefix="not-this-suite-"))
    try:
        install = make_install(root / "ComfyUI")
        proc = start_comfy(install / "main.py", ["--port", "18999"], cwd=install)
        try:
            yield proc.pid
        finally:
            stop(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_config_and_data_are_looked_up_only_inside_the_sessions_temp_root(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = str(tmp_path_factory.getbasetemp())
    assert "OOM_SENTINEL_CONFIG" not in os.environ
    for path in config_search_path():
        assert str(path).startswith(base) or path == SYSTEM_CONFIG, path
    assert platformdirs.user_data_dir(APP_NAME).startswith(base)
    assert platformdirs.user_config_dir(APP_NAME).startswith(base)


def test_a_comfyui_the_suite_did_not_start_is_invisible(
    foreign_comfy: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine_install = make_install(tmp_path / "ComfyUI")
    mine = start_comfy(mine_install / "main.py", ["--port", "18998"], cwd=mine_install)
    try:
        seen = {p.pid for p in find_comfy_processes()}
        assert mine.pid in seen and foreign_comfy not in seen
        # a daemon that discovers running processes adopts only this test's ComfyUI
        daemon = Daemon(tmp_path, config="[logs]\npoll_interval_ms = 500\n").start()
        try:
            wait_for(lambda: f"pid {mine.pid}" in daemon.stderr(), 30, "this test's ComfyUI")
            assert f"pid {foreign_comfy}" not in daemon.stderr()
        finally:
            daemon.stop()
        # the check bites: without the scope, the foreign one is there
        monkeypatch.delenv(PROCESS_SCOPE_ENV)
        assert foreign_comfy in {p.pid for p in find_comfy_processes()}
    finally:
        stop(mine)

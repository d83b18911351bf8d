"""``oom-bisect checkout STATE --into DIR`` (issue 14, item 3): a state as a separate install.

Real parts throughout: the stand-in ComfyUI's git histories, shared clones, a venv the real uv
builds offline from local wheels, and the generated ``run.sh`` started as a process that
serves the workflow on its own port. The user's repos are fingerprinted before and after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_bisect_e2e import UserInstall
from test_bisect_e2e_packages import _install, _manager_snapshot, _workflow
from wheels import ballast_wheelhouse

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.daemon.install.history import record_capture
from oom_sentinel.daemon.install.state import capture_install
from oom_sentinel.daemon.store.db import Store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("wheels")
    return d, ballast_wheelhouse(d)


def _git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(path), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _http(url: str, data: dict[str, Any] | None = None) -> Any:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    # generous: a loaded CI box stalls a local server for seconds; the loops' deadlines bound
    # the test, this only bounds one request
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def _checkout(inst: UserInstall, *args: str) -> subprocess.CompletedProcess[str]:
    return inst.run(
        "checkout", "--comfyui", str(inst.root), "--python", sys.executable, *args, timeout=300
    )


def test_print_shows_the_plan_and_writes_nothing(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    wheels, runtime = wheelhouse
    inst = _install(tmp_path, wheels, core_kw={"bad_commit_index": None})
    pack = inst.nodes["PackB"]
    good = _manager_snapshot(
        inst, "good", {**runtime, "sentinel-ballast": "1.0"}, {"PackB": pack.commits[0]}
    )
    into = tmp_path / "old-state"
    proc = _checkout(inst, good, "--into", str(into), "--port", "8299", "--print")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"shared clone of {inst.root.resolve()} at {inst.core.head}" in out
    assert "custom_nodes/PackB" in out and pack.commits[0] in out
    assert "custom_nodes/BallastPack" in out and "copied from" in out
    assert f"{len(runtime) + 1} package(s) of the state" in out
    assert "port 8299" in out
    assert not into.exists()
    # inside the live install: refused in one line, nothing written
    inside = _checkout(inst, good, "--into", str(inst.root / "old"), "--print")
    assert inside.returncode != 0 and "must be outside the install" in inside.stderr
    assert "Traceback" not in inside.stderr
    # a state whose packages cannot be installed: one line with uv's reason, DIR not left
    bad = _manager_snapshot(inst, "bad", {**runtime, "sentinel-ballast": "9.9"})
    failed = _checkout(inst, bad, "--into", str(into))
    assert failed.returncode != 0 and "sentinel-ballast==9.9" in failed.stderr
    assert "Traceback" not in failed.stderr and not into.exists()
    inst.assert_untouched()


def test_a_recorded_state_id_checks_out_by_id(tmp_path: Path) -> None:
    """The command `oom-sentinel states show ID` offers takes the daemon's state id."""
    from test_bisect_e2e import make_install

    inst = make_install(tmp_path, core_kw={"bad_commit_index": None})
    recorded = capture_install(inst.root).with_environment(("sentinel-ballast==1.0",), None)
    data = tmp_path / "data"
    with Store.open(data) as store:
        assert record_capture(store, "main", recorded, at_s=1000.0)
    into = tmp_path / "by-id"
    proc = _checkout(
        inst, recorded.state_id[:8], "--data-dir", str(data), "--into", str(into), "--print"
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 package(s) of the state" in proc.stdout
    assert inst.core.head in proc.stdout and not into.exists()


def test_checkout_builds_an_install_whose_launcher_runs_the_workflow(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]]
) -> None:
    wheels, runtime = wheelhouse
    inst = _install(tmp_path, wheels, core_kw={"bad_commit_index": None})
    pack = inst.nodes["PackB"]
    good = _manager_snapshot(
        inst, "good", {**runtime, "sentinel-ballast": "1.0"}, {"PackB": pack.commits[0]}
    )
    into = tmp_path / "old-state"
    port = free_port()
    proc = _checkout(inst, good, "--into", str(into), "--port", str(port), "--flags", "--cpu")
    assert proc.returncode == 0, proc.stderr
    assert f"ready: {into.resolve() / 'run.sh'}" in proc.stdout
    core = into / "ComfyUI"
    # clones at the state's commits, borrowing the user's objects (nothing copied)
    assert _git(core, "rev-parse", "HEAD") == inst.core.head
    assert (core / ".git" / "objects" / "info" / "alternates").is_file()
    assert _git(core / "custom_nodes" / "PackB", "rev-parse", "HEAD") == pack.commits[0]
    assert (core / "custom_nodes" / "BallastPack" / "__init__.py").is_file()
    assert "oom_bisect_user_models" in (core / "extra_model_paths.yaml").read_text()
    py = into / "venv" / "bin" / "python"
    scale = subprocess.run(
        [str(py), "-c", "import sentinel_ballast; print(sentinel_ballast.SCALE)"],
        capture_output=True,
        text=True,
        cwd=into,
    )
    assert scale.stdout.strip() == "1.0", scale.stderr
    script = (into / "run.sh").read_text()
    assert str(py) in script and f"--port {port}" in script and "--cpu" in script
    assert str(into.resolve() / "user") in script and ":memory:" not in script

    env = {**inst.env}
    server = subprocess.Popen(
        [str(into / "run.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                _http(base + "/system_stats")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    out = server.stdout.read().decode() if server.stdout else ""
                    raise AssertionError(f"the launcher did not serve:\n{out[-3000:]}") from None
                time.sleep(0.2)
        prompt = json.loads(Path(_workflow(inst)).read_text())
        queued = _http(base + "/prompt", {"prompt": prompt, "client_id": "checkout-test"})
        pid = queued["prompt_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            hist = _http(f"{base}/history/{pid}")
            if pid in hist and hist[pid].get("status", {}).get("completed"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the workflow did not finish: {hist}")
        assert hist[pid]["status"]["status_str"] == "success"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    inst.assert_untouched()

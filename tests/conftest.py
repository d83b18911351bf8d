"""Shared fixtures. GPU tests run only where NVML sees a device; real-ComfyUI tests only when
$OOM_SENTINEL_REAL_COMFYUI points at a checkout."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

ROOT = Path(__file__).resolve().parent.parent

# CI runs the property tests on a fixed seed: a red CI must mean the change broke something,
# not that this run's random draw found an old bug (that is what local runs are for: they keep
# exploring, and a failure they find becomes a plain regression test, as the copy-truncate one
# in test_logtail.py did). `.ci/run` sets HYPOTHESIS_PROFILE=ci.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# A suite started in the background by a non-interactive shell (`pytest &`, a CI runner's job)
# inherits SIGINT ignored, and every process it starts would too: the Ctrl-C tests would then
# send a signal nobody hears. Python installs its KeyboardInterrupt handler only when SIGINT was
# not ignored at start, so give this process the handler; children then get the default
# disposition at exec, as they would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Under nohup SIGHUP is ignored, and the hang-up tests' processes would ignore it too. A
# handler that does nothing keeps this process as deaf to a hang-up as nohup asked, while the
# processes it starts get the default disposition back at exec.
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda _signum, _frame: None)


def _nvml_device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        default=None,
        metavar="I/N",
        help="run only shard I of N (0-based): whole test files, balanced by tests/durations.json",
    )
    parser.addoption(
        "--shards",
        default=None,
        metavar="N|auto",
        help="run the suite as N pytest sessions at once (auto: one per core, two at most; "
        "$OOM_SENTINEL_TEST_SHARDS overrides): this session runs shard 0, the others are "
        "started as child sessions and their reports printed at the end",
    )


def _shard_count(raw: str) -> int:
    env = os.environ.get("OOM_SENTINEL_TEST_SHARDS", "").strip()
    value = env or raw
    if value == "auto":
        return max(1, min(2, os.cpu_count() or 1))
    try:
        return max(1, int(value))
    except ValueError:
        raise pytest.UsageError(f"--shards {value!r}: expected a number or auto") from None


def pytest_configure(config: pytest.Config) -> None:
    """``--shards N``: most of the suite's wall time is waiting (replayed ComfyUIs starting,
    daemons noticing lines), so one session keeps about half a core busy. Each shard is a whole
    session with its own temp root and process scope: it sees only what it started."""
    raw = config.getoption("--shards")
    if not raw or config.getoption("--shard"):
        return
    n = _shard_count(raw)
    if n <= 1:
        return
    import subprocess
    import tempfile

    args = [a for a in config.invocation_params.args if not a.startswith("--shards")]
    if "--shards" in config.invocation_params.args:  # "--shards N" as two words
        i = list(config.invocation_params.args).index("--shards")
        args = [*config.invocation_params.args[:i], *config.invocation_params.args[i + 2 :]]
    children = []
    for i in range(1, n):
        out = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115 (closed at session end)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", f"--shard={i}/{n}", *args],
            cwd=config.invocation_params.dir,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        children.append((i, proc, out))
    config._oom_shard_children = children  # type: ignore[attr-defined]
    config.option.shard = f"0/{n}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    children = getattr(session.config, "_oom_shard_children", None)
    if not children:
        return
    n = len(children) + 1
    codes = []
    for i, proc, out in children:
        code = proc.wait()
        out.seek(0)
        text = out.read()
        out.close()
        sys.stdout.write(f"\n===== shard {i}/{n} (exit {code}) =====\n{text}")
        codes.append(code)
    sys.stdout.flush()
    # a shard that got no test of a small selection (5) is no failure; any other is
    bad = [c for c in codes if c not in (0, 5)]
    if bad:
        session.exitstatus = bad[0] if session.exitstatus in (0, 5) else session.exitstatus
    elif session.exitstatus == 5 and 0 in codes:
        session.exitstatus = 0


def pytest_unconfigure(config: pytest.Config) -> None:
    for _, proc, _ in getattr(config, "_oom_shard_children", ()):
        if proc.poll() is None:  # Ctrl-C or an internal error: the children go too
            proc.send_signal(signal.SIGINT)
            proc.wait()


def _shard_of_files(files: list[str], n: int) -> dict[str, int]:
    """Whole files to shards, longest first onto the least loaded (the seconds each file took
    in tests/durations.json; a file not listed counts one second)."""
    import json

    try:
        seconds = json.loads((ROOT / "tests" / "durations.json").read_text("utf-8"))
    except (OSError, ValueError):
        seconds = {}
    load = [0.0] * n
    out: dict[str, int] = {}
    for f in sorted(files, key=lambda f: (-float(seconds.get(f, 1.0)), f)):
        i = load.index(min(load))
        out[f] = i
        load[i] += float(seconds.get(f, 1.0))
    return out


def _select_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    raw = config.getoption("--shard")
    if not raw:
        return
    try:
        i, n = (int(x) for x in raw.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard {raw!r}: expected I/N with 0 <= I < N") from None
    files = sorted({item.nodeid.split("::")[0] for item in items})
    shard = _shard_of_files(files, n)
    keep = [item for item in items if shard[item.nodeid.split("::")[0]] == i]
    dropped = [item for item in items if shard[item.nodeid.split("::")[0]] != i]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _select_shard(config, items)
    need_gpu = [item for item in items if "gpu" in item.keywords]
    if need_gpu and _nvml_device_count() == 0:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML found none)")
        for item in need_gpu:
            item.add_marker(skip)
    if not os.environ.get("OOM_SENTINEL_REAL_COMFYUI"):
        skip = pytest.mark.skip(reason="set OOM_SENTINEL_REAL_COMFYUI to a ComfyUI checkout")
        for item in items:
            if "real_comfyui" in item.keywords:
                item.add_marker(skip)


#: what a user's session may hold that would leak into a test: where configs and data are
#: looked up (platformdirs reads these), an explicit config, systemd's state directory
_ISOLATED_DIRS = {
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "XDG_STATE_HOME": "state",
    "APPDATA": "appdata",
}
_DROPPED = ("OOM_SENTINEL_CONFIG", "STATE_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC")


@pytest.fixture(scope="session", autouse=True)
def hermetic_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests never read the user's config or data dirs, and never see a ComfyUI process they
    did not start: discovery, snapshots and ``doctor`` only know processes that run from under
    this session's temp root (``OOM_SENTINEL_PROCESS_SCOPE``, honoured by
    ``processes.find_comfy_processes`` only when set). Subprocesses inherit all of it.
    The torch venv cache (``torch_venv.py``) keeps its place outside the temp root."""
    from torch_venv import cache_root

    base = tmp_path_factory.getbasetemp()
    home = base / "user-dirs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OOM_SENTINEL_TEST_CACHE", str(cache_root()))
        for name, sub in _ISOLATED_DIRS.items():
            (home / sub).mkdir(parents=True, exist_ok=True)
            mp.setenv(name, str(home / sub))
        for name in _DROPPED:
            mp.delenv(name, raising=False)
        if not os.environ.get("OOM_SENTINEL_CACHE_DIR"):
            mp.setenv("OOM_SENTINEL_CACHE_DIR", str(home / "cache"))
        mp.setenv("OOM_SENTINEL_PROCESS_SCOPE", str(base))
        yield


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start stand-in ComfyUI processes (``tests/standin_proc.py``); all are stopped afterwards.

    ``proc = standin("--lowvram", fake_gpu=gpu_dir)`` returns a ready ``StandinProcess`` with a
    free port on 127.0.0.1 and its own base directory under ``tmp_path``.
    """
    from standin_proc import StandinProcess, start_standin

    started: list[StandinProcess] = []

    def start(*args: str, base_dir: Path | None = None, **kw: Any) -> StandinProcess:
        proc = start_standin(base_dir or tmp_path / f"standin-{len(started)}", *args, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """A venv with the CPU build of torch, cached between sessions (see ``torch_venv.py``)."""
    from torch_venv import torch_venv_python

    return torch_venv_python()

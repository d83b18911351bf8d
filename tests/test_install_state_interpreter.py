"""Facts from ComfyUI's own interpreter: found where installs keep it, run with a timeout,
torch absent or present, never imported here.

The torch-present path runs twice: against a real venv with the CPU build of torch 2.13.0
(built once and cached between test sessions: ``torch_venv.py``, fixture ``torch_python``) and
against canned output of a CUDA machine, which cannot exist here."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import psutil
import pytest
from torch_venv import TORCH_VERSION

from oom_sentinel.daemon.comfy.interpreter import (
    FACTS_MARKER,
    GpuFacts,
    InterpreterFacts,
    facts_distributions,
    find_interpreter,
    parse_facts_output,
    parse_freeze,
    probe_interpreter,
    redact_url_credentials,
)
from oom_sentinel.daemon.core.errors import ProbeError

# ---------------------------------------------------------------------------------------------
# Finding the interpreter


@pytest.mark.parametrize(
    "relative",
    [
        "ComfyUI/venv/bin/python",
        "ComfyUI/.venv/bin/python",
        "ComfyUI/venv/Scripts/python.exe",
        "python_embeded/python.exe",
    ],
    ids=["venv", "dot-venv", "windows-venv", "portable-python-embeded"],
)
def test_interpreter_is_found_where_installs_keep_it(tmp_path: Path, relative: str) -> None:
    root = tmp_path / "ComfyUI"
    root.mkdir()
    exe = tmp_path / relative
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert find_interpreter(root) == exe


def test_no_interpreter_found_is_none(tmp_path: Path) -> None:
    assert find_interpreter(tmp_path) is None


# ---------------------------------------------------------------------------------------------
# A real interpreter without torch (this test run's own Python)


def test_real_interpreter_without_torch_gives_none_torch_fields(python_exe: str) -> None:
    facts, pip = probe_interpreter(python_exe)
    assert facts.error is None
    assert facts.executable == python_exe
    assert facts.python_version == ".".join(map(str, sys.version_info[:3]))
    assert (facts.torch_version, facts.cuda_version, facts.cudnn_version) == (None, None, None)
    assert facts.cuda_available is None and facts.gpus == ()
    assert facts.torch_error is not None and "torch" in facts.torch_error
    assert pip is not None
    assert any(line.lower().startswith("psutil==") for line in pip)
    assert all(not line.startswith("#") for line in pip)
    assert "torch" not in sys.modules


def test_probe_without_pip_skips_freeze(python_exe: str) -> None:
    facts, pip = probe_interpreter(python_exe, pip=False)
    assert facts.error is None and pip is None


def test_missing_interpreter_is_a_probe_error(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match=r"interpreter not found"):
        probe_interpreter(tmp_path / "nope" / "python")


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


@pytest.mark.skipif(os.name == "nt", reason="POSIX shell stand-in")
def test_hung_interpreter_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    hung = _script(
        tmp_path / "python",
        f"""\
        sleep 300 &
        echo $! > {pidfile}
        wait
        """,
    )
    facts, pip = probe_interpreter(hung, timeout_s=1)
    assert facts.error is not None and "timed out after 1 s" in facts.error
    assert pip is None
    child = int(pidfile.read_text())
    # SIGKILL closes the child's pipes a moment before it is gone; let it finish dying
    # (a generous bound, not a timing assertion).
    try:
        proc = psutil.Process(child)
        deadline_s = 30.0
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and deadline_s > 0:
            psutil.wait_procs([proc], timeout=0.1)
            deadline_s -= 0.1
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    assert not alive, "the interpreter's child survived the timeout"


@pytest.mark.skipif(os.name == "nt", reason="POSIX shell stand-in")
def test_failing_interpreter_reports_its_last_stderr_line(tmp_path: Path) -> None:
    broken = _script(tmp_path / "python", "echo 'Fatal Python error: init failed' >&2\nexit 3\n")
    facts, pip = probe_interpreter(broken)
    assert facts.error == "exited with status 3: Fatal Python error: init failed"
    assert pip is None


def test_interpreter_without_pip_falls_back_to_metadata(tmp_path: Path) -> None:
    """uv-made venvs have no pip: the listing comes from importlib.metadata instead."""
    env_dir = tmp_path / "nopip"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    plain = site / "foo_pkg-1.2.3.dist-info"
    plain.mkdir(parents=True)
    (plain / "METADATA").write_text("Metadata-Version: 2.1\nName: foo-pkg\nVersion: 1.2.3\n")
    direct = site / "bar-0.1.dist-info"
    direct.mkdir()
    (direct / "METADATA").write_text("Metadata-Version: 2.1\nName: bar\nVersion: 0.1\n")
    (direct / "direct_url.json").write_text(
        json.dumps({"url": "https://tok:secret@example.com/bar-0.1.whl", "archive_info": {}})
    )
    facts, pip = probe_interpreter(python)
    assert facts.error is None
    assert pip == ("bar @ https://example.com/bar-0.1.whl", "foo-pkg==1.2.3")


# ---------------------------------------------------------------------------------------------
# A real interpreter with torch (CPU build), cached between sessions


@pytest.mark.slow
def test_real_interpreter_with_cpu_torch_reports_torch_and_no_cuda(torch_python: Path) -> None:
    facts, pip = probe_interpreter(torch_python, timeout_s=120)
    assert facts.error is None, facts.error
    assert facts.torch_version is not None and facts.torch_version.startswith(TORCH_VERSION)
    assert facts.cuda_version is None  # the +cpu build
    assert facts.cuda_available is False
    assert facts.gpus == ()
    assert facts.torch_error is None
    assert pip is not None and any(line.startswith(f"torch=={TORCH_VERSION}") for line in pip)
    assert "torch" not in sys.modules


# ---------------------------------------------------------------------------------------------
# Parsing the facts line (the CUDA path, which no machine here can produce)


CUDA_MACHINE = {
    "python_version": "3.12.10",
    "executable": "C:\\ComfyUI_windows_portable\\python_embeded\\python.exe",
    "torch_version": "2.7.1+cu128",
    "cuda_version": "12.8",
    "hip_version": None,
    "cudnn_version": "90701",
    "cuda_available": True,
    "driver_version": "576.88",
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "total_memory_bytes": 25756696576}],
    "torch_error": None,
    "distributions": ["torch==2.7.1+cu128", "numpy==2.2.6"],
}


def test_cuda_facts_line_is_parsed() -> None:
    stdout = "custom banner from sitecustomize\n" + FACTS_MARKER + json.dumps(CUDA_MACHINE) + "\n"
    facts = parse_facts_output(stdout, "/given/python")
    assert facts == InterpreterFacts(
        executable="/given/python",
        python_version="3.12.10",
        torch_version="2.7.1+cu128",
        cuda_version="12.8",
        hip_version=None,
        cudnn_version="90701",
        driver_version="576.88",
        cuda_available=True,
        gpus=(GpuFacts(0, "NVIDIA GeForce RTX 4090", 25756696576),),
    )
    assert facts_distributions(stdout) == ("numpy==2.2.6", "torch==2.7.1+cu128")


@pytest.mark.parametrize(
    "stdout",
    ["", "no marker here\n", FACTS_MARKER + "{not json\n", FACTS_MARKER + "[1, 2]\n"],
    ids=["empty", "no-marker", "bad-json", "not-an-object"],
)
def test_garbled_facts_output_is_an_error_record(stdout: str) -> None:
    facts = parse_facts_output(stdout, "/p")
    assert facts.error == "the interpreter printed no facts line"
    assert facts.torch_version is None


def test_facts_round_trip_through_dicts() -> None:
    facts = parse_facts_output(FACTS_MARKER + json.dumps(CUDA_MACHINE), "/p")
    assert InterpreterFacts.from_dict(facts.to_dict()) == facts


def test_freeze_lines_drop_comments_and_credentials() -> None:
    text = textwrap.dedent(
        """\
        # Editable install with no version control (mypkg==0.1)
        -e /home/u/src/mypkg
        torch==2.5.1+cu124

        private @ git+https://user:ghp_abc@github.com/o/private@0123abc
        Numpy==1.26.4
        """
    )
    assert parse_freeze(text) == (
        "-e /home/u/src/mypkg",
        "Numpy==1.26.4",
        "private @ git+https://github.com/o/private@0123abc",
        "torch==2.5.1+cu124",
    )


def test_url_credentials_are_redacted_anywhere_in_text() -> None:
    assert (
        redact_url_credentials("clone: from https://a:b@host/x and ssh://git@host/y")
        == "clone: from https://host/x and ssh://host/y"
    )

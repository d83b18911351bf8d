"""``oom-sentinel service install|uninstall`` on Linux, as a real process.

systemd cannot run in this container, so the commands that need it are checked two ways: with
the real ``systemctl`` (which answers that systemd is not running: the install must say so in
one line, after writing the unit), and with a ``systemctl`` on PATH that records its arguments
(the sequence the install runs).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fake_comfy_install import make_install

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.cli.service import (
    entry_point,
    render_unit,
    systemd_quote,
    watched_paths,
)

BIN_DIR = Path(sys.executable).parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "service", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def _config(tmp_path: Path) -> tuple[Path, Path]:
    install = make_install(tmp_path / "Comfy UI")  # a space: quoting must hold
    logs = tmp_path / "logs"
    logs.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(
        "[[instances]]\n"
        'name = "main"\n'
        f"path = {json.dumps(str(install))}\n"
        f"logs = [{json.dumps(str(logs / 'comfyui.log'))}]\n"
    )
    return config, install


def _recording_systemctl(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "systemctl.log"
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return env, log


def test_dry_run_prints_the_unit_and_commands_and_changes_nothing(tmp_path: Path) -> None:
    config, install = _config(tmp_path)
    units = tmp_path / "units"
    proc = _cli(
        "install",
        "--system",
        "--dry-run",
        "--no-discover",
        "--config",
        str(config),
        "--unit-dir",
        str(units),
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"# {units / 'oom-sentinel.service'}\n")
    lines = out.splitlines()
    exec_start = [line for line in lines if line.startswith("ExecStart=")]
    assert exec_start == [f"ExecStart={entry_point()[0]} run"]
    assert entry_point()[0] == str(BIN_DIR / "oom-sentinel")  # this venv's entry point
    assert f"Environment=OOM_SENTINEL_CONFIG={config}" in lines
    assert f'ReadOnlyPaths=-"{install}"' in lines
    assert f"ReadOnlyPaths=-{tmp_path / 'logs'}" in lines
    assert lines[-2:] == ["systemctl daemon-reload", "systemctl enable --now oom-sentinel.service"]
    assert not units.exists()


def test_user_dry_run_lists_paths_as_comments(tmp_path: Path) -> None:
    config, install = _config(tmp_path)
    proc = _cli(
        "install",
        "--user",
        "--dry-run",
        "--no-discover",
        "--config",
        str(config),
        "--unit-dir",
        str(tmp_path / "u"),
    )
    assert proc.returncode == 0, proc.stderr
    assert f'# ReadOnlyPaths=-"{install}"' in proc.stdout.splitlines()
    assert "systemctl --user enable --now oom-sentinel.service" in proc.stdout
    assert "# note: to keep it running while you are logged out: loginctl enable-linger" in (
        proc.stdout
    )


def test_install_writes_the_unit_then_reloads_and_enables(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    env, log = _recording_systemctl(tmp_path)
    units = tmp_path / "units"
    proc = _cli(
        "install",
        "--system",
        "--no-discover",
        "--config",
        str(config),
        "--unit-dir",
        str(units),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    unit = units / "oom-sentinel.service"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert f"ExecStart={BIN_DIR / 'oom-sentinel'} run" in unit.read_text()
    assert log.read_text().splitlines() == ["daemon-reload", "enable --now oom-sentinel.service"]
    assert proc.stdout.startswith(f"installed {unit} and started it (system service)")
    assert [p.name for p in units.iterdir()] == ["oom-sentinel.service"]  # no temp file left


def test_uninstall_disables_removes_and_reloads(tmp_path: Path) -> None:
    env, log = _recording_systemctl(tmp_path)
    units = tmp_path / "units"
    units.mkdir()
    (units / "oom-sentinel.service").write_text("[Service]\nExecStart=/bin/true\n")
    proc = _cli("uninstall", "--user", "--unit-dir", str(units), env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (units / "oom-sentinel.service").exists()
    assert log.read_text().splitlines() == [
        "--user disable --now oom-sentinel.service",
        "--user daemon-reload",
    ]


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="no systemctl here")
def test_without_a_running_systemd_install_fails_in_one_line(tmp_path: Path) -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd runs here: this test would really install the service")
    config, _ = _config(tmp_path)
    units = tmp_path / "units"
    proc = _cli(
        "install", "--system", "--no-discover", "--config", str(config), "--unit-dir", str(units)
    )
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("oom-sentinel: error: systemctl daemon-reload failed (exit ")
    assert (units / "oom-sentinel.service").is_file()  # written first, so it can be started later


def test_user_and_system_together_is_a_usage_error(tmp_path: Path) -> None:
    proc = _cli("install", "--user", "--system", "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "oom-sentinel: error: choose one of --user and --system"


def test_entry_point_falls_back_to_python_dash_m(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text("")
    assert entry_point(str(python)) == [str(python), "-m", "oom_sentinel.daemon"]


@pytest.mark.parametrize(
    ("arg", "plain", "exec_line"),
    [
        ("/usr/bin/oom-sentinel", "/usr/bin/oom-sentinel", "/usr/bin/oom-sentinel"),
        ("/opt/Comfy UI", '"/opt/Comfy UI"', '"/opt/Comfy UI"'),
        ("/x/100%", "/x/100%%", "/x/100%%"),
        ("/x/$HOME", "/x/$HOME", "/x/$$HOME"),
        ('/x/"q"', '"/x/\\"q\\""', '"/x/\\"q\\""'),
    ],
    ids=["plain", "space", "percent", "dollar", "quote"],
)
def test_systemd_quoting(arg: str, plain: str, exec_line: str) -> None:
    assert systemd_quote(arg) == plain
    assert systemd_quote(arg, exec_line=True) == exec_line


def test_render_unit_replaces_exec_start_and_fills_paths() -> None:
    template = "[Service]\nExecStart=/usr/local/bin/oom-sentinel run\n# ReadOnlyPaths=\n"
    text = render_unit(template, exec_start=["/v/bin/python", "-m", "x"], read_only_paths=["/a"])
    assert text == (
        "[Service]\nExecStart=/v/bin/python -m x run\n# ReadOnlyPaths=\nReadOnlyPaths=-/a\n"
    )
    with pytest.raises(ValueError):
        render_unit("[Service]\n", exec_start=["x"])


def test_watched_paths_finds_installs_and_keeps_the_outermost(tmp_path: Path) -> None:
    home = tmp_path / "home"
    make_install(home / "ComfyUI")
    (home / "ComfyUI" / "user").mkdir()
    settings = Settings.model_validate(
        {
            "instances": [
                {
                    "path": str(tmp_path / "opt" / "ComfyUI"),
                    "logs": [str(tmp_path / "opt" / "ComfyUI" / "user" / "c.log")],
                }
            ],
            "logs": {"extra": [str(tmp_path / "var" / "log" / "comfy.log")]},
        }
    )
    paths = watched_paths(settings, discover=True, homes=[home], environ={})
    assert str(home / "ComfyUI") in paths
    assert str(tmp_path / "opt" / "ComfyUI") in paths
    assert str(tmp_path / "var" / "log") in paths
    assert str(tmp_path / "opt" / "ComfyUI" / "user") not in paths  # inside a listed install
    assert paths == sorted(paths)

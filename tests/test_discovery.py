"""Discovering ComfyUI installs, their logs and API from processes and common locations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_comfy_install import make_install, start_comfy, stop

from oom_sentinel.daemon.comfy.discovery import (
    DESKTOP_DEFAULT_PORT,
    describe_install,
    desktop_dirs,
    discover_instances,
    manager_log_paths,
)
from oom_sentinel.daemon.comfy.processes import (
    ComfyProcess,
    comfy_process_from,
    find_comfy_processes,
    parse_launch_flags,
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def by_name(instances: tuple) -> dict:  # type: ignore[type-arg]
    return {i.name: i for i in instances}


def test_nothing_installed_finds_nothing(home: Path) -> None:
    assert discover_instances(home=home, environ={}, platform="linux", extra_roots=[]) == ()


def test_git_clone_in_home_with_manager_logs(home: Path) -> None:
    install = make_install(home / "ComfyUI")
    user = install / "user"
    user.mkdir()
    for name in ("comfyui.log", "comfyui_8189.log", "comfyui_8189.prev.log", "comfyui.prev2.log"):
        (user / name).write_text("")
    venv_python = install / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    (inst,) = discover_instances(home=home, environ={}, platform="linux", extra_roots=[])
    assert inst.name == "ComfyUI" and inst.path == str(install) and inst.code_dir == str(install)
    assert inst.url == "http://127.0.0.1:8188"
    assert inst.log_paths == (str(user / "comfyui.log"), str(user / "comfyui_8189.log"))
    assert inst.pid is None and inst.flags is None
    assert inst.python == str(venv_python)
    assert inst.source == "location"


def test_logs_are_listed_before_they_exist(home: Path) -> None:
    install = make_install(home / "ComfyUI")
    (inst,) = discover_instances(home=home, environ={}, platform="linux", extra_roots=[])
    assert inst.log_paths == (str(install / "user" / "comfyui.log"),)
    assert inst.python is None


def test_legacy_manager_log_in_the_working_directory_only_when_present(home: Path) -> None:
    install = make_install(home / "ComfyUI")
    (install / "comfyui.log").write_text("old manager\n")
    (inst,) = discover_instances(home=home, environ={}, platform="linux", extra_roots=[])
    assert str(install / "comfyui.log") in inst.log_paths


def test_comfy_cli_default_and_configured_workspaces(home: Path, tmp_path: Path) -> None:
    default = make_install(home / "comfy" / "ComfyUI")
    elsewhere = make_install(tmp_path / "ws" / "ComfyUI")
    config = home / ".config" / "comfy-cli" / "config.ini"
    config.parent.mkdir(parents=True)
    config.write_text(f"[DEFAULT]\nrecent_workspace = {tmp_path / 'ws'}\nenable_tracking = False\n")
    found = discover_instances(home=home, environ={}, platform="linux", extra_roots=[])
    paths = {i.path: i.source for i in found}
    assert paths == {str(default): "comfy-cli", str(elsewhere): "comfy-cli"}
    assert len({i.name for i in found}) == 2  # both are "ComfyUI": made unique


def test_comfy_cli_default_on_macos_is_under_documents(home: Path) -> None:
    install = make_install(home / "Documents" / "comfy" / "ComfyUI")
    (inst,) = discover_instances(home=home, environ={}, platform="darwin", extra_roots=[])
    assert inst.path == str(install)


def test_windows_portable_layout(home: Path) -> None:
    portable = home / "Downloads" / "ComfyUI_windows_portable"
    install = make_install(portable / "ComfyUI")
    python = portable / "python_embeded" / "python.exe"
    python.parent.mkdir()
    python.write_text("")
    (portable / "comfyui.log").write_text("manager 2.x wrote here\n")
    (inst,) = discover_instances(home=home, environ={}, platform="win32", extra_roots=[])
    assert inst.path == str(install) and inst.source == "portable"
    assert inst.python == str(python)
    assert str(install / "user" / "comfyui.log") in inst.log_paths
    assert str(portable / "comfyui.log") in inst.log_paths


def test_portable_on_a_drive_root(tmp_path: Path, home: Path) -> None:
    drive = tmp_path / "D"
    install = make_install(drive / "ComfyUI_windows_portable_nvidia" / "ComfyUI")
    (inst,) = discover_instances(home=home, environ={}, platform="win32", extra_roots=[drive])
    assert inst.path == str(install)


@pytest.mark.parametrize(
    ("platform", "config_rel", "logs_rel", "environ_key"),
    [
        ("linux", ".config/ComfyUI", ".config/ComfyUI/logs", None),
        ("darwin", "Library/Application Support/ComfyUI", "Library/Logs/ComfyUI", None),
        ("win32", "AppData/Roaming/ComfyUI", "AppData/Roaming/ComfyUI/logs", "APPDATA"),
    ],
    ids=["linux", "macos", "windows"],
)
def test_desktop_base_path_from_its_config(
    home: Path,
    tmp_path: Path,
    platform: str,
    config_rel: str,
    logs_rel: str,
    environ_key: str | None,
) -> None:
    environ = {environ_key: str(home / "AppData" / "Roaming")} if environ_key else {}
    config_dir, logs_dir = desktop_dirs(home, environ, platform)
    assert config_dir == home / config_rel and logs_dir == home / logs_rel
    base = tmp_path / "Documents" / "ComfyUI-data"
    (base / "user").mkdir(parents=True)
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text(
        json.dumps({"basePath": str(base), "installState": "installed"})
    )
    (inst,) = discover_instances(home=home, environ=environ, platform=platform, extra_roots=[])
    assert inst.name == "ComfyUI Desktop" and inst.source == "desktop"
    assert inst.path == str(base)
    assert inst.url == f"http://127.0.0.1:{DESKTOP_DEFAULT_PORT}"
    assert str(logs_dir / "comfyui.log") in inst.log_paths
    assert str(base / "user" / "comfyui.log") in inst.log_paths


def test_broken_desktop_config_is_ignored(home: Path) -> None:
    config_dir, _ = desktop_dirs(home, {}, "linux")
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text("{not json")
    assert discover_instances(home=home, environ={}, platform="linux", extra_roots=[]) == ()


# -- from running processes ---------------------------------------------------------------------


@pytest.fixture
def running() -> Iterator[list]:  # type: ignore[type-arg]
    procs: list = []  # type: ignore[type-arg]
    yield procs
    for p in procs:
        stop(p)


def our_processes(*pids: int) -> list[ComfyProcess]:
    return [p for p in find_comfy_processes() if p.pid in pids]


def test_running_process_gives_port_user_dir_and_interpreter(
    home: Path, tmp_path: Path, running: list
) -> None:  # type: ignore[type-arg]
    install = make_install(home / "ComfyUI")
    user = tmp_path / "shared-user"
    user.mkdir()
    proc = start_comfy("main.py", ["--port", "8190", "--user-directory", str(user)], cwd=install)
    running.append(proc)
    found = discover_instances(
        home=home, environ={}, platform="linux", processes=our_processes(proc.pid), extra_roots=[]
    )
    (inst,) = found  # the process and the location are one install
    assert inst.pid == proc.pid and inst.source == "process"
    assert inst.url == "http://127.0.0.1:8190"
    assert inst.log_paths == (str(user / "comfyui_8190.log"),)
    assert inst.flags is not None and inst.flags.port == 8190
    assert inst.python is not None and "python" in inst.python


def test_joined_port_form_keeps_manager_default_log_name(home: Path, running: list) -> None:  # type: ignore[type-arg]
    install = make_install(home / "ComfyUI")
    proc = start_comfy("main.py", ["--port=8191", "--listen", "0.0.0.0"], cwd=install)
    running.append(proc)
    (inst,) = discover_instances(
        home=home, environ={}, platform="linux", processes=our_processes(proc.pid), extra_roots=[]
    )
    assert inst.log_paths == (str(install / "user" / "comfyui.log"),)
    assert inst.url == "http://127.0.0.1:8191"


def test_two_instances_of_one_install_get_distinct_names(home: Path, running: list) -> None:  # type: ignore[type-arg]
    install = make_install(home / "ComfyUI")
    a = start_comfy("main.py", [], cwd=install)
    running.append(a)
    b = start_comfy("main.py", ["--port", "8189"], cwd=install)
    running.append(b)
    found = by_name(
        discover_instances(
            home=home,
            environ={},
            platform="linux",
            processes=our_processes(a.pid, b.pid),
            extra_roots=[],
        )
    )
    assert set(found) == {"ComfyUI:8188", "ComfyUI:8189"}
    assert found["ComfyUI:8188"].log_paths == (str(install / "user" / "comfyui.log"),)
    assert found["ComfyUI:8189"].log_paths == (str(install / "user" / "comfyui_8189.log"),)


def test_desktop_process_is_matched_to_its_base_path(home: Path, tmp_path: Path) -> None:
    base = tmp_path / "ComfyUI-data"
    (base / "user").mkdir(parents=True)
    config_dir, logs_dir = desktop_dirs(home, {}, "linux")
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text(json.dumps({"basePath": str(base)}))
    resources = "/opt/ComfyUI/resources/ComfyUI"
    files = {f"{resources}/main.py", f"{resources}/folder_paths.py"}
    proc = comfy_process_from(
        4321,
        [
            str(base / ".venv/bin/python"),
            f"{resources}/main.py",
            "--user-directory",
            str(base / "user"),
            "--front-end-root",
            f"{resources}/web_custom_versions/desktop_app",
            "--port",
            "8000",
            "--listen",
            "127.0.0.1",
        ],
        cwd=str(base),
        exists=files.__contains__,
    )
    assert proc is not None
    (inst,) = discover_instances(
        home=home, environ={}, platform="linux", processes=[proc], extra_roots=[]
    )
    assert inst.name == "ComfyUI Desktop" and inst.pid == 4321 and inst.source == "desktop"
    assert inst.path == str(base) and inst.code_dir == resources
    assert inst.log_paths == (
        str(base / "user" / "comfyui_8000.log"),
        str(logs_dir / "comfyui.log"),
    )


def test_configured_path_is_described_like_a_discovered_one(tmp_path: Path) -> None:
    install = make_install(tmp_path / "opt" / "ComfyUI")
    inst = describe_install(install, name="main")
    assert inst.name == "main" and inst.url == "http://127.0.0.1:8188"
    assert inst.log_paths == (str(install / "user" / "comfyui.log"),)


def test_manager_log_names() -> None:
    user = Path("/u")
    assert manager_log_paths(user, parse_launch_flags(["--port", "9000"])) == [
        user / "comfyui_9000.log"
    ]
    assert manager_log_paths(user, parse_launch_flags(["--port=9000"])) == [user / "comfyui.log"]
    assert manager_log_paths(user, parse_launch_flags([])) == [user / "comfyui.log"]

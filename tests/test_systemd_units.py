"""The shipped systemd units: every hardening directive, a reason above each group, and
``systemd-analyze verify`` clean once ``service install`` has rendered them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.cli.service import plan_install, templates_dir

UNITS = templates_dir()
SYSTEM = UNITS / "oom-sentinel.service"
USER = UNITS / "oom-sentinel-user.service"
AGENT = UNITS / "oom-sentinel-notify-agent.service"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> (key, value) in order; keys may repeat (DeviceAllow=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"setting outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a setting: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], key: str) -> list[str]:
    return [v for k, v in unit["Service"] if k == key]


def one(unit: dict[str, list[tuple[str, str]]], key: str) -> str:
    found = values(unit, key)
    assert len(found) == 1, f"{key}: {found}"
    return found[0]


SYSTEM_EXPECTED = {
    "Type": "notify",
    "NotifyAccess": "main",
    "Restart": "always",
    "ExecReload": "/bin/kill -HUP $MAINPID",
    "OOMScoreAdjust": "-900",
    "MemoryMax": "256M",
    "MemoryLow": "96M",
    "MemoryMin": "48M",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "read-only",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "CAP_DAC_READ_SEARCH CAP_SYS_PTRACE CAP_SYSLOG",
    "DevicePolicy": "closed",
    "StateDirectory": "oom-sentinel",
    "StateDirectoryMode": "0700",
    "ConfigurationDirectory": "oom-sentinel",
    "SupplementaryGroups": "systemd-journal",
}


@pytest.mark.parametrize(
    ("key", "expected"), sorted(SYSTEM_EXPECTED.items()), ids=sorted(SYSTEM_EXPECTED)
)
def test_system_unit_has_every_hardening_directive(key: str, expected: str) -> None:
    assert one(parse_unit(SYSTEM.read_text()), key) == expected


def test_system_unit_reaches_the_nvidia_devices_without_private_devices() -> None:
    unit = parse_unit(SYSTEM.read_text())
    keys = {k for k, _ in unit["Service"]}
    # NVML needs /dev/nvidia*: PrivateDevices= would hide them. ProtectKernelLogs= would hide
    # /dev/kmsg, where the kernel's OOM-killer lines are.
    assert "PrivateDevices" not in keys and "ProtectKernelLogs" not in keys
    allowed = values(unit, "DeviceAllow")
    assert "/dev/nvidiactl rw" in allowed
    assert "char-nvidia-frontend rw" in allowed  # NVIDIA's proprietary module: major 195
    assert "char-nvidia rw" in allowed  # the open kernel modules name it "nvidia"
    assert "/dev/kmsg r" in allowed
    assert int(one(unit, "WatchdogSec").rstrip("s")) >= 30


def test_every_group_of_the_system_unit_says_why() -> None:
    text = SYSTEM.read_text()
    service = text[text.index("[Service]") + len("[Service]") : text.index("[Install]")]
    blocks = [b.strip().splitlines() for b in service.split("\n\n") if b.strip()]
    assert len(blocks) >= 6
    for block in blocks:
        assert block[0].startswith("#"), f"a group without a reason: {block[0]}"


def test_user_unit_is_a_notify_service_a_user_manager_can_start() -> None:
    unit = parse_unit(USER.read_text())
    for key, expected in {
        "Type": "notify",
        "NotifyAccess": "main",
        "Restart": "always",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "MemoryMax": "256M",
        "NoNewPrivileges": "yes",
    }.items():
        assert one(unit, key) == expected, key
    keys = {k for k, _ in unit["Service"]}
    # a user manager cannot lower the OOM score or restrict devices: such lines would fail it
    assert not keys & {"OOMScoreAdjust", "DevicePolicy", "DeviceAllow", "DynamicUser"}
    assert unit["Install"] == [("WantedBy", "default.target")]


def test_notify_agent_unit_runs_in_the_graphical_session() -> None:
    unit = parse_unit(AGENT.read_text())
    assert one(unit, "ExecStart").endswith("oom-sentinel notify-agent")
    assert ("PartOf", "graphical-session.target") in unit["Unit"]


def _rendered(tmp_path: Path, mode: str) -> Path:
    install = tmp_path / "ComfyUI"
    install.mkdir()
    settings = Settings.model_validate({"instances": [{"name": "main", "path": str(install)}]})
    plan = plan_install(mode, settings, config_path=None, unit_dir=tmp_path, discover=False)  # type: ignore[arg-type]
    assert plan.text is not None
    path = tmp_path / "oom-sentinel.service"
    path.write_text(plan.text)
    return path


def _verify(path: Path, user: bool, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "xdg-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"}
    args = ["systemd-analyze", *(["--user"] if user else []), "verify", str(path)]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd)",
)


@needs_analyze
@pytest.mark.parametrize("mode", ["system", "user"], ids=["system", "user"])
def test_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path, mode: str) -> None:
    path = _rendered(tmp_path, mode)
    proc = _verify(path, mode == "user", tmp_path)
    assert proc.returncode == 0, proc.stderr
    complaints = [line for line in proc.stderr.splitlines() if str(path) in line]
    assert complaints == []


@needs_analyze
def test_verify_does_catch_a_broken_unit(tmp_path: Path) -> None:
    path = _rendered(tmp_path, "system")
    path.write_text(
        path.read_text().replace("ProtectSystem=strict", "ProtectSystem=strict\nProtectSytem=yes")
    )
    proc = _verify(path, False, tmp_path)
    assert "Unknown key" in proc.stderr and "ProtectSytem" in proc.stderr

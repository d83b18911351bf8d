"""The service as a user would run it: the unit `service install` writes, started the way
systemd starts it (NOTIFY_SOCKET, WATCHDOG_USEC), an OOM of the stand-in ComfyUI, and the alert
arriving at a webhook on 127.0.0.1. Plus SIGHUP reload with a good and a bad config."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import Daemon, append, cuda_oom_record, snapshot_dirs, wait_for
from standin_proc import start_standin
from webhook_receiver import Receiver

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

pytestmark = pytest.mark.timeout(180)
MIB = 1024 * 1024


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


class NotifySocket:
    """What systemd listens on: collects the datagrams the service sends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def collect(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return self.messages

    def has(self, text: str) -> bool:
        return any(text in m for m in self.collect())


def _unit_exec(tmp_path: Path, config: Path) -> tuple[list[str], dict[str, str]]:
    """`service install --user --dry-run`: the ExecStart and Environment= systemd would use."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    proc = subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "service", "install", "--user", "--dry-run",
         "--config", str(config)],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    exec_start = next(
        line.split("=", 1)[1] for line in proc.stdout.splitlines() if line.startswith("ExecStart=")
    )
    unit_env: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("Environment="):
            for item in shlex.split(line.split("=", 1)[1]):
                key, _, value = item.partition("=")
                unit_env[key] = value
    return shlex.split(exec_start), unit_env


def test_readme_service_path_delivers_an_alert_for_a_standin_oom(
    tmp_path: Path, receiver: Receiver
) -> None:
    gpu = FakeGpuDir(tmp_path / "gpu").create(
        [FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)]
    )
    comfy = start_standin(tmp_path / "comfy", fake_gpu=gpu.root, manager_log=True)
    data = tmp_path / "data"
    config = tmp_path / "config.toml"
    config.write_text(
        f'data_dir = "{data}"\n'
        f'[[instances]]\nname = "studio"\npath = "{tmp_path / "comfy"}"\nurl = "{comfy.url}"\n'
        f'[alerts]\nurls = ["{receiver.url()}"]\nretry_initial_s = 1\n'
        "[discovery]\nprocesses = false\n"
        f'[gpu]\nbackend = "fake"\nfake_dir = "{gpu.root}"\n'
    )
    argv, unit_env = _unit_exec(tmp_path, config)
    assert argv[-1] == "run" and Path(argv[0]).name == "oom-sentinel"
    assert unit_env.get("OOM_SENTINEL_CONFIG") == str(config)
    notify = NotifySocket(tmp_path / "notify.sock")
    env = {
        **os.environ,
        **unit_env,
        "HOME": str(tmp_path / "home"),
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": "1000000",
    }
    err = (tmp_path / "service.stderr").open("w")
    service = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: notify.has("READY=1"), 30, "READY=1")
        wait_for(lambda: notify.has("WATCHDOG=1"), 10, "a watchdog ping")
        # the user's workflow runs out of VRAM on the 8 GiB card
        body = json.dumps(
            {
                "prompt": {
                    "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 64 * 1024}},
                    "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
                },
                "client_id": "user-browser",
            }
        ).encode()
        req = urllib.request.Request(
            f"{comfy.url}/prompt", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=10).read()
        wait_for(lambda: receiver.bodies, 60, "the alert at the webhook")
        alert = receiver.texts()[0]
        (snap,) = snapshot_dirs(data)
        assert snap.name in alert, alert
        assert "studio" in alert and "gpu" in alert.lower()
        service.send_signal(signal.SIGTERM)
        assert service.wait(20) == 0
        assert notify.has("STOPPING=1")
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
        err.close()
        comfy.stop()


def test_sighup_reloads_a_good_config_and_keeps_the_old_one_on_a_bad_one(
    tmp_path: Path, receiver: Receiver
) -> None:
    log = tmp_path / "comfyui.log"
    log.write_text("")
    base = "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 300\n"
    daemon = Daemon(tmp_path, logs=[log], config=base)
    notify = NotifySocket(tmp_path / "notify.sock")
    daemon.env["NOTIFY_SOCKET"] = str(notify.path)
    daemon.start()
    try:
        wait_for(lambda: notify.has("READY=1"), 20, "READY=1")
        daemon.config.write_text(base + f'[alerts]\nurls = ["{receiver.url("good")}"]\n')
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in daemon.stderr(), 20, "the reload line")
        assert notify.has("RELOADING=1")
        # a bad config: refused, the old one keeps running
        daemon.config.write_text(base + "[[instances]]\nport = 0\n")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "keeping the previous configuration" in daemon.stderr(), 20, "refusal")
        assert "instances[0].port: must be 1..65535, got 0" in daemon.stderr()
        assert daemon.proc.poll() is None
        # ... and the channel from the good reload still gets the next OOM
        from datetime import datetime

        append(log, cuda_oom_record(datetime(2026, 11, 30, 12, 0, 0)))
        wait_for(lambda: receiver.bodies, 60, "the alert after reloads")
    finally:
        assert daemon.stop() == 0

"""No secret reaches any output: a token in the ComfyUI URL and passwords and tokens in apprise
URLs are seeded, a real daemon watches the real stand-in through that URL, an OOM is alerted to
a real webhook receiver, and every output is grepped -- the daemon's log (connect, OOM, the
server going away), ``status`` and ``status --json``, ``config show`` and ``config show
--json``, the alert that went over the wire, and the snapshot's files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import Daemon, snapshot_dirs, wait_for
from standin_proc import start_standin
from webhook_receiver import Receiver

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
COMFY_TOKEN = "cmfy-TOKEN-5e6f7a8b9c0d"
HOOK_PASSWORD = "hookPASS-91a2b3"
HOOK_PATH_TOKEN = "hookPATHTOKEN4c5d6e"
BOT_TOKEN = "123456789:AAbbCCddEEffGGhhIIjjKKllMMnnOOppQQ"
DISCORD_TOKEN = "discordWEBHOOKtoken7f8e9d0c"
SECRETS = (COMFY_TOKEN, HOOK_PASSWORD, HOOK_PATH_TOKEN, BOT_TOKEN, DISCORD_TOKEN)


def cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    return done.stdout + done.stderr


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text or s.split(":")[-1] in text]


def test_no_seeded_secret_reaches_any_output(tmp_path: Path) -> None:
    gpu = FakeGpuDir(tmp_path / "gpu").create([FakeDevice(0, "NVIDIA RTX 4060", 8192 * MIB)])
    srv = start_standin(tmp_path / "comfy", fake_gpu=gpu.root)
    receiver = Receiver()
    daemon: Daemon | None = None
    try:
        hook = receiver.url(HOOK_PATH_TOKEN, auth=f"oom:{HOOK_PASSWORD}")
        urls = [hook, f"tgram://{BOT_TOKEN}/12345", f"discord://4242424242/{DISCORD_TOKEN}"]
        comfy_url = f"{srv.url}/?token={COMFY_TOKEN}"
        config = (
            "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
            f"[alerts]\nurls = {json.dumps(urls)}\nretry_initial_s = 1\n"
        )
        daemon = Daemon(
            tmp_path,
            comfyui=[comfy_url],
            config=config,
            env={"OOM_SENTINEL_FAKE_GPU": str(gpu.root)},
        ).start()
        # the token really goes with every request: the API answers through that URL
        wait_for(lambda: "is up" in daemon.stderr(), 30, f"the API; daemon:\n{daemon.stderr()}")
        prompt = {
            "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 64 * 1024}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }
        srv.post_prompt(prompt)
        wait_for(lambda: receiver.requests, 60, f"the alert; daemon:\n{daemon.stderr()}")
        wait_for(lambda: snapshot_dirs(daemon.data_dir), 30, "the snapshot")
        env = dict(daemon.env)
        outputs = {
            "status": cli("status", "--data-dir", str(daemon.data_dir), env=env),
            "status --json": cli("status", "--json", "--data-dir", str(daemon.data_dir), env=env),
            "config show": cli("config", "show", "--config", str(daemon.config), env=env),
            "config show --json": cli(
                "config", "show", "--json", "--config", str(daemon.config), env=env
            ),
        }
        assert "running as pid" in outputs["status"], outputs["status"]
        assert "json://" in outputs["config show"] and "tgram://" in outputs["config show"]
        srv.kill()  # the server goes away: the daemon logs the URL it lost
        wait_for(lambda: "went away" in daemon.stderr(), 30, "the disconnect")
        assert daemon.stop() == 0
        outputs["daemon log"] = daemon.all_stderr()
        # what was sent (the request's path and Authorization are the channel itself)
        outputs["alert"] = "\n".join(r.body.decode("utf-8", "replace") for r in receiver.requests)
        (snap,) = snapshot_dirs(daemon.data_dir)
        outputs["snapshot"] = "".join(
            p.read_text("utf-8", errors="replace") for p in sorted(snap.iterdir()) if p.is_file()
        )
        assert "127.0.0.1" in outputs["daemon log"] and "[REDACTED]" in outputs["daemon log"]
        for name, text in outputs.items():
            assert not leaked(text), f"{name} shows {leaked(text)}:\n{text[-3000:]}"
    finally:
        if daemon is not None and daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        srv.kill()
        receiver.close()

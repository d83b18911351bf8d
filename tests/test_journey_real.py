"""The product's promise on a real ComfyUI, end to end (runs only with a real checkout).

``$OOM_SENTINEL_REAL_COMFYUI`` names a real ComfyUI checkout (v0.8.0 history) and
``$OOM_SENTINEL_REAL_COMFYUI_PYTHON`` its interpreter. The test never touches that checkout: it
clones it into its own folder as the "upstream", adds a few small commits of its own on top of
the real history (one of which makes ``EmptyImage`` cost ~1.2 GB more), builds a custom node
pack of its own whose later commit does the same in its node, and installs both as a user would:

    W fits under A ──> git pull (core and pack) ──> ComfyUI restarted under a memory cap
                                                   ──> W fails: DefaultCPUAllocator
    daemon: run under A, snapshot with regression.suspected, alert "oom-bisect <id>"
    oom-bisect <id>: names both culprits, each with its own Δ peak
    oom-sentinel snapshots show <id>: names them first

The cap is an address-space limit set on the running ComfyUI (``prlimit``) a fixed headroom above
its idle size: the good workflow fits in it, either culprit's extra 1.2 GB does not, and a real
torch CPU allocation then fails the way §11 of the facts shows. The bisect replays without the
cap and judges by the peak RSS against the good state's.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import Daemon, load_snapshot_json, snapshot_dirs, snapshots_show, wait_for
from fork_start import clean_env, ready_or_stopped, real_comfy_args
from webhook_receiver import Receiver

from oom_sentinel.bisect.measure.workspace import free_port

pytestmark = [pytest.mark.real_comfyui, pytest.mark.slow, pytest.mark.timeout(1500)]

REAL_ENV = "OOM_SENTINEL_REAL_COMFYUI"
REAL_PYTHON_ENV = "OOM_SENTINEL_REAL_COMFYUI_PYTHON"
PACK = "ComfyUI-SentinelBoost"
GB = 1000**3
#: what each culprit allocates on top (float64 ones: touched, so resident)
EXTRA_ELEMENTS = 150 * 1024 * 1024  # 1.26 GB
#: address-space headroom over the idle server: W fits (~0.1 GB), W + 1.26 GB does not
CAP_HEADROOM = 800 * 1024 * 1024
#: the blob the public mirror lacks (comfyui-facts §11): left out of the upstream's checkout
TOKENIZER = "comfy/text_encoders/llama_tokenizer/tokenizer.json"
SPARSE = f"/*\n!/{TOKENIZER}\n"
#: the user's clone sits at commit USER_AT of our additions; BAD_AT raises memory
USER_AT, BAD_AT, N_OWN = 1, 3, 6

W = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 512, "height": 512, "batch_size": 1, "color": 7},
    },
    "2": {"class_type": "SentinelBoost", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
}


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="Journey Test",
        GIT_AUTHOR_EMAIL="journey@example.invalid",
        GIT_COMMITTER_NAME="Journey Test",
        GIT_COMMITTER_EMAIL="journey@example.invalid",
    )
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} in {cwd}: {proc.stderr}")
    return proc.stdout.strip()


def sparse_clone(source: Path, dest: Path) -> None:
    """A clone with the mirror's one missing blob left out (harmless ``invalid object`` line)."""
    git(dest.parent, "clone", "-q", "--no-checkout", str(source), dest.name)
    git(dest, "config", "core.sparseCheckout", "true")
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "sparse-checkout").write_text(SPARSE)
    git(dest, "checkout", "-q", "HEAD")


@dataclass
class Upstream:
    core: Path
    core_commits: list[str]  # our commits on top of the real history, oldest first
    pack: Path
    pack_commits: list[str]


def _patch_empty_image(nodes_py: Path) -> None:
    """The core culprit: EmptyImage touches ~1.26 GB of scratch while it runs."""
    text = nodes_py.read_text()
    anchor = "    def generate(self, width, height, batch_size=1, color=0):\n"
    assert anchor in text, "EmptyImage.generate not where v0.8.0 has it"
    scratch = (
        f"        _scratch = torch.ones({EXTRA_ELEMENTS}, dtype=torch.float64)"
        "  # journey test: the regression\n"
        "        del _scratch\n"
    )
    nodes_py.write_text(text.replace(anchor, anchor + scratch, 1))


def _pack_source(bad: bool, version: int) -> str:
    scratch = (
        f"        _scratch = torch.ones({EXTRA_ELEMENTS}, dtype=torch.float64)\n"
        "        del _scratch\n"
        if bad
        else ""
    )
    return (
        f'"""SentinelBoost, a node pack of the journey test (version {version})."""\n'
        "import torch\n\n\n"
        "class SentinelBoost:\n"
        "    @classmethod\n"
        "    def INPUT_TYPES(cls):\n"
        '        return {"required": {"image": ("IMAGE",)}}\n\n'
        '    RETURN_TYPES = ("IMAGE",)\n'
        '    FUNCTION = "boost"\n'
        '    CATEGORY = "image"\n\n'
        "    def boost(self, image):\n"
        f"{scratch}"
        "        return (image * 1.0,)\n\n\n"
        'NODE_CLASS_MAPPINGS = {"SentinelBoost": SentinelBoost}\n'
    )


def build_upstream(real: Path, base: Path) -> Upstream:
    base.mkdir(parents=True)
    core = base / "ComfyUI"
    sparse_clone(real, core)
    git(core, "checkout", "-q", "-B", "master")
    commits: list[str] = []
    # Our first commit drops the one blob the mirror lacks, so every commit the user and the
    # bisect check out is whole (git cannot build a tree that names a missing blob).
    git(core, "update-index", "--force-remove", TOKENIZER)
    for i in range(N_OWN):
        if i == BAD_AT:
            _patch_empty_image(core / "nodes.py")
            git(core, "commit", "-q", "-am", "nodes: EmptyImage keeps a float64 scratch buffer")
        else:
            notes = core / "JOURNEY_NOTES.md"
            notes.write_text((notes.read_text() if notes.exists() else "") + f"note {i}\n")
            git(core, "add", "JOURNEY_NOTES.md")
            git(core, "commit", "-q", "-m", f"docs: journey note {i}")
        commits.append(git(core, "rev-parse", "HEAD"))

    pack = base / PACK
    pack.mkdir()
    git(pack, "init", "-q", "-b", "main")
    pack_commits: list[str] = []
    for i in range(N_OWN):
        (pack / "__init__.py").write_text(_pack_source(i >= BAD_AT, i))
        git(pack, "add", "__init__.py")
        what = "boost: keep a scratch copy" if i == BAD_AT else f"boost: tidy {i}"
        git(pack, "commit", "-q", "-m", what)
        pack_commits.append(git(pack, "rev-parse", "HEAD"))
    return Upstream(core, commits, pack, pack_commits)


@dataclass
class RealServer:
    proc: subprocess.Popen[bytes]
    port: int
    console: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, prompt: dict[str, Any]) -> str:
        data = json.dumps({"prompt": prompt, "client_id": "user-tab"}).encode()
        req = urllib.request.Request(
            self.url + "/prompt", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return str(json.loads(resp.read())["prompt_id"])

    def history(self, prompt_id: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"{self.url}/history/{prompt_id}", timeout=10) as resp:
                found: dict[str, Any] = json.loads(resp.read())
                return found
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return {}

    def cap_address_space(self, headroom: int) -> int:
        """An address-space limit ``headroom`` above the idle server's size, set from outside."""
        vms = psutil.Process(self.proc.pid).memory_info().vms
        cap = vms + headroom
        psutil.Process(self.proc.pid).rlimit(resource.RLIMIT_AS, (cap, cap))
        return cap

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)


def start_server(install: Path, python: str, run_dir: Path, port: int) -> RealServer:
    """The user's ComfyUI, started the way a launcher does: ``main.py`` of the install."""
    args = [python, "main.py", *real_comfy_args(run_dir, port)]
    env = clean_env()
    console = run_dir / f"console-{int(time.time() * 1000)}.log"
    with console.open("wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=install,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    srv = RealServer(proc, port, console)
    ready_or_stopped(proc, port, 300.0, console, srv.stop)
    return srv


def wait_done(srv: RealServer, prompt_id: str) -> dict[str, Any]:
    entry: dict[str, Any] = wait_for(
        lambda: srv.history(prompt_id).get(prompt_id), 300, f"prompt {prompt_id}"
    )
    return entry


def repo_fingerprint(path: Path) -> tuple[str, str, str, str]:
    return (
        git(path, "rev-parse", "HEAD"),
        git(path, "status", "--porcelain", "--untracked-files=all"),
        git(path, "for-each-ref"),
        git(path, "stash", "list"),
    )


@pytest.fixture
def real() -> tuple[Path, str]:
    checkout = Path(os.environ[REAL_ENV])
    return checkout, os.environ.get(REAL_PYTHON_ENV) or sys.executable


@pytest.fixture
def user_install(tmp_path: Path, real: tuple[Path, str]) -> Iterator[tuple[Path, Upstream]]:
    upstream = build_upstream(real[0], tmp_path / "upstream")
    install = tmp_path / "ComfyUI"
    git(tmp_path, "clone", "-q", str(upstream.core), install.name)
    git(install, "reset", "-q", "--hard", upstream.core_commits[USER_AT])  # installed a while ago
    clone = install / "custom_nodes" / PACK
    git(install / "custom_nodes", "clone", "-q", str(upstream.pack), PACK)
    git(clone, "reset", "-q", "--hard", upstream.pack_commits[USER_AT])
    yield install, upstream


def test_an_update_that_raised_memory_is_alerted_and_bisected_to_both_culprits(
    tmp_path: Path, real: tuple[Path, str], user_install: tuple[Path, Upstream]
) -> None:
    started = time.monotonic()
    install, up = user_install
    python = real[1]
    port = free_port()
    servers: list[RealServer] = []
    receiver = Receiver()
    config = (
        "[discovery]\nenabled = false\ninterval_s = 1\n[logs]\npoll_interval_ms = 500\n"
        "[incidents]\nstorm_window_s = 0\n[install_state]\ndebounce_ms = 300\n"
        f'[alerts]\nurls = ["{receiver.url()}"]\nretry_initial_s = 1\n'
    )
    daemon = Daemon(tmp_path, comfyui=[str(install)], config=config)
    figures: dict[str, Any] = {}
    try:
        daemon.start(timeout_s=60)
        srv = start_server(install, python, tmp_path / "run", port)
        servers.append(srv)
        wait_for(lambda: f"API at {srv.url} is up" in daemon.stderr(), 120, "the API watcher")

        # 1. W fits under state A.
        ok = wait_done(srv, srv.post(W))
        assert ok["status"]["status_str"] == "success", ok["status"]

        # 2. "Update all": core and the pack move with real git pulls.
        git(install, "pull", "-q", "--ff-only")
        git(install / "custom_nodes" / PACK, "pull", "-q", "--ff-only")
        assert git(install, "rev-parse", "HEAD") == up.core_commits[-1]

        # 3. The launcher restarts ComfyUI at once, on a box with less memory to spare.
        srv.stop()
        srv = start_server(install, python, tmp_path / "run", port)
        servers.append(srv)
        figures["cap_bytes"] = srv.cap_address_space(CAP_HEADROOM)
        failed = wait_done(srv, srv.post(W))
        assert failed["status"]["status_str"] == "error", failed["status"]
        messages = json.dumps(failed["status"]["messages"])
        assert "DefaultCPUAllocator" in messages or "allocate" in messages, messages

        snap_dir: Path = wait_for(
            lambda: next(iter(snapshot_dirs(daemon.data_dir)), None),
            120,
            f"the snapshot; daemon said:\n{daemon.stderr()}",
        )
        snap = load_snapshot_json(snap_dir)
        assert snap["event"]["pool"] == "ram", snap["event"]
        regression = snap["regression"]
        assert regression["suspected"] is True, regression
        command = f"oom-bisect {snap_dir.name}"
        assert regression["bisect_command"] == command
        wait_for(
            lambda: any(command in t for t in receiver.texts()),
            120,
            f"the alert naming {command}; got {receiver.texts()}",
        )
    finally:
        receiver.close()
        for s in servers:
            s.stop()
        rc = daemon.stop()
    assert rc == 0 and "Traceback" not in daemon.all_stderr()
    figures["daemon_part_s"] = round(time.monotonic() - started, 1)

    # 4. The user runs the command the alert gave.
    before = {p: repo_fingerprint(p) for p in (install, install / "custom_nodes" / PACK)}
    env = {
        **os.environ,
        "HOME": str(daemon.home),
        "XDG_CONFIG_HOME": str(daemon.home / ".config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    bisect_started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "oom_sentinel.bisect",
            snap_dir.name,
            "--data-dir",
            str(daemon.data_dir),
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    figures["bisect_s"] = round(time.monotonic() - bisect_started, 1)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    doc = json.loads(proc.stdout)
    assert doc["result"] == "found", doc
    named = {(c["repo"], c["commit"]) for c in doc["culprits"]}
    assert named == {
        ("comfyui", up.core_commits[BAD_AT]),
        (f"node:{PACK}", up.pack_commits[BAD_AT]),
    }, doc["culprits"]
    for c in doc["culprits"]:
        delta = c["delta"]
        assert delta["pool"] == "ram" and not delta["lower_bound"], c
        assert delta["delta_bytes"] > 0.8 * GB, c  # each culprit adds ~1.26 GB on its own
        figures[f"delta_{c['repo']}"] = c["delta_text"]
    search = doc["search"]
    assert search["within_bound"], search
    figures["measurements"] = doc["measurements"]
    figures["bound"] = search["bound"]
    assert {p: repo_fingerprint(p) for p in before} == before, "oom-bisect changed the install"
    for p in psutil.process_iter(["cmdline"]):
        assert str(tmp_path / "cache") not in " ".join(p.info.get("cmdline") or [])

    # 5. The snapshot now answers with the culprits.
    shown = snapshots_show(snap_dir.name, daemon.data_dir, env)
    head = "\n".join(shown.splitlines()[:12])
    assert up.core_commits[BAD_AT][:10] in head and up.pack_commits[BAD_AT][:10] in head, head
    assert not re.search(r"run `?oom-bisect", shown), shown
    figures["total_s"] = round(time.monotonic() - started, 1)
    print("journey figures:", json.dumps(figures))

"""Builds ComfyUI-like installs with real git histories for the install-state tests.

Every git command runs with a fixed identity and explicit dates (reflog entries take the
committer date), with no system or global config, so histories are reproducible. Remotes are
recorded in their real-world spellings (HTTPS, SCP-style SSH, ssh://) while ``url.insteadOf``
points fetches at local upstream repos, so ``git pull`` works offline.

Layout made by ``build_install`` (``custom_nodes/``):

    ComfyUI-Foo/                       git, branch master, https remote (3 upstream commits)
    bar-nodes/                         git, detached HEAD, git@github.com: remote
    packed-pack/                       git, branch ref only in packed-refs, ssh:// remote
    nightly-pack/                      git clone known to the registry (.git/.cnr-id)
    Legacy-Pack.disabled/              git, disabled by suffix, credentials in its remote URL
    comfyui-kjnodes/                   registry (CNR) release: .tracking + pyproject 1.0.5
    .disabled/comfyui-impact-pack@8_8_1/   disabled CNR release (Manager v3+ convention)
    .disabled/ComfyUI-Old/             disabled plain folder
    plain-folder/                      plain folder
    my_node.py  old_node.py.disabled   single-file nodes
    __pycache__/  .hidden/  README.txt  example_node.py.example   (not nodes)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z

CORE_URL = "https://github.com/comfyanonymous/ComfyUI.git"


class Clock:
    """Deterministic, strictly increasing timestamps for commits and reflog entries."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def tick(self, seconds: int = 60) -> int:
        self.now += seconds
        return self.now


def git_env(at: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k != "EMAIL"}
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "Test Author",
            "GIT_AUTHOR_EMAIL": "author@example.com",
            "GIT_COMMITTER_NAME": "Test Committer",
            "GIT_COMMITTER_EMAIL": "committer@example.com",
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    if at is not None:
        env["GIT_AUTHOR_DATE"] = f"@{at} +0000"
        env["GIT_COMMITTER_DATE"] = f"@{at} +0000"
    return env


def git(cwd: Path, *args: str, at: int | None = None) -> str:
    proc = subprocess.run(
        ["git", "-c", "init.defaultBranch=master", "-c", "advice.detachedHead=false", *args],
        cwd=cwd,
        env=git_env(at),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} in {cwd} failed: {proc.stderr}")
    return proc.stdout.strip()


def commit_files(repo: Path, files: dict[str, str], message: str, at: int) -> str:
    for rel, text in files.items():
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(repo, "add", "-A", at=at)
    git(repo, "commit", "-q", "-m", message, at=at)
    return git(repo, "rev-parse", "HEAD")


def make_upstream(path: Path, name: str, clock: Clock, commits: int = 3) -> list[str]:
    """A repo with ``commits`` linear commits ``<name> 1..N``; returns their hashes."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    shas = []
    for i in range(1, commits + 1):
        shas.append(
            commit_files(
                path,
                {"__init__.py": f"NODE_CLASS_MAPPINGS = {{}}  # {name} v{i}\n"},
                f"{name} {i}",
                clock.tick(),
            )
        )
    return shas


def clone_with_url(upstream: Path, dest: Path, url: str, clock: Clock) -> None:
    """Clone ``upstream`` into ``dest`` and record ``url`` as origin (fetches still reach
    the local upstream through ``url.<upstream>.insteadOf``)."""
    git(dest.parent, "clone", "-q", str(upstream), dest.name, at=clock.tick())
    git(dest, "remote", "set-url", "origin", url)
    git(dest, "config", f"url.{upstream}.insteadOf", url)


@dataclass
class Install:
    root: Path
    clock: Clock
    upstreams: dict[str, Path] = field(default_factory=dict)
    shas: dict[str, list[str]] = field(default_factory=dict)

    @property
    def custom_nodes(self) -> Path:
        return self.root / "custom_nodes"


CORE_FILES = {
    "main.py": "print('stand-in ComfyUI')\n",
    "comfyui_version.py": '# generated\n__version__ = "0.3.1"\n',
    "pyproject.toml": '[project]\nname = "ComfyUI"\nversion = "0.3.1"\n',
    ".gitignore": "custom_nodes/\nuser/\nmodels/\n__pycache__/\n",
}


def build_core(base: Path, clock: Clock) -> tuple[Path, Path, list[str]]:
    """Upstream ComfyUI with two commits, and a clone of it; returns (upstream, clone, shas)."""
    upstream = base / "upstream" / "ComfyUI"
    upstream.mkdir(parents=True)
    git(upstream, "init", "-q")
    shas = [commit_files(upstream, CORE_FILES, "Initial stand-in", clock.tick())]
    shas.append(
        commit_files(
            upstream,
            {"comfyui_version.py": '__version__ = "0.3.2"\n', "model_management.py": "x = 1\n"},
            "Bump to 0.3.2",
            clock.tick(),
        )
    )
    install = base / "install"
    install.mkdir()
    clone_with_url(upstream, install / "ComfyUI", CORE_URL, clock)
    return upstream, install / "ComfyUI", shas


def build_install(base: Path, clock: Clock | None = None) -> Install:
    clock = clock or Clock()
    upstream_core, root, core_shas = build_core(base, clock)
    inst = Install(root=root, clock=clock)
    inst.upstreams["ComfyUI"] = upstream_core
    inst.shas["ComfyUI"] = core_shas
    cn = root / "custom_nodes"
    cn.mkdir()
    ups = base / "upstream"

    def node_repo(name: str, url: str, dest_name: str | None = None) -> Path:
        up = ups / name
        inst.upstreams[name] = up
        inst.shas[name] = make_upstream(up, name, clock)
        dest = cn / (dest_name or name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        clone_with_url(up, dest, url, clock)
        return dest

    node_repo("ComfyUI-Foo", "https://github.com/someone/ComfyUI-Foo.git")
    bar = node_repo("bar-nodes", "git@github.com:other/bar-nodes.git")
    git(bar, "checkout", "-q", inst.shas["bar-nodes"][0], at=clock.tick())
    packed = node_repo("packed-pack", "ssh://git@github.com/third/packed-pack.git")
    git(packed, "pack-refs", "--all", "--prune")
    nightly = node_repo("nightly-pack", "https://github.com/reg/nightly-pack")
    (nightly / ".git" / ".cnr-id").write_text("nightly-pack\n")
    node_repo(
        "Legacy-Pack",
        "https://someone:ghp_s3cretTOKEN@github.com/me/Legacy-Pack.git",
        dest_name="Legacy-Pack.disabled",
    )

    kj = cn / "comfyui-kjnodes"
    kj.mkdir()
    (kj / ".tracking").write_text("__init__.py\nnodes.py\n")
    (kj / "pyproject.toml").write_text('[project]\nname = "comfyui-kjnodes"\nversion = "1.0.5"\n')
    (kj / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    impact = cn / ".disabled" / "comfyui-impact-pack@8_8_1"
    impact.mkdir(parents=True)
    (impact / ".tracking").write_text("__init__.py\n")
    (impact / "pyproject.toml").write_text(
        '[project]\nname = "comfyui-impact-pack"\nversion = "8.8.1"\n'
    )
    (impact / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    old = cn / ".disabled" / "ComfyUI-Old"
    old.mkdir()
    (old / "__init__.py").write_text("# old\n")

    plain = cn / "plain-folder"
    (plain / "sub").mkdir(parents=True)
    (plain / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (plain / "sub" / "util.py").write_text("def f():\n    return 1\n")
    (plain / "__pycache__").mkdir()
    (plain / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\x00junk")
    (cn / "my_node.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "old_node.py.disabled").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "__pycache__").mkdir()
    (cn / ".hidden").mkdir()
    (cn / "README.txt").write_text("not a node\n")
    (cn / "example_node.py.example").write_text("# example\n")
    return inst


def repo_fingerprint(path: Path) -> dict[str, str]:
    """Everything a read-only capture must leave unchanged in one repo: HEAD, refs, the index
    (bytes and mtime), status, stash, config, reflog. Reads with optional locks off, so
    taking the fingerprint changes nothing either."""
    gitdir = path / ".git"
    index = gitdir / "index"
    result = {
        "HEAD": (gitdir / "HEAD").read_text(),
        "refs": git(path, "for-each-ref", "--format=%(refname) %(objectname)"),
        # --no-optional-locks: the check itself must not refresh (rewrite) the index.
        "status": git(
            path, "--no-optional-locks", "status", "--porcelain=v1", "--untracked-files=all"
        ),
        "stash": git(path, "stash", "list"),
        "config": (gitdir / "config").read_text(),
        "reflog": (gitdir / "logs" / "HEAD").read_text()
        if (gitdir / "logs" / "HEAD").exists()
        else "",
    }
    if index.exists():
        result["index"] = hashlib.sha256(index.read_bytes()).hexdigest()
        result["index_mtime"] = str(index.stat().st_mtime_ns)
    return result


def tree_fingerprint(root: Path) -> dict[str, str]:
    """Path → (size, mtime, sha256) of every file under ``root`` except inside ``.git``
    (the git metadata is compared by ``repo_fingerprint``)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            full = Path(dirpath) / name
            st = full.stat()
            digest = hashlib.sha256(full.read_bytes()).hexdigest()
            out[str(full.relative_to(root))] = f"{st.st_size}:{st.st_mtime_ns}:{digest}"
        for name in dirnames:
            out[str((Path(dirpath) / name).relative_to(root)) + "/"] = "dir"
    return out

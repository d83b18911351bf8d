"""Real git repos for the bisect tests: a small ComfyUI-shaped core, custom-node repos, and a
snapshot of everything a user could notice changing (so tests can assert "untouched").

Histories are written with one ``git fast-import`` per repo (fast on 2 shared cores); dates
are fixed so commit ids are stable within a run.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oom_sentinel.bisect.session.files import BisectPaths

BASE_TS = 1_700_000_000

ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}


def git(repo: Path, *args: str, ts: int | None = None, check: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(ENV)
    env["GIT_OPTIONAL_LOCKS"] = "0"  # our own status calls must not refresh the index
    if ts is not None:
        env["GIT_COMMITTER_DATE"] = f"{ts} +0000"
        env["GIT_AUTHOR_DATE"] = f"{ts} +0000"
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed in {repo}: {proc.stderr}")
    return proc.stdout


Change = Mapping[str, str | None]  # path -> content (None deletes)


def build_history(
    repo: Path,
    commits: Sequence[tuple[str, Change]],
    *,
    branch: str = "master",
    start_ts: int = BASE_TS,
    checkout: bool = True,
) -> list[str]:
    """Create ``repo`` (if needed) and append ``commits`` (message, changes) to ``branch``.

    Returns the new commit ids, oldest first.
    """
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", branch)
    parent = git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False).strip()
    chunks: list[bytes] = []
    for i, (msg, changes) in enumerate(commits):
        ts = start_ts + i * 60
        m = msg.encode()
        lines = [
            f"commit refs/heads/{branch}".encode(),
            f"mark :{i + 1}".encode(),
            f"author Test Author <author@example.com> {ts} +0000".encode(),
            f"committer Test Committer <committer@example.com> {ts} +0000".encode(),
            f"data {len(m)}".encode(),
            m,
        ]
        if i == 0 and parent:
            lines.append(f"from {parent}".encode())
        for path, content in changes.items():
            if content is None:
                lines.append(f"D {path}".encode())
            else:
                data = content.encode()
                lines += [f"M 100644 inline {path}".encode(), f"data {len(data)}".encode(), data]
        chunks.append(b"\n".join(lines) + b"\n\n")
    marks = repo / ".git" / "test-marks"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(ENV)
    subprocess.run(
        ["git", "-C", str(repo), "fast-import", "--quiet", f"--export-marks={marks}"],
        input=b"".join(chunks),
        env=env,
        check=True,
        capture_output=True,
    )
    ids = {}
    for line in marks.read_text().splitlines():
        mark, sha = line.split()
        ids[int(mark[1:])] = sha
    marks.unlink()
    if checkout:
        git(repo, "checkout", "-q", "-f", branch)
    return [ids[i + 1] for i in range(len(commits))]


CLI_ARGS_TEMPLATE = """import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::")
parser.add_argument("--port", type=int, default=8188)
parser.add_argument('--user-directory', type=str, default=None)
parser.add_argument("--input-directory", type=str, default=None)
parser.add_argument("--output-directory", type=str, default=None)
parser.add_argument("--temp-directory", type=str, default=None)
parser.add_argument("--extra-model-paths-config", type=str, default=None, metavar="PATH", nargs='+', action='append')
vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--gpu-only", action="store_true")
vram_group.add_argument('--lowvram', action='store_true')
vram_group.add_argument("--novram", action="store_true")
{extra}
"""


def cli_args_text(*, reserve_vram: bool, database: bool) -> str:
    extra = []
    if reserve_vram:
        extra.append('parser.add_argument("--reserve-vram", type=float, default=None)')
    if database:
        extra.append('parser.add_argument("--database-url", type=str, default="sqlite:///x.db")')
    return CLI_ARGS_TEMPLATE.format(extra="\n".join(extra))


def core_history(n: int) -> list[tuple[str, Change]]:
    """A ComfyUI-shaped history: ``--reserve-vram`` appears at commit n//3, the database flag
    at 2n//3, and every commit changes ``memory.txt`` (what a stand-in would allocate)."""
    commits: list[tuple[str, Change]] = []
    for i in range(n):
        changes: dict[str, str | None] = {
            "memory.txt": f"{100 + i}\n",
            "comfy/cli_args.py": cli_args_text(reserve_vram=i >= n // 3, database=i >= 2 * n // 3),
        }
        if i == 0:
            changes.update(
                {
                    "main.py": "print('stand-in main')\n",
                    ".gitignore": "/custom_nodes/*\n!/custom_nodes/example_node.py.example\n"
                    "!/custom_nodes/websocket_image_save.py\n/models/\n/user/\n/input/\n",
                    "custom_nodes/example_node.py.example": "# example\n",
                    "custom_nodes/websocket_image_save.py": "# tracked single-file node\n",
                }
            )
        if i == n // 2:
            changes["comfy/new_module.py"] = "X = 1\n"
        if i == n // 2 + 2:
            changes["comfy/new_module.py"] = None
        commits.append((f"core change {i}", changes))
    return commits


def node_history(name: str, n: int) -> list[tuple[str, Change]]:
    return [
        (
            f"{name} change {i}",
            {
                "__init__.py": f"NODE_CLASS_MAPPINGS = {{}}  # {name} v{i}\n",
                "version.txt": f"{i}\n",
            },
        )
        for i in range(n)
    ]


@dataclass
class UserInstall:
    root: Path  # the ComfyUI folder
    core: list[str]
    nodes: dict[str, list[str]]  # git node name -> commits

    @property
    def custom_nodes(self) -> Path:
        return self.root / "custom_nodes"


def make_install(base: Path, *, core_commits: int = 30, dirty: bool = True) -> UserInstall:
    """A user's ComfyUI with two git nodes, a folder node, a single-file node, a disabled git
    node, models, a stash entry, a dirty tracked file, an untracked file and local config.

        ComfyUI/                 core repo (core_commits commits on master, HEAD = tip)
          custom_nodes/
            node_a/              git, 12 commits, remote https://github.com/Someone/Node-A.git
            node_b/              git, 8 commits,  remote git@github.com:other/node_b
            old_pack.disabled/   git, 3 commits (disabled)
            loose_pack/          plain folder (no .git)
            single.py            single-file node
          models/checkpoints/a.safetensors, models/loras/
    """
    root = base / "ComfyUI"
    core = build_history(root, core_history(core_commits))
    git(root, "tag", "v-first", core[0])
    git(root, "tag", "v-mid", core[core_commits // 2])
    nodes: dict[str, list[str]] = {}
    cn = root / "custom_nodes"
    for name, n, url in (
        ("node_a", 12, "https://github.com/Someone/Node-A.git"),
        ("node_b", 8, "git@github.com:other/node_b"),
    ):
        nodes[name] = build_history(cn / name, node_history(name, n))
        git(cn / name, "remote", "add", "origin", url)
    build_history(cn / "old_pack.disabled", node_history("old_pack", 3))
    (cn / "loose_pack").mkdir()
    (cn / "loose_pack" / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "single.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (root / "models" / "checkpoints").mkdir(parents=True)
    (root / "models" / "loras").mkdir()
    (root / "models" / "checkpoints" / "a.safetensors").write_bytes(b"\0" * 64)
    (root / "input").mkdir()
    (root / "input" / "cat.png").write_bytes(b"png")
    if dirty:
        git(root, "config", "user.name", "Local User")
        git(root, "config", "bisect.custom", "kept")
        (root / "memory.txt").write_text("stashed edit\n")
        git(root, "stash", "push", "-q", "-m", "user stash", ts=BASE_TS + 99_000)
        (root / "main.py").write_text("print('locally modified')\n")
        (root / "notes-untracked.txt").write_text("mine\n")
        (cn / "node_a" / "version.txt").write_text("dirty node edit\n")
        (cn / "node_b" / "scratch.txt").write_text("untracked in node\n")
    return UserInstall(root, core, nodes)


def tree_snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every dir, file (content hash + mode) and symlink under ``root``, .git included."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = Path(dirpath, d)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            else:
                out[rel] = ("dir", stat.S_IMODE(p.lstat().st_mode))
        for f in filenames:
            p = Path(dirpath, f)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            else:
                out[rel] = (
                    "file",
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                    stat.S_IMODE(p.lstat().st_mode),
                )
    return out


def repo_facts(repo: Path) -> dict[str, str]:
    """What `git` itself reports: HEAD, refs, status, stash, config, index bytes."""
    gitdir = repo / ".git"
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "symbolic": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "status": git(repo, "status", "--porcelain", "--ignored", "--untracked-files=all"),
        "stash": git(repo, "stash", "list", "--format=%H %gs"),
        "config": (gitdir / "config").read_text(),
        "index": hashlib.sha256((gitdir / "index").read_bytes()).hexdigest(),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
    }


def install_snapshot(inst: UserInstall) -> dict[str, object]:
    repos = [inst.root, *(inst.custom_nodes / n for n in inst.nodes)]
    repos.append(inst.custom_nodes / "old_pack.disabled")
    facts = {str(r): repo_facts(r) for r in repos}  # before the tree: status must not write
    return {"facts": facts, "tree": tree_snapshot(inst.root)}


def untouched_install(name: str, what: str, **make_kw: Any) -> Any:
    """A module-scoped ``inst`` fixture: ``make_install`` under a temp dir named ``name``, and at
    teardown the assertion that nothing a user could notice changed (``what`` did it).

    Use: ``inst = untouched_install("runner", "the step loop")`` at module level.
    """

    @pytest.fixture(scope="module", name="inst")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserInstall]:
        inst = make_install(tmp_path_factory.mktemp(name), **make_kw)
        before = install_snapshot(inst)
        yield inst
        assert install_snapshot(inst) == before, f"{what} changed the user's install"

    return fixture


def session_paths() -> Any:
    """A ``paths`` fixture: the bisect session files of ``inst`` under this test's temp cache
    (``tmp_path/cache/bisect``), so each test starts without a session."""

    @pytest.fixture(name="paths")
    def fixture(tmp_path: Path, inst: UserInstall) -> BisectPaths:
        return BisectPaths.for_install(inst.root, home=tmp_path / "cache" / "bisect")

    return fixture


def clone_real_comfyui(real: Path, dest: Path) -> Path:
    """A user's install made from the real ComfyUI checkout ``real`` (never touched): a shared
    clone at ``dest`` whose checkout leaves out what the real one leaves out (a sparse mirror
    may lack a blob; its checkout prints "error: invalid object ..." and exits 0)."""
    git(dest.parent, "clone", "-q", "--shared", "--no-checkout", str(real), str(dest))
    patterns = git(real, "sparse-checkout", "list", check=False).split()
    if patterns:
        git(dest, "sparse-checkout", "set", "--no-cone", *patterns)
    git(dest, "checkout", "-q", "-f", "HEAD")
    return dest

"""The bisect's git seam (bisect/state/gitrepo.py): GitPython, one module, every Repo closed."""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from pathlib import Path

import psutil
import pytest
from bisect_git import git, make_install

from oom_sentinel.bisect.state import gitrepo
from oom_sentinel.daemon.core.errors import BadRef

BISECT = Path(__file__).resolve().parent.parent / "bisect"


def _git_children() -> list[str]:
    me = psutil.Process()
    out = []
    for child in me.children(recursive=True):
        try:
            if child.name() == "git" or "git" in os.path.basename(child.exe() or ""):
                out.append(" ".join(child.cmdline()))
        except psutil.Error:
            continue
    return out


def test_long_use_leaves_no_git_process_and_no_open_handle(tmp_path: Path) -> None:
    inst = make_install(tmp_path, core_commits=12, dirty=False)
    fds_before = psutil.Process().num_fds()
    for _ in range(30):
        head = gitrepo.resolve_commit(inst.root, "HEAD", "ComfyUI")
        info = gitrepo.commit_info(inst.root, head, "ComfyUI")
        assert info.sha == head and info.subject == "core change 11"
        assert gitrepo.first_parent_range(inst.root, inst.core[3], head, "ComfyUI") == tuple(
            inst.core[4:]
        )
        assert gitrepo.core_node_entries(inst.root, [head], "ComfyUI") == {
            "websocket_image_save.py",
            "example_node.py.example",
        }
    # GitPython keeps `git cat-file --batch` per Repo until close(): none may be left
    assert _git_children() == []
    assert psutil.Process().num_fds() <= fds_before + 2


def test_commit_info_lists_the_first_parent_diff_renames_as_both_paths(tmp_path: Path) -> None:
    inst = make_install(tmp_path, core_commits=4, dirty=False)
    git(inst.root, "mv", "memory.txt", "memory2.txt")
    git(inst.root, "commit", "-q", "-m", "Rename memory.txt")
    head = gitrepo.resolve_commit(inst.root, "HEAD", "ComfyUI")
    info = gitrepo.commit_info(inst.root, head, "ComfyUI")
    assert info.files == ("memory.txt", "memory2.txt")
    assert info.author == "Test Author <author@example.com>"
    root = gitrepo.commit_info(inst.root, inst.core[0], "ComfyUI")  # no parent
    assert "main.py" in root.files and root.date.startswith("2023-")


@pytest.mark.parametrize("ref", ["nope", "-rf", "a b", "HEAD@{99}"])
def test_refs_that_are_not_commits_are_one_line_errors(tmp_path: Path, ref: str) -> None:
    inst = make_install(tmp_path, core_commits=3, dirty=False)
    with pytest.raises(BadRef, match=r"^ComfyUI: .* is not a commit$"):
        gitrepo.resolve_commit(inst.root, ref, "ComfyUI")


def test_the_scrubbed_variables_never_redirect_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inst = make_install(tmp_path / "a", core_commits=3, dirty=False)
    other = make_install(tmp_path / "b", core_commits=5, dirty=False)
    monkeypatch.setenv("GIT_DIR", str(other.root / ".git"))  # a hook's leftover
    assert gitrepo.resolve_commit(inst.root, "HEAD", "ComfyUI") == inst.core[-1]


def test_only_gitrepo_runs_git_in_the_bisect() -> None:
    """One adapter: GitPython is imported by gitrepo.py alone, and no other bisect module
    starts a git process by hand."""
    for path in sorted(BISECT.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        imports = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
        if path.name == "gitrepo.py":
            assert "git" in imports
            assert "subprocess" not in imports
            continue
        assert "git" not in imports, f"{path.name} imports GitPython"
        assert not ("subprocess" in imports and "git" in literals), f"{path.name} runs git"


# ---- a writing git command dies with oom-bisect ------------------------------------------------

#: runs one git command through gitrepo's runner that cannot finish by itself: ``hash-object``
#: of a FIFO blocks in open() until a writer comes (none does), inside git, with no child
BLOCKED_GIT = """
import sys
from pathlib import Path
from oom_sentinel.bisect.state import gitrepo
gitrepo._run(Path(sys.argv[1]), ["hash-object", "--", sys.argv[2]], what="test", config={},
             env=None, pass_fds=())
"""


def _poll(predicate, timeout_s: float) -> bool:
    """Whether ``predicate()`` came true within ``timeout_s`` (asked every 20 ms)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_git_child_dies_when_oom_bisect_is_killed(tmp_path: Path) -> None:
    import signal
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    parent = subprocess.Popen([sys.executable, "-c", BLOCKED_GIT, str(repo), str(fifo)])
    children: list[psutil.Process] = []

    def git_started() -> bool:
        try:
            kids = psutil.Process(parent.pid).children()
            children[:] = [k for k in kids if "hash-object" in " ".join(k.cmdline())]
        except psutil.Error:
            return False
        return bool(children)

    try:
        assert _poll(git_started, 60.0), "the git command never started"
        (child,) = children
        os.kill(parent.pid, signal.SIGKILL)  # oom-bisect dies without any cleanup
        parent.wait(timeout=30)
        assert _poll(lambda: _gone(child), 15.0), "git outlived the killed oom-bisect"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for proc in children:  # only the git this test started
            with contextlib.suppress(psutil.Error):
                proc.kill()

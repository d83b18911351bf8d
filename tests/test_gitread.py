"""``gitread`` against git itself: every repo shape is built with real ``git`` and each answer
compared with what ``git rev-parse`` / ``symbolic-ref`` / ``config`` say about it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from oom_sentinel.daemon.core.gitread import git_dirs, read_head, remote_urls
from oom_sentinel.daemon.install.state import git_head, normalize_remote_url

ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin:/usr/local/bin",
}


def git(repo: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=ENV, check=check
    )
    return done.stdout.strip()


def make_repo(path: Path, commits: int = 2) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "master")
    for i in range(commits):
        (path / "f.txt").write_text(f"{i}\n")
        git(path, "add", "f.txt")
        git(path, "commit", "-q", "-m", f"c{i}")
    return path


def what_git_says(repo: Path) -> tuple[str | None, str | None]:
    commit = git(repo, "rev-parse", "-q", "--verify", "HEAD", check=False) or None
    branch = git(repo, "symbolic-ref", "-q", "HEAD", check=False) or None
    if branch and branch.startswith("refs/heads/"):
        branch = branch[len("refs/heads/") :]
    return commit, branch


def what_we_read(repo: Path) -> tuple[str | None, str | None]:
    dirs = git_dirs(repo)
    assert dirs is not None
    return read_head(*dirs)


def test_a_branch_checkout(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    assert what_we_read(repo) == what_git_says(repo)
    assert what_we_read(repo)[1] == "master"


def test_a_detached_head(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    commit, branch = what_we_read(repo)
    assert (commit, branch) == what_git_says(repo)
    assert branch is None and commit is not None


def test_packed_refs_only(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "tag", "-a", "v1", "-m", "annotated: its peel line must not confuse the reader")
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "master").exists()
    assert what_we_read(repo) == what_git_says(repo)


def test_a_loose_ref_wins_over_a_stale_packed_one(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "pack-refs", "--all")
    (repo / "f.txt").write_text("later\n")
    git(repo, "commit", "-qam", "after packing")  # writes a loose ref, packed one now stale
    assert what_we_read(repo) == what_git_says(repo)


def test_a_symbolic_ref_chain(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/master")
    git(repo, "symbolic-ref", "HEAD", "refs/heads/alias")
    commit, branch = what_we_read(repo)
    assert commit == git(repo, "rev-parse", "HEAD")
    assert branch == "alias"


def test_an_unborn_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", commits=0)
    assert what_we_read(repo) == (None, "master") == what_git_says(repo)


def test_a_looping_ref_is_unknown_not_a_hang(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    (repo / ".git" / "refs" / "heads" / "a").write_text("ref: refs/heads/b\n")
    (repo / ".git" / "refs" / "heads" / "b").write_text("ref: refs/heads/a\n")
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/a\n")
    assert what_we_read(repo) == (None, "a")


def test_a_garbage_ref_is_unknown(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    (repo / ".git" / "refs" / "heads" / "master").write_text("not a sha\n")
    assert what_we_read(repo) == (None, "master")


def test_a_linked_worktree_reads_its_own_head_and_the_common_refs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "side", str(wt), "HEAD~1")
    assert (wt / ".git").is_file()
    assert what_we_read(wt) == what_git_says(wt)
    assert what_we_read(wt)[1] == "side"
    assert what_we_read(repo) == what_git_says(repo)


def test_a_relative_gitdir_file(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "store" / "r")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".git").write_text("gitdir: ../store/r/.git\n")
    assert what_we_read(tree) == what_git_says(repo)


def test_no_git_dir_at_all(tmp_path: Path) -> None:
    assert git_dirs(tmp_path) is None
    (tmp_path / ".git").write_text("gitdir: /no/such/dir\n")
    assert git_dirs(tmp_path) is None
    assert git_head(tmp_path).commit is None


def test_sha256_repositories(tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.mkdir()
    if subprocess.run(
        ["git", "-C", str(path), "init", "-q", "--object-format=sha256"], env=ENV, check=False
    ).returncode:
        pytest.skip("this git cannot make SHA-256 repositories")
    (path / "f").write_text("x")
    git(path, "add", "f")
    git(path, "commit", "-q", "-m", "c")
    commit, _ = what_we_read(path)
    assert commit is not None and len(commit) == 64
    assert (commit, what_we_read(path)[1]) == what_git_says(path)


CONFIG = r"""
[core]
	repositoryformatversion = 0
	url = https://not-a-remote.example/core
[remote "upstream"]
	url = https://github.com/comfyanonymous/ComfyUI.git ; a comment
	fetch = +refs/heads/*:refs/remotes/upstream/*
[Remote "origin"]
	URL = "https://github.com/me/ComfyUI # with a hash"
[remote "odd \"name\""]
	url = https://example.com/a\
b.git
[remote "no-url"]
	fetch = +refs/heads/*:refs/remotes/no-url/*
[remote "inline"] url = git@github.com:o/inline.git
"""


def test_remote_urls_match_git_config(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", commits=1)
    (repo / ".git" / "config").write_text(CONFIG)
    out = git(repo, "config", "--null", "--get-regexp", r"^remote\..*\.url$")
    expected = []
    for item in out.split("\0"):
        if item:
            key, _, value = item.partition("\n")
            expected.append((key[len("remote.") : -len(".url")], value))
    assert len(expected) == 4
    assert remote_urls(repo / ".git") == expected
    assert ("origin", "https://github.com/me/ComfyUI # with a hash") in expected
    # origin, not the first remote; normalized the one way the states spell URLs
    assert git_head(repo).url == normalize_remote_url("https://github.com/me/ComfyUI # with a hash")


def test_origin_is_preferred_then_the_first_remote(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", commits=1)
    git(repo, "remote", "add", "fork", "https://github.com/someone/fork.git")
    assert git_head(repo).url == "https://github.com/someone/fork"
    git(repo, "remote", "add", "origin", "https://github.com/comfyanonymous/ComfyUI.git")
    assert git_head(repo).url == "https://github.com/comfyanonymous/ComfyUI"


def test_an_unreadable_or_garbage_config_gives_no_url(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", commits=1)
    head = git(repo, "rev-parse", "HEAD")
    (repo / ".git" / "config").write_bytes(b"\xff\xfe[remote \x00 garbage\n= = =\n[")
    assert remote_urls(repo / ".git") == []
    assert git_head(repo).commit == head
    (repo / ".git" / "config").unlink()
    assert remote_urls(repo / ".git") == []


def test_a_ref_pointing_outside_the_git_dir_is_not_followed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    sha = git(repo, "rev-parse", "HEAD")
    outside = tmp_path / "outside"
    outside.write_text(sha + "\n")  # a file that would pass for a ref
    for target in (str(outside), "refs/../../../outside", "../outside"):
        (repo / ".git" / "HEAD").write_text(f"ref: {target}\n")
        assert what_we_read(repo)[0] is None

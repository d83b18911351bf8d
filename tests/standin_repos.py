"""Real git histories of the stand-in ComfyUI and of custom node packs, for the bisect tests.

``build_core_repo`` makes a repo whose every commit is a runnable stand-in install (``main.py``, a
generated ``comfy/cli_args.py``, ``comfyui_version.py``, ``standin_tuning.json``): a linear
first-parent history with realistic subjects and release bumps, one *bad* commit where the
memory factor rises, an optional range of commits that do not start (a syntax error in
``main.py``), flags that appear part-way (old commits' ``cli_args.py`` lacks them, so their
argparse exits 2), core "features" that node packs may depend on, and optional merge commits.
``build_node_repo`` makes a custom node pack whose bad commit scales a core node's memory,
optionally only when the core has a feature (the node's commit is bad only with the new core).

Histories are written with one ``git fast-import`` stream: 2,000 commits take well under a
second, where 2,000 ``git commit`` processes take minutes. Dates, authors and subjects are
deterministic, so commit ids are the same on every run with the same arguments.

    index:   0      1 ...   u0 ... u1-1   u1 ...   bad ...   n-1
             root          [ won't start ]         factor up  HEAD
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
STANDIN_FILES = (
    "execution.py",
    "main.py",
    "standin_api.py",
    "standin_execution.py",
    "standin_logging.py",
    "standin_memory.py",
    "standin_nodes.py",
    "standin_server.py",
)
#: The date of the root commit; each later commit is three hours after the previous one.
START_EPOCH_S = 1759276800  # 2025-10-01T00:00:00Z
STEP_S = 3 * 3600
AUTHORS = (
    ("Ada Lindqvist", "ada@example.org"),
    ("Bram Okafor", "bram@example.org"),
    ("Chen Wei", "chen.wei@example.org"),
    ("Dora Petrescu", "dora@example.org"),
    ("Emeka Ncube", "emeka@example.org"),
)
_AREAS = (
    "sampler",
    "vae",
    "attention",
    "model loading",
    "lora",
    "controlnet",
    "text encoder",
    "scheduler",
    "latent preview",
    "api nodes",
    "frontend",
    "image nodes",
)
_VERBS = (
    "Fix",
    "Improve",
    "Refactor",
    "Clean up",
    "Speed up",
    "Support",
    "Add tests for",
    "Handle edge case in",
    "Update",
)
CHURN_FILES = tuple(f"comfy/changes/{area.replace(' ', '_')}.txt" for area in _AREAS)
SYNTAX_ERROR = "\ndef broken_startup(:  # refactor in progress\n    pass\n"


@dataclass(frozen=True)
class BuiltRepo:
    """What was built, so tests can assert the culprit and the number of steps."""

    path: Path
    #: first-parent commits, oldest first; index 0 is the root commit
    commits: tuple[str, ...]
    subjects: tuple[str, ...]
    #: index of the first bad commit (None: the whole history is good)
    bad_index: int | None
    #: indices of first-parent commits that cannot be tested (won't start / won't import)
    untestable: tuple[int, ...] = ()
    #: first-parent indices that are merge commits, and the commits only reachable through them
    merge_indices: tuple[int, ...] = ()
    side_commits: tuple[str, ...] = ()
    #: feature name -> first index that has it (core)
    feature_indices: Mapping[str, int] = field(default_factory=dict)
    #: flag -> first index whose comfy/cli_args.py declares it (core)
    flag_introductions: Mapping[str, int] = field(default_factory=dict)
    #: index -> version for release-bump commits (core)
    version_bumps: Mapping[int, str] = field(default_factory=dict)
    branch: str = "master"
    #: the pack's directory name under custom_nodes/ (node repos)
    node_dir_name: str | None = None

    @property
    def head(self) -> str:
        return self.commits[-1]

    @property
    def bad_commit(self) -> str | None:
        return None if self.bad_index is None else self.commits[self.bad_index]

    def index_of(self, sha: str) -> int:
        for i, commit in enumerate(self.commits):
            if commit.startswith(sha):
                return i
        raise KeyError(sha)


# ---- fast-import stream --------------------------------------------------------------------------
class _Stream:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.mark = 0

    def blob_inline(self, path: str, content: bytes) -> bytes:
        return (
            b"M 100644 inline "
            + path.encode()
            + b"\ndata "
            + str(len(content)).encode()
            + b"\n"
            + content
            + b"\n"
        )

    def commit(
        self,
        ref: str,
        subject: str,
        body: str,
        author: tuple[str, str],
        when_s: int,
        parent: int | None,
        merge: int | None,
        changes: Mapping[str, bytes | None],
    ) -> int:
        self.mark += 1
        ident = f"{author[0]} <{author[1]}> {when_s} +0000".encode()
        message = (subject + ("\n\n" + body if body else "") + "\n").encode()
        out = [b"commit " + ref.encode() + b"\n", b"mark :" + str(self.mark).encode() + b"\n"]
        out += [b"author " + ident + b"\n", b"committer " + ident + b"\n"]
        out += [b"data " + str(len(message)).encode() + b"\n" + message]
        if parent is not None:
            out.append(b"from :" + str(parent).encode() + b"\n")
        if merge is not None:
            out.append(b"merge :" + str(merge).encode() + b"\n")
        for path in sorted(changes):
            content = changes[path]
            if content is None:
                out.append(b"D " + path.encode() + b"\n")
            else:
                out.append(self.blob_inline(path, content))
        out.append(b"\n")
        self.parts.append(b"".join(out))
        return self.mark

    def run(self, repo: Path) -> dict[int, str]:
        marks = repo / ".git" / "standin-marks"
        stream = b"".join(self.parts) + b"done\n"
        subprocess.run(
            ["git", "fast-import", "--quiet", "--done", f"--export-marks={marks}"],
            cwd=repo,
            input=stream,
            check=True,
            capture_output=True,
        )
        out = {}
        for line in marks.read_text().splitlines():
            mark, sha = line.split()
            out[int(mark[1:])] = sha
        marks.unlink()
        return out


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _init(path: Path, branch: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", branch)
    _git(path, "config", "user.name", "Stand-in Builder")
    _git(path, "config", "user.email", "builder@example.org")
    _git(path, "config", "commit.gpgsign", "false")


def _finish(path: Path) -> None:
    _git(path, "reset", "-q", "--hard")


def _subject(rng: random.Random, pr: int) -> str:
    return f"{rng.choice(_VERBS)} {rng.choice(_AREAS)} {rng.choice(('handling', 'memory use', 'logic', 'defaults', 'errors', 'on small GPUs', 'with batch size > 1'))} (#{pr})"


# ---- the core repo -------------------------------------------------------------------------------
def cli_args_source(absent_flags: Iterable[str] = ()) -> str:
    """The stand-in's cli_args template as ``comfy/cli_args.py``, without ``absent_flags``."""
    absent = set(absent_flags)
    lines = []
    for line in (STANDIN_DIR / "cli_args_template.py").read_text("utf-8").splitlines(keepends=True):
        match = re.search(r"\.add_argument\(\"(--[\w-]+)\"", line)
        if match and match.group(1) in absent:
            continue
        lines.append(line)
    return "".join(lines)


def _version_file(version: str) -> bytes:
    return f'# This file is automatically generated by the build process when version is\n# updated in pyproject.toml.\n__version__ = "{version}"\n'.encode()


def _pyproject(version: str) -> bytes:
    return f'[project]\nname = "ComfyUI"\nversion = "{version}"\nreadme = "README.md"\nrequires-python = ">=3.10"\n'.encode()


def _tuning(
    factor: float, features: Sequence[str], noise: float, extra: Mapping[str, object]
) -> bytes:
    data: dict[str, object] = {
        "memory_factor": factor,
        "features": sorted(features),
        "noise_fraction": noise,
    }
    data.update(extra)
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


#: The single-file node ComfyUI's own repository tracks under custom_nodes/ (every real install
#: has it, as a file of the core's commit): the stand-in core ships one too.
WEBSOCKET_IMAGE_SAVE = b'''"""The stand-in's copy of the single-file node ComfyUI's own repository tracks under
``custom_nodes/`` (``websocket_image_save.py``, node ``SaveImageWebsocket``): every real install
has it, as a file of the core's commit, not as a custom node of its own."""

from typing import Any


class SaveImageWebsocket:
    CATEGORY = "api node/image/Save"
    RETURN_TYPES = ()
    FUNCTION = "save_images"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"images": ("IMAGE",)}}

    def save_images(self, images: Any) -> dict[str, Any]:
        return {}

    @classmethod
    def IS_CHANGED(cls, images: Any) -> float:
        return 0.0


NODE_CLASS_MAPPINGS = {"SaveImageWebsocket": SaveImageWebsocket}
'''

GITIGNORE = b"""__pycache__/
*.py[cod]
/output/
/input/
/temp/
/user/
/models/
!/models/**/put_*_here
/custom_nodes/
!/custom_nodes/example_node.py.example
!/custom_nodes/websocket_image_save.py
extra_model_paths.yaml
*.log
"""


def build_core_repo(
    path: Path,
    n_commits: int = 320,
    *,
    bad_commit_index: int | None = 200,
    good_memory_factor: float = 1.0,
    bad_memory_factor: float = 1.6,
    untestable_range: tuple[int, int] | None = None,
    feature_from: Mapping[str, int] | None = None,
    flag_introductions: Mapping[str, int] | None = None,
    noise_fraction: float = 0.0,
    merges_at: Sequence[int] = (),
    release_every: int = 20,
    start_version: tuple[int, int, int] = (0, 7, 0),
    extra_tuning: Mapping[str, object] | None = None,
    branch: str = "master",
    seed: int = 1,
) -> BuiltRepo:
    """A stand-in ComfyUI history of ``n_commits`` first-parent commits.

    ``bad_commit_index``: the first commit whose ``memory_factor`` is ``bad_memory_factor``.
    ``untestable_range=(a, b)``: commits ``a .. b-1`` have a syntax error in ``main.py``.
    ``feature_from={"name": i}``: ``standin_api.has_feature("name")`` is true from commit ``i``.
    ``flag_introductions={"--reserve-vram": i}``: commits before ``i`` do not know the flag.
    ``merges_at``: first-parent indices that merge a two-commit side branch.
    """
    if n_commits < 2:
        raise ValueError("a history needs at least 2 commits")
    if bad_commit_index is not None and not 1 <= bad_commit_index < n_commits:
        raise ValueError(f"bad_commit_index must be in 1..{n_commits - 1}")
    features_at = dict(feature_from or {})
    flags_at = dict(flag_introductions or {})
    rng = random.Random(seed)
    _init(path, branch)
    stream = _Stream()
    ref = f"refs/heads/{branch}"
    main_source = (STANDIN_DIR / "main.py").read_bytes()

    def state_at(i: int) -> dict[str, bytes]:
        factor = (
            bad_memory_factor
            if bad_commit_index is not None and i >= bad_commit_index
            else good_memory_factor
        )
        feats = [name for name, at in features_at.items() if i >= at]
        absent = [flag for flag, at in flags_at.items() if i < at]
        broken = untestable_range is not None and untestable_range[0] <= i < untestable_range[1]
        return {
            "main.py": main_source + (SYNTAX_ERROR.encode() if broken else b""),
            "comfy/cli_args.py": cli_args_source(absent).encode(),
            "standin_tuning.json": _tuning(factor, feats, noise_fraction, extra_tuning or {}),
        }

    version = list(start_version)
    files: dict[str, bytes] = {name: (STANDIN_DIR / name).read_bytes() for name in STANDIN_FILES}
    files.update(state_at(0))
    files.update(
        {
            ".gitignore": GITIGNORE,
            "README.md": b"# ComfyUI (stand-in)\n\nA generated history of the oom-sentinel test stand-in.\n",
            "comfyui_version.py": _version_file(".".join(map(str, version))),
            "pyproject.toml": _pyproject(".".join(map(str, version))),
            "requirements.txt": b"aiohttp\npsutil\npyyaml\n",
            "custom_nodes/example_node.py.example": b"# Copy to example_node.py to try a custom node.\n",
            # a single-file node the core tracks, as ComfyUI's repo tracks this very file
            "custom_nodes/websocket_image_save.py": WEBSOCKET_IMAGE_SAVE,
            "models/checkpoints/put_checkpoints_here": b"",
        }
    )
    for churn in CHURN_FILES:
        files[churn] = b"rev 0\n"

    marks: list[int] = []
    subjects: list[str] = []
    side_marks: list[int] = []
    bumps: dict[int, str] = {}
    merge_set = set(merges_at)
    previous = dict(files)
    mark = stream.commit(ref, "Initial commit", "", AUTHORS[0], START_EPOCH_S, None, None, files)
    marks.append(mark)
    subjects.append("Initial commit")
    pr = 9000

    for i in range(1, n_commits):
        pr += rng.randint(1, 40)
        when = START_EPOCH_S + i * STEP_S
        author = AUTHORS[i % len(AUTHORS)]
        current = dict(previous)
        current.update(state_at(i))
        subject = ""
        body = ""
        if bad_commit_index == i:
            subject = f"Keep offloaded weights pinned between steps for faster sampling (#{pr})"
            body = "Trades host memory for speed on partial loads."
        elif untestable_range is not None and i == untestable_range[0]:
            subject = f"Refactor startup and argument handling (#{pr})"
        elif untestable_range is not None and i == untestable_range[1]:
            subject = f"Fix startup after the argument refactor (#{pr})"
        elif i in features_at.values():
            name = next(n for n, at in features_at.items() if at == i)
            subject = f"Add {name.replace('_', ' ')} (#{pr})"
        elif i in flags_at.values():
            flag = next(f for f, at in flags_at.items() if at == i)
            subject = f"Add {flag} argument (#{pr})"
        elif release_every and i % release_every == 0:
            version[2] += 1
            text = ".".join(map(str, version))
            current["comfyui_version.py"] = _version_file(text)
            current["pyproject.toml"] = _pyproject(text)
            subject = f"ComfyUI v{text}"
            bumps[i] = text
        else:
            churn = CHURN_FILES[rng.randrange(len(CHURN_FILES))]
            current[churn] = f"rev {i}\n".encode()
            subject = _subject(rng, pr)
        changes = {p: c for p, c in current.items() if previous.get(p) != c}
        merge_mark = None
        if i in merge_set:
            side_parent = marks[-1]
            side_file = f"comfy/changes/branch_{i}.txt"
            for k in (1, 2):
                side_parent = stream.commit(
                    f"refs/heads/side-{i}",
                    f"WIP: experiment {i}.{k}",
                    "",
                    AUTHORS[(i + k) % len(AUTHORS)],
                    when - 1800 + k * 60,
                    side_parent,
                    None,
                    {side_file: f"side {k}\n".encode()},
                )
                side_marks.append(side_parent)
            merge_mark = side_parent
            current[side_file] = b"side 2\n"
            changes[side_file] = b"side 2\n"
            subject = f"Merge branch 'experiment-{i}'"
        mark = stream.commit(ref, subject, body, author, when, marks[-1], merge_mark, changes)
        marks.append(mark)
        subjects.append(subject)
        previous = current

    shas = stream.run(path)
    for i in merge_set:
        _git(path, "branch", "-q", "-D", f"side-{i}")
    _finish(path)
    untestable = tuple(range(*untestable_range)) if untestable_range else ()
    return BuiltRepo(
        path=path,
        commits=tuple(shas[m] for m in marks),
        subjects=tuple(subjects),
        bad_index=bad_commit_index,
        untestable=untestable,
        merge_indices=tuple(sorted(merge_set)),
        side_commits=tuple(shas[m] for m in side_marks),
        feature_indices=features_at,
        flag_introductions=flags_at,
        version_bumps=bumps,
        branch=branch,
    )


# ---- custom node repos ---------------------------------------------------------------------------
def _node_init(
    pack: str,
    node_class: str,
    revision: int,
    scale: tuple[str, float] | None,
    requires_feature: str | None,
    broken: bool,
) -> bytes:
    lines = [
        f'"""{pack}: a custom node pack for the stand-in ComfyUI (generated for tests)."""',
        "",
        "import standin_api",
        "",
        f"REVISION = {revision}",
        "",
        "",
        f"class {node_class}:",
        '    CATEGORY = "utils"',
        '    RETURN_TYPES = ("*",)',
        '    FUNCTION = "run"',
        "",
        "    @classmethod",
        "    def INPUT_TYPES(cls):",
        '        return {"required": {"value": ("*", {})}}',
        "",
        "    def run(self, value):",
        "        return (value,)",
        "",
        "",
    ]
    if scale is not None:
        call = f"standin_api.scale_memory({scale[0]!r}, {scale[1]!r})"
        if requires_feature:
            lines += [f"if standin_api.has_feature({requires_feature!r}):", f"    {call}", ""]
        else:
            lines += [call, ""]
    if broken:
        lines += ["import helper_module_that_was_renamed  # noqa: F401", ""]
    lines += [
        f"NODE_CLASS_MAPPINGS = {{{node_class!r}: {node_class}}}",
        f"NODE_DISPLAY_NAME_MAPPINGS = {{{node_class!r}: {node_class + ' (' + pack + ')'!r}}}",
        "",
    ]
    return "\n".join(lines).encode()


def build_node_repo(
    path: Path,
    n_commits: int = 40,
    *,
    pack_name: str | None = None,
    node_class: str = "PackPassthrough",
    bad_commit_index: int | None = None,
    bad_scale: tuple[str, float] = ("ImageBlur", 2.0),
    requires_core_feature: str | None = None,
    untestable_range: tuple[int, int] | None = None,
    branch: str = "main",
    seed: int = 2,
) -> BuiltRepo:
    """A custom node pack history whose commit ``bad_commit_index`` scales ``bad_scale[0]``'s
    memory by ``bad_scale[1]`` -- only when the core has ``requires_core_feature``, if given.
    ``untestable_range=(a, b)``: commits ``a .. b-1`` fail to import (their nodes go missing)."""
    if bad_commit_index is not None and not 1 <= bad_commit_index < n_commits:
        raise ValueError(f"bad_commit_index must be in 1..{n_commits - 1}")
    pack = pack_name or path.name
    rng = random.Random(seed)
    _init(path, branch)
    stream = _Stream()
    ref = f"refs/heads/{branch}"

    def init_at(i: int) -> bytes:
        bad = bad_commit_index is not None and i >= bad_commit_index
        broken = untestable_range is not None and untestable_range[0] <= i < untestable_range[1]
        return _node_init(
            pack,
            node_class,
            i if bad or broken else 0,
            bad_scale if bad else None,
            requires_core_feature,
            broken,
        )

    previous = {
        "__init__.py": init_at(0),
        "pyproject.toml": f'[project]\nname = "{pack.lower()}"\nversion = "1.0.0"\ndescription = "Test pack"\n\n[tool.comfy]\nPublisherId = "tests"\nDisplayName = "{pack}"\n'.encode(),
        "README.md": f"# {pack}\n".encode(),
        "docs/notes.txt": b"rev 0\n",
    }
    marks = [
        stream.commit(
            ref, "Initial commit", "", AUTHORS[3], START_EPOCH_S + 3600, None, None, previous
        )
    ]
    subjects = ["Initial commit"]
    for i in range(1, n_commits):
        when = START_EPOCH_S + 3600 + i * STEP_S * 7
        current = dict(previous)
        current["__init__.py"] = init_at(i)
        if bad_commit_index == i:
            subject = f"Cache {bad_scale[0]} intermediates for speed"
        elif untestable_range is not None and i == untestable_range[0]:
            subject = "Move helpers into a module"
        elif untestable_range is not None and i == untestable_range[1]:
            subject = "Fix import after moving helpers"
        else:
            current["docs/notes.txt"] = f"rev {i}\n".encode()
            subject = rng.choice(
                (
                    "Fix typo in README",
                    "Update node descriptions",
                    "Handle empty input",
                    "Tidy up",
                    "Bump version",
                    "Add example workflow",
                )
            )
        changes = {p: c for p, c in current.items() if previous.get(p) != c}
        marks.append(
            stream.commit(
                ref, subject, "", AUTHORS[(i + 3) % len(AUTHORS)], when, marks[-1], None, changes
            )
        )
        subjects.append(subject)
        previous = current
    shas = stream.run(path)
    _finish(path)
    return BuiltRepo(
        path=path,
        commits=tuple(shas[m] for m in marks),
        subjects=tuple(subjects),
        bad_index=bad_commit_index,
        untestable=tuple(range(*untestable_range)) if untestable_range else (),
        branch=branch,
        node_dir_name=pack,
    )


# ---- assembling an install -----------------------------------------------------------------------
def checkout(repo: BuiltRepo, index: int) -> None:
    """Detach ``repo``'s working tree at first-parent commit ``index`` (a user's pull/reset)."""
    _git(repo.path, "checkout", "-q", "--detach", repo.commits[index])


def clone_node_into(core_path: Path, node: BuiltRepo, index: int | None = None) -> Path:
    """Clone ``node`` into ``<core>/custom_nodes/<pack>`` as a user's install has it."""
    dest = core_path / "custom_nodes" / (node.node_dir_name or node.path.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "clone", "-q", str(node.path), str(dest)], check=True, capture_output=True
    )
    if index is not None:
        _git(dest, "checkout", "-q", "--detach", node.commits[index])
    return dest


def export_commit(repo_path: Path, sha: str, dest: Path) -> Path:
    """The tree of ``sha`` as plain files in ``dest`` (``git archive``), without touching the repo."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha], cwd=repo_path, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def repo_fingerprint(path: Path) -> dict[str, str]:
    """HEAD, refs, index, status and stash of a repo: equal before and after means untouched."""
    git_dir = Path(_git(path, "rev-parse", "--absolute-git-dir").strip())
    index = git_dir / "index"
    return {
        "HEAD": _git(path, "rev-parse", "HEAD").strip(),
        "symbolic": (git_dir / "HEAD").read_text(),
        "refs": _git(path, "for-each-ref", "--format=%(refname) %(objectname)"),
        "status": _git(
            path,
            "--no-optional-locks",
            "status",
            "--porcelain=v1",
            "--untracked-files=all",
            "--ignored",
        ),
        "stash": _git(path, "stash", "list"),
        "config": (git_dir / "config").read_text(),
        "index": index.read_bytes().hex() if index.exists() else "",
        "worktrees": _git(path, "worktree", "list", "--porcelain"),
    }

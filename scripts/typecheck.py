#!/usr/bin/env python3
"""Type-check the package the way it imports: as ``oom_sentinel.*``.

The code lives in the card's top-level folders (daemon/, bisect/, ...) and setuptools maps
them onto ``oom_sentinel.daemon`` etc. through ``[tool.setuptools] package-dir``. mypy has no
such mapping: pointed at the repo it sees a top-level ``bisect`` (which shadows the standard
library's) and cannot resolve a single ``from oom_sentinel.daemon import ...``. So this
script builds, in a temporary directory and never inside the repo, the tree package-dir
implies -- ``<tmp>/oom_sentinel/<name>`` symlinked to each mapped folder, read from
pyproject.toml so a new package comes along by itself -- and runs mypy there with the repo's
``[tool.mypy]`` config. mypy's paths are printed back as repo paths (``daemon/x.py:12``).

Exit status: mypy's (0 clean, 1 type errors, 2 a usage or crash), or 2 for a pyproject
that cannot be mapped. Extra arguments go to mypy as they are.

    .venv/bin/python scripts/typecheck.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "oom_sentinel"


class LayoutError(Exception):
    """pyproject.toml's package-dir cannot be turned into an import tree."""


def package_dirs(root: Path) -> dict[str, Path]:
    """package-dir from ``root/pyproject.toml``: dotted package name -> folder in the repo."""
    try:
        pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LayoutError(f"{root / 'pyproject.toml'}: {exc}") from exc
    mapping = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not isinstance(mapping, dict) or not mapping:
        raise LayoutError(f"{root / 'pyproject.toml'}: no [tool.setuptools] package-dir")
    dirs: dict[str, Path] = {}
    for name, folder in mapping.items():
        if name.split(".")[0] != NAMESPACE or not isinstance(folder, str):
            raise LayoutError(f"package-dir entry {name!r} = {folder!r} is not under {NAMESPACE}")
        dirs[name] = (root / folder).resolve()
    return dirs


def build_tree(root: Path, dest: Path) -> None:
    """Symlink each package-dir folder into ``dest`` at the place its dotted name implies.

    A sub-package whose folder already sits where its parent's symlink puts it needs no link
    of its own; one mapped anywhere else cannot be linked without writing into the repo
    through the parent's symlink, so it is refused.
    """
    dest = dest.resolve()
    if dest.is_relative_to(root.resolve()):
        raise LayoutError(f"{dest}: the import tree must be built outside the repo")
    for name, folder in sorted(package_dirs(root).items(), key=lambda kv: kv[0].count(".")):
        if not folder.is_dir():
            raise LayoutError(f"package-dir maps {name} to {folder}, which is not a folder")
        link = dest.joinpath(*name.split("."))
        if link.exists() or link.is_symlink():
            if link.resolve() == folder:
                continue
            raise LayoutError(
                f"{name} is mapped to {folder} and also reachable as {link.resolve()}"
            )
        if not link.parent.resolve().is_relative_to(dest):
            raise LayoutError(f"{name} ({folder}) sits inside another mapped folder elsewhere")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder, target_is_directory=True)


def repo_paths(text: str, root: Path) -> str:
    """mypy's ``oom_sentinel/daemon/x.py`` back to the repo's ``daemon/x.py``."""
    pairs = sorted(
        package_dirs(root).items(), key=lambda kv: kv[0].count("."), reverse=True
    )  # deepest first, so a sub-package mapped on its own wins over its parent
    for name, folder in pairs:
        try:
            rel = folder.relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = folder.as_posix()
        text = text.replace(name.replace(".", "/") + "/", rel + "/")
    return text


def typecheck(root: Path, mypy_args: Sequence[str] = ()) -> int:
    """Run mypy over the ``oom_sentinel`` tree of ``root``; print its report, return its status."""
    with tempfile.TemporaryDirectory(prefix="oom-sentinel-typecheck-") as tmp:
        try:
            build_tree(root, Path(tmp))
        except LayoutError as exc:
            print(f"typecheck: {exc}", file=sys.stderr)
            return 2
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--config-file",
                str(root / "pyproject.toml"),
                "--cache-dir",
                str(Path(tmp) / ".mypy_cache"),
                *mypy_args,
                "-p",
                NAMESPACE,
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
    sys.stdout.write(repo_paths(proc.stdout, root))
    sys.stderr.write(repo_paths(proc.stderr, root))
    return proc.returncode


def main(argv: Sequence[str] | None = None) -> int:
    return typecheck(ROOT, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

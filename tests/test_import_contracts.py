"""The layering, checked: who may import whom.

Read from the source with ``ast`` (nothing is imported, so a module that would pull in psutil
at import time is caught without loading it):

- ``daemon`` never imports ``bisect`` -- not at the top, not inside a function, not under
  ``TYPE_CHECKING``. The daemon ships and runs without the bisect; the bisect builds on
  the daemon's readers, never the other way round.
- The modules whose docstrings say they hold pure logic (the search and verdict, the classify
  rules, the incident tracker, the alert policy, advice, ...) never import psutil, subprocess,
  sqlite3 or aiohttp themselves; most of them also load none of those when imported (through
  our own modules), which keeps them testable with plain values and cheap to import.

The daemon's start-up footprint is pinned separately (tests/test_import_footprint.py).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: each folder and the package it imports as: pyproject's package-dir, so a new one is covered
_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES = {folder: pkg for pkg, folder in _PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
#: what pure logic must not reach for: processes, the process table, a database, the network
IO_LIBRARIES = frozenset({"psutil", "subprocess", "sqlite3", "aiohttp"})

#: Modules that hold pure logic (their docstrings say so): none imports an I/O library itself.
PURE = (
    "oom_sentinel.bisect.search.plan",
    "oom_sentinel.bisect.search.verdict",
    "oom_sentinel.bisect.measure.device",
    "oom_sentinel.bisect.fit.candidates",
    "oom_sentinel.bisect.measure.flags",
    "oom_sentinel.bisect.workflow.ui_to_api",
    "oom_sentinel.daemon.classify",
    "oom_sentinel.daemon.classify.rules",
    "oom_sentinel.daemon.classify.fold",
    "oom_sentinel.daemon.classify.prefilter",
    "oom_sentinel.daemon.classify.scan",
    "oom_sentinel.daemon.incidents.tracker",
    "oom_sentinel.daemon.alerts.policy",
    "oom_sentinel.daemon.alerts.format",
    "oom_sentinel.daemon.classify.advice",
    "oom_sentinel.daemon.classify.events",
    "oom_sentinel.daemon.core.units",
    "oom_sentinel.daemon.core.redact",
    "oom_sentinel.daemon.logs.textenc",
    "oom_sentinel.daemon.comfy.prompt_fingerprint",
    "oom_sentinel.daemon.doctor.checks",
    "oom_sentinel.daemon.comfy.discovery",
    "oom_sentinel.daemon.kernel.lines",
)
#: Pure modules that, today, reach an I/O library through a module they take types from;
#: the rest must not load one at import time either.
PURE_BUT_IMPORTS_IO = {
    # State comes from bisect.states, which reads git (daemon.gitread runs git)
    "oom_sentinel.bisect.search.plan": "bisect.states -> daemon.gitread",
    # InterpreterFacts lives in daemon.interpreter, next to the probe that runs ComfyUI's python
    "oom_sentinel.bisect.measure.device": "daemon.interpreter",
    # ComfyProcess / LaunchFlags live in daemon.processes, next to the psutil scan
    "oom_sentinel.daemon.doctor.checks": "daemon.processes",
    "oom_sentinel.daemon.comfy.discovery": "daemon.processes",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, and where it is."""

    module: str  # the importing module
    target: str  # the dotted name imported (a module, or a name in one)
    path: Path
    line: int
    top_level: bool  # runs when the module is imported (not in a function, not TYPE_CHECKING)

    def where(self, root: Path) -> str:
        return f"{self.module} ({self.path.relative_to(root).as_posix()}:{self.line})"


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package under ``root``."""
    out: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, top_level: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node``, with whether it runs when the module is imported: not in a
    function or lambda body, not under ``if TYPE_CHECKING:``."""
    type_only = (
        [id(s) for s in node.body]
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        else []
    )
    for child in ast.iter_child_nodes(node):
        runs = (
            top_level
            and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            and id(child) not in type_only
        )
        yield child, runs
        yield from _walk(child, runs)


def imports(module: str, path: Path) -> list[Import]:
    """What ``module`` imports: statements, and ``importlib.import_module("literal")``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: list[Import] = []
    for node, top in _walk(tree, True):
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, path, node.lineno, top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            out += [Import(module, f"{base}.{a.name}", path, node.lineno, top) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append(Import(module, node.args[0].value, path, node.lineno, top))
    return out


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    """The module of ours that ``target`` (a module, or a name in one) loads, if any."""
    while target:
        if target in known:
            return target
        target = target.rpartition(".")[0]
    return None


def _library(target: str) -> str:
    return target.split(".")[0]


def bisect_imports_in_daemon(root: Path) -> list[str]:
    """One line per import of the bisect anywhere in the daemon."""
    return [
        f"{imp.where(root)} imports {imp.target}"
        for module, path in modules(root).items()
        if module.startswith("oom_sentinel.daemon.") or module == "oom_sentinel.daemon"
        for imp in imports(module, path)
        if imp.target == "oom_sentinel.bisect" or imp.target.startswith("oom_sentinel.bisect.")
    ]


def io_imports(root: Path, module: str) -> list[str]:
    """One line per I/O library ``module`` imports itself (anywhere in it)."""
    known = modules(root)
    return [
        f"{imp.where(root)} imports {imp.target}"
        for imp in imports(module, known[module])
        if _library(imp.target) in IO_LIBRARIES
    ]


def io_loaded_on_import(root: Path, module: str) -> list[str]:
    """One line per I/O library that importing ``module`` loads, with the chain of our
    modules it comes through (import-time statements only)."""
    known = modules(root)
    via: dict[str, list[str]] = {module: [module]}
    queue = [module]
    found: list[str] = []
    while queue:
        current = queue.pop(0)
        for imp in imports(current, known[current]):
            if not imp.top_level:
                continue
            if _library(imp.target) in IO_LIBRARIES:
                chain = " -> ".join(via[current])
                found.append(f"{chain} imports {imp.target} at {imp.where(root)}")
                continue
            ours = _resolve(imp.target, known)
            if ours is not None and ours not in via:
                via[ours] = [*via[current], ours]
                queue.append(ours)
    return found


# --- the contracts ---------------------------------------------------------------------------


def test_daemon_never_imports_bisect() -> None:
    found = bisect_imports_in_daemon(ROOT)
    assert not found, "daemon must not import bisect:\n  " + "\n  ".join(found)


def test_pure_modules_exist() -> None:
    """A renamed or moved module must take its place in PURE along with it."""
    known = modules(ROOT)
    assert [m for m in PURE if m not in known] == []
    assert set(PURE_BUT_IMPORTS_IO) <= set(PURE)


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io_library(module: str) -> None:
    found = io_imports(ROOT, module)
    assert not found, f"pure module {module} imports an I/O library:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("module", [m for m in PURE if m not in PURE_BUT_IMPORTS_IO])
def test_pure_module_loads_no_io_library(module: str) -> None:
    found = io_loaded_on_import(ROOT, module)
    assert not found, f"importing pure module {module} loads an I/O library:\n  " + "\n  ".join(
        found
    )


@pytest.mark.parametrize("module", sorted(PURE_BUT_IMPORTS_IO))
def test_listed_exceptions_are_still_needed(module: str) -> None:
    """An exception that no longer applies is dropped, so the stronger check covers it."""
    assert io_loaded_on_import(ROOT, module), (
        f"{module} no longer loads an I/O library: remove it from PURE_BUT_IMPORTS_IO"
    )


# --- the checker itself can fail, and says what and where --------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    for folder in PACKAGES:
        (tmp_path / folder).mkdir(exist_ok=True)
    return tmp_path


def test_checker_finds_a_bisect_import_hidden_in_the_daemon(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "daemon/ok.py": "import json\nfrom oom_sentinel.daemon import units\n",
            "daemon/late.py": "def f():\n    from oom_sentinel.bisect.search.plan import Plan\n",
            "daemon/typed.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from oom_sentinel import bisect\n"
            ),
            "daemon/dyn.py": (
                "import importlib\nm = importlib.import_module('oom_sentinel.bisect.cli.main')\n"
            ),
            "daemon/sub/rel.py": "from ...bisect.search import verdict\n",
        },
    )
    found = bisect_imports_in_daemon(root)
    assert sorted(found) == [
        "oom_sentinel.daemon.dyn (daemon/dyn.py:2) imports oom_sentinel.bisect.cli.main",
        "oom_sentinel.daemon.late (daemon/late.py:2) imports oom_sentinel.bisect.search.plan.Plan",
        "oom_sentinel.daemon.sub.rel (daemon/sub/rel.py:1) imports oom_sentinel.bisect.search.verdict",
        "oom_sentinel.daemon.typed (daemon/typed.py:3) imports oom_sentinel.bisect",
    ]


def test_checker_finds_io_imports_direct_and_through_our_modules(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "bisect/pure.py": (
                "from oom_sentinel.daemon.helper import thing\ndef later():\n    import sqlite3\n"
            ),
            "daemon/helper.py": "import os\nfrom oom_sentinel.daemon import probe\nthing = 1\n",
            "daemon/probe.py": "from psutil import Process\n",
            "daemon/clean.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import aiohttp\n"
            ),
        },
    )
    assert io_imports(root, "oom_sentinel.bisect.pure") == [
        "oom_sentinel.bisect.pure (bisect/pure.py:3) imports sqlite3"
    ]
    assert io_loaded_on_import(root, "oom_sentinel.bisect.pure") == [
        "oom_sentinel.bisect.pure -> oom_sentinel.daemon.helper -> oom_sentinel.daemon.probe"
        " imports psutil.Process at oom_sentinel.daemon.probe (daemon/probe.py:1)"
    ]
    # only under TYPE_CHECKING: imported by name, never loaded
    assert io_imports(root, "oom_sentinel.daemon.clean") == [
        "oom_sentinel.daemon.clean (daemon/clean.py:3) imports aiohttp"
    ]
    assert io_loaded_on_import(root, "oom_sentinel.daemon.clean") == []

"""scripts/typecheck.py: the tree it builds, where it refuses to build it, and that it fails on
a type error and says where (CI runs it on the real package; .ci/run)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "typecheck.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("oom_sentinel_typecheck_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and friends look their module up
    spec.loader.exec_module(module)
    return module


typecheck = _load()


def test_tree_maps_every_package_dir_folder(tmp_path: Path) -> None:
    typecheck.build_tree(ROOT, tmp_path)
    for folder, package in {
        "daemon": "oom_sentinel.daemon",
        "bisect": "oom_sentinel.bisect",
        "config": "oom_sentinel.config",
        "windows_service": "oom_sentinel.windows_service",
    }.items():
        link = tmp_path.joinpath(*package.split("."))
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve()
    assert (tmp_path / "oom_sentinel" / "daemon" / "service" / "wiring.py").is_file()
    assert not (tmp_path / "oom_sentinel" / "__init__.py").exists()  # a namespace, as installed


def test_refuses_to_build_inside_the_repo() -> None:
    dest = ROOT / "build" / "typecheck-tree-test"
    with pytest.raises(typecheck.LayoutError, match="outside the repo"):
        typecheck.build_tree(ROOT, dest)
    assert not dest.exists()


def _fake_repo(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "repo"
    (root / "core").mkdir(parents=True)
    (root / "core" / "mod.py").write_text(textwrap.dedent(source), encoding="utf-8")
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [tool.setuptools]
            package-dir = { "oom_sentinel.core" = "core" }

            [tool.mypy]
            namespace_packages = true
            explicit_package_bases = true
            """
        ),
        encoding="utf-8",
    )
    return root


def test_sub_package_mapped_outside_its_parent_is_refused(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path, "x = 1\n")
    (root / "elsewhere").mkdir()
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    (root / "pyproject.toml").write_text(
        text.replace('"core" }', '"core", "oom_sentinel.core.sub" = "elsewhere" }'),
        encoding="utf-8",
    )
    with pytest.raises(typecheck.LayoutError, match=r"oom_sentinel\.core\.sub"):
        typecheck.build_tree(root, tmp_path / "tree")
    assert sorted(p.name for p in (root / "core").iterdir()) == ["mod.py"]  # nothing written


@pytest.mark.slow
def test_a_type_error_fails_and_is_reported_at_its_repo_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _fake_repo(
        tmp_path,
        """\
        def twice(n: int) -> int:
            return n * 2

        label: str = twice(2)
        """,
    )
    assert typecheck.typecheck(root) == 1
    out = capsys.readouterr().out
    assert "core/mod.py:4: error: Incompatible types in assignment" in out
    assert "oom_sentinel/core" not in out and "oom-sentinel-typecheck-" not in out

    (root / "core" / "mod.py").write_text("label: str = str(2)\n", encoding="utf-8")
    assert typecheck.typecheck(root) == 0
    assert capsys.readouterr().out.startswith("Success: no issues found")

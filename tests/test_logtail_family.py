"""Rotation families: which names are rotated copies of a log, in which order, and the
ComfyUI-Manager log files of each port in a user dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oom_sentinel.daemon.logs.family import (
    RotatedName,
    RotationFamily,
    manager_log_families,
    manager_log_name,
    manager_log_port,
)

CLASSIFY = [
    ("comfyui_8188.log", "comfyui_8188.prev.log", RotatedName("manager", (-1, ""))),
    ("comfyui_8188.log", "comfyui_8188.prev2.log", RotatedName("manager", (-2, ""))),
    ("comfyui_8188.log", "comfyui_8188.log", None),
    ("comfyui_8188.log", "comfyui.prev.log", None),
    ("comfyui.log", "comfyui_8188.log", None),
    ("comfyui.log", "comfyui_8188.prev.log", None),
    ("comfyui.log", "comfyui.db", None),
    ("comfyui.log", "comfyui.log.1", RotatedName("numbered", (-1, ""))),
    ("comfyui.log", "comfyui.log.12", RotatedName("numbered", (-12, ""))),
    ("comfyui.log", "comfyui.log.1.gz", None),
    ("comfyui.log", "comfyui.log.bak", None),
    ("comfyui.log", "comfyui.old.log", RotatedName("old", (-1, ""))),
    (
        "comfyui.log",
        "comfyui.log_2026-04-03T16-34-11-099Z.log",
        RotatedName("stamped", (0, "2026-04-03T16-34-11-099Z.log")),
    ),
    (
        "comfyui.log",
        "comfyui_2026-04-03.log",
        RotatedName("stamped", (0, "2026-04-03.log")),
    ),
    ("main.log", "main.old.log", RotatedName("old", (-1, ""))),
    ("server.txt", "server.prev.log", None),
]


@pytest.mark.parametrize(
    ("live", "name", "expected"),
    CLASSIFY,
    ids=[f"{live}:{name}" for live, name, _ in CLASSIFY],
)
def test_rotated_name_is_classified(live: str, name: str, expected: RotatedName | None) -> None:
    family = RotationFamily(Path("/logs") / live)
    assert family.classify(name) == expected
    assert family.is_member(name) == (expected is not None or name == live)


def _touch(*paths: Path) -> None:
    for path in paths:
        path.write_bytes(b"x\n")


def test_younger_than_walks_manager_names_from_prev2_to_live(tmp_path: Path) -> None:
    live = tmp_path / "comfyui.log"
    prev, prev2 = tmp_path / "comfyui.prev.log", tmp_path / "comfyui.prev2.log"
    _touch(live, prev, prev2, tmp_path / "comfyui_8188.log", tmp_path / "comfyui.log.1")
    family = RotationFamily(live)
    assert family.younger_than(prev2) == [prev, live]
    assert family.younger_than(prev) == [live]


def test_younger_than_never_mixes_schemes(tmp_path: Path) -> None:
    live = tmp_path / "comfyui.log"
    older = tmp_path / "comfyui.log_2026-01-01T00-00-00-000Z.log"
    newer = tmp_path / "comfyui.log_2026-02-01T00-00-00-000Z.log"
    _touch(live, older, newer, tmp_path / "comfyui.prev.log", tmp_path / "comfyui.log.1")
    family = RotationFamily(live)
    assert family.younger_than(older) == [newer, live]
    assert family.younger_than(tmp_path / "comfyui.log.1") == [live]


def test_younger_than_numbered_counts_down(tmp_path: Path) -> None:
    live = tmp_path / "app.log"
    _touch(*(tmp_path / f"app.log.{n}" for n in (1, 2, 3)))
    family = RotationFamily(live)
    assert family.younger_than(tmp_path / "app.log.3") == [
        tmp_path / "app.log.2",
        tmp_path / "app.log.1",
    ]  # the live file does not exist, so it is not listed


def test_rotated_lists_existing_members_only(tmp_path: Path) -> None:
    live = tmp_path / "comfyui.log"
    _touch(tmp_path / "comfyui.prev.log", tmp_path / "comfyui.db", tmp_path / "other.log")
    assert RotationFamily(live).rotated() == [tmp_path / "comfyui.prev.log"]
    assert RotationFamily(tmp_path / "missing" / "comfyui.log").rotated() == []


def test_manager_log_families_lists_every_port_with_its_rotated_copies(tmp_path: Path) -> None:
    _touch(
        tmp_path / "comfyui.log",
        tmp_path / "comfyui.prev.log",
        tmp_path / "comfyui_8188.prev.log",
        tmp_path / "comfyui_8188.prev2.log",
        tmp_path / "comfyui_8190.log",
        tmp_path / "comfyui.db",
        tmp_path / "comfyui_x.log",
    )
    (tmp_path / "default").mkdir()
    families = manager_log_families(tmp_path)
    assert [(f.port, f.live.name, [p.name for p in f.rotated]) for f in families] == [
        (None, "comfyui.log", ["comfyui.prev.log"]),
        (8188, "comfyui_8188.log", ["comfyui_8188.prev.log", "comfyui_8188.prev2.log"]),
        (8190, "comfyui_8190.log", []),
    ]
    assert families[1].family.live == tmp_path / "comfyui_8188.log"
    assert manager_log_families(tmp_path / "nope") == []


PORTS = [
    (["main.py"], None),
    (["main.py", "--port", "8190"], 8190),
    (["main.py", "--port=8190"], None),
    (["main.py", "--listen", "--port", "8000", "--lowvram"], 8000),
    (["main.py", "--port"], None),
]


@pytest.mark.parametrize(("argv", "port"), PORTS, ids=[" ".join(a) for a, _ in PORTS])
def test_manager_log_port_needs_two_tokens(argv: list[str], port: int | None) -> None:
    assert manager_log_port(argv) == port


def test_manager_log_name() -> None:
    assert manager_log_name(None) == "comfyui.log"
    assert manager_log_name(8188) == "comfyui_8188.log"
    assert os.sep not in manager_log_name(1)

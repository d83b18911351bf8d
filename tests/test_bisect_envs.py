"""Per-state environments built by the real uv from real local wheels (issue 14, items 1 and 4).

No network: the wheels are written in the test (``sentinel-ballast`` 1.0 / 2.0, a helper that
pins ballast >= 2) or packed from this interpreter's own aiohttp/psutil, served to uv with
``UV_FIND_LINKS`` and ``UV_OFFLINE=1``; ``UV_NO_CONFIG`` keeps the user's uv.toml out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheels import STANDIN_RUNTIME, ballast_source, repack_closure, write_wheel

from oom_sentinel.bisect.state.envs import (
    EnvCache,
    EnvUnavailable,
    disk_usage,
    lock_for,
    new_requirement_lines,
)
from oom_sentinel.bisect.state.states import State, packages_from_freeze


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("wheels")
    runtime = repack_closure(STANDIN_RUNTIME, d)
    write_wheel(d, "sentinel-ballast", "1.0", ballast_source(1.0, pad_bytes=2 * 1024**2))
    write_wheel(d, "sentinel-ballast", "2.0", ballast_source(1.6, pad_bytes=2 * 1024**2))
    write_wheel(
        d, "ballast-helper", "1.0", {"ballast_helper/__init__.py": ""}, ["sentinel-ballast>=2"]
    )
    return d, runtime


@pytest.fixture
def uv_offline(wheelhouse: tuple[Path, dict[str, str]]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("UV_FIND_LINKS", "UV_OFFLINE", "UV_NO_CONFIG")}
    os.environ.update(UV_FIND_LINKS=str(wheelhouse[0]), UV_OFFLINE="1", UV_NO_CONFIG="1")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _run(py: Path, code: str) -> str:
    return subprocess.run(
        [str(py), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=py.parent,  # not the repo root: its egg-info would be on sys.path
    ).stdout.strip()


def test_a_state_gets_exactly_its_packages_and_a_second_use_is_cached(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]], uv_offline: None
) -> None:
    _, runtime = wheelhouse
    cache = EnvCache(tmp_path / "envs", sys.executable)
    py1 = cache.python_for(lock_for({**runtime, "sentinel-ballast": "1.0"}))
    assert cache.last == "built"
    py2 = cache.python_for(lock_for({**runtime, "sentinel-ballast": "2.0"}))
    assert py1 != py2
    assert (
        _run(py1, "import sentinel_ballast, aiohttp, psutil; print(sentinel_ballast.SCALE)")
        == "1.0"
    )
    assert _run(py2, "import sentinel_ballast; print(sentinel_ballast.SCALE)") == "1.6"
    # exactly the set: nothing of this interpreter's leaks in (pytest is installed here)
    assert _run(py1, "import importlib.util as u; print(u.find_spec('pytest'))") == "None"
    listed = _run(
        py1,
        "import importlib.metadata as m; print(' '.join(d.metadata['Name'] + '==' + d.version "
        "for d in m.distributions()))",
    ).split()
    frozen = packages_from_freeze(listed)  # uv venvs have no pip: the env's own metadata
    assert frozen == {
        **runtime,
        "sentinel-ballast": "1.0",
    }
    assert cache.python_for(lock_for({**runtime, "sentinel-ballast": "1.0"})) == py1
    assert cache.last == "cached"
    # its bytecode is compiled, as pip's installs are: a start does not compile it again
    site = Path(
        _run(py1, "import sentinel_ballast, os; print(os.path.dirname(sentinel_ballast.__file__))")
    )
    assert list((site / "__pycache__").glob("__init__.*.pyc")), sorted(site.iterdir())


def test_envs_share_files_with_the_cache_through_hard_links(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]], uv_offline: None
) -> None:
    _, runtime = wheelhouse
    cache = EnvCache(tmp_path / "envs", sys.executable)
    envs = []
    for extra in ("1.0", "2.0"):
        for n in range(3):
            # three envs per ballast version, each a different set (another idna pin differs)
            pkgs = {**runtime, "sentinel-ballast": extra}
            if n:
                pkgs["ballast-helper"] = "1.0"
                if extra == "1.0":
                    continue
            envs.append(cache.env_dir(lock_for(pkgs)))
            cache.python_for(lock_for(pkgs))
    pad = [e.glob("lib/python*/site-packages/sentinel_ballast/pad.bin") for e in envs]
    inodes = {next(p).stat().st_ino for p in pad}
    assert len(inodes) == 2  # one copy per ballast version, however many envs hold it
    naive = sum(disk_usage([e]) for e in envs)  # each env counted as if it were a full copy
    shared = disk_usage([cache.root])
    assert shared < naive * 0.7, (shared, naive)


def test_a_version_the_index_cannot_provide_is_refused_with_uvs_reason(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]], uv_offline: None
) -> None:
    _, runtime = wheelhouse
    cache = EnvCache(tmp_path / "envs", sys.executable)
    with pytest.raises(EnvUnavailable, match=r"sentinel-ballast==3\.0"):
        cache.python_for(lock_for({**runtime, "sentinel-ballast": "3.0"}))
    gone = "@ file:///nonexistent/wheels/local_pack-1.0-py3-none-any.whl"
    with pytest.raises(EnvUnavailable, match=r"local_pack-1\.0"):
        cache.python_for(lock_for({**runtime, "local-pack": gone}))
    with pytest.raises(EnvUnavailable, match="gone_pack"):  # an editable checkout that is gone
        cache.python_for(lock_for({**runtime, "gone-pack": "@ -e /nonexistent/src/gone_pack"}))
    # nothing half-built is left to be taken for an env later
    assert cache.envs() == []
    assert not [p for p in cache.root.iterdir() if p.name.startswith(".")]


def test_a_mixed_set_that_breaks_a_pin_is_refused_but_a_recorded_one_runs(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]], uv_offline: None
) -> None:
    _, runtime = wheelhouse
    cache = EnvCache(tmp_path / "envs", sys.executable)
    mixed = lock_for({**runtime, "sentinel-ballast": "1.0", "ballast-helper": "1.0"})
    # as a recorded state it runs as it was recorded (pip lets such installs exist)
    cache.python_for(mixed)
    (problem,) = cache.problems(mixed)
    assert "ballast-helper" in problem and "sentinel-ballast>=2" in problem
    with pytest.raises(EnvUnavailable, match=r"breaks a requirement: .*ballast-helper"):
        cache.python_for(mixed, tolerated=frozenset())
    assert cache.python_for(mixed, tolerated=frozenset([problem])).exists()


def test_the_least_recently_used_envs_go_when_the_cache_is_over_budget(
    tmp_path: Path, wheelhouse: tuple[Path, dict[str, str]], uv_offline: None
) -> None:
    _, runtime = wheelhouse
    cache = EnvCache(tmp_path / "envs", sys.executable)
    a = lock_for({"sentinel-ballast": "1.0"})
    b = lock_for({"sentinel-ballast": "2.0"})
    c = lock_for({"sentinel-ballast": "2.0", "idna": runtime["idna"]})
    cache.python_for(a)
    cache.python_for(b)
    cache.python_for(a)  # a is now more recent than b
    assert [p.name for p in cache.envs()] == [b.digest(), a.digest()]
    cache.max_bytes = cache.size() + 64 * 1024  # room for a little, not for another env
    cache.python_for(c)
    left = {p.name for p in cache.envs()}
    assert c.digest() in left and b.digest() not in left
    assert cache.size() <= cache.max_bytes or left == {c.digest()}


def test_uses_within_one_clock_tick_still_order_as_they_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fast box a cached env is asked for within a millisecond of another env's build
    (CI saw the LRU order come out backwards): the stamps must order by use, not by clock."""
    import oom_sentinel.bisect.state.envs as envs_mod

    cache = EnvCache(tmp_path / "envs", sys.executable)
    locks = [lock_for({"sentinel-ballast": v}) for v in ("1.0", "2.0", "3.0")]
    for lock in locks:  # complete envs as a build leaves them, without running uv
        python = cache.env_dir(lock) / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        python.parent.mkdir(parents=True)
        python.write_text("")
        (cache.env_dir(lock) / "last-used").write_text("0\n")
    monkeypatch.setattr(envs_mod.time, "time", lambda: 1_700_000_000.0)  # the clock stands still
    for lock in [*locks, locks[0]]:  # 1, 2, 3, then 1 again: 2 is now the least recent
        assert cache.python_for(lock).parent.parent == cache.env_dir(lock)
    assert [p.name for p in cache.envs()] == [
        locks[1].digest(),
        locks[2].digest(),
        locks[0].digest(),
    ]
    monkeypatch.setattr(envs_mod.time, "time", lambda: 1_600_000_000.0)  # stepped back by NTP
    cache.python_for(locks[1])
    assert cache.envs()[-1].name == locks[1].digest()


def test_torch_builds_keep_their_local_version_and_get_pytorchs_index() -> None:
    lock = lock_for({"torch": "2.8.0+cu128", "torchvision": "0.23.0+cu128", "numpy": "2.2.6"})
    assert lock.lines == (
        "--extra-index-url https://download.pytorch.org/whl/cu128",
        "numpy==2.2.6",
        "torch==2.8.0+cu128",
        "torchvision==0.23.0+cu128",
    )
    assert lock_for({"torch": "2.8.0"}).lines == ("torch==2.8.0",)
    assert lock.digest() != lock_for({"torch": "2.8.0+cu126", "numpy": "2.2.6"}).digest()


def test_pip_freeze_lines_become_a_package_set_and_a_state_dimension() -> None:
    pkgs = packages_from_freeze(
        [
            "# a comment",
            "Comfy_Kitchen==0.2.1",
            "torch==2.8.0+cu128",
            "local-pack @ file:///home/u/wheels/local_pack-1.0-py3-none-any.whl",
            "-e git+https://example.invalid/x.git@abc#egg=my_node_lib",
        ]
    )
    assert pkgs == {
        "comfy-kitchen": "0.2.1",
        "torch": "2.8.0+cu128",
        "local-pack": "@ file:///home/u/wheels/local_pack-1.0-py3-none-any.whl",
        "my-node-lib": "@ -e git+https://example.invalid/x.git@abc#egg=my_node_lib",
    }
    # each line as recorded: an editable stays an editable line for uv to install or refuse
    assert lock_for(pkgs).lines == (
        "--extra-index-url https://download.pytorch.org/whl/cu128",
        "comfy-kitchen==0.2.1",
        "local-pack @ file:///home/u/wheels/local_pack-1.0-py3-none-any.whl",
        "-e git+https://example.invalid/x.git@abc#egg=my_node_lib",
        "torch==2.8.0+cu128",
    )
    g = State.of("a" * 40, {}, {"torch": "2.7.1+cu128", "numpy": "2.2.6"})
    b = State.of("a" * 40, {}, {"torch": "2.8.0+cu128", "numpy": "2.2.6", "comfy-kitchen": "0.2.1"})
    from oom_sentinel.bisect.state.states import differing_repos, repo_label

    assert differing_repos(g, b) == ["pkg:comfy-kitchen", "pkg:torch"]
    assert repo_label("pkg:torch") == "package torch"
    assert g.with_values({"pkg:torch": "2.8.0+cu128", "pkg:comfy-kitchen": "0.2.1"}) == b
    assert State.from_json(b.to_json()) == b
    # a state without packages reads and writes as before issue 14
    assert "packages" not in State.of("a" * 40).to_json()


def test_only_requirement_lines_the_update_changed_are_installed_for_a_commit_between() -> None:
    """A line the file held at both endpoints was lived with in both recorded sets (v0.8.0's
    torchaudio, which its torch build cannot have): no reason for an env of its own. A line
    the update added or bumped is one; a repo the good endpoint lacked brings all its lines."""
    v080 = "torch\ntorchaudio\nnumpy>=1.25.0\n# non essential:\nkornia>=0.7.1\n"
    assert new_requirement_lines(v080, [v080, v080]) == ""
    assert new_requirement_lines(v080 + "spandrel  # new\n", [v080, v080]) == "spandrel\n"
    bumped = "sentinel-ballast==2.0\n"
    assert new_requirement_lines(bumped, ["sentinel-ballast\n", bumped]) == bumped
    assert new_requirement_lines("a\nb\n", [None, "a\nb\n"]) == "a\nb\n"

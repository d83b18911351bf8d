"""``pip freeze`` lines are read once (daemon/install/freeze.py), for the install diff and for
the bisect's package states: the two readers once disagreed on the same lines."""

from __future__ import annotations

from oom_sentinel.bisect.state.envs import lock_for
from oom_sentinel.bisect.state.states import packages_from_freeze
from oom_sentinel.daemon.install.diff import parse_pip_lines
from oom_sentinel.daemon.install.freeze import parse_freeze_line, parse_freeze_lines

LINES = (
    "# Editable install with no version control",
    "",
    "Foo_Bar==1.0",
    "legacy===2013b",
    "mypkg @ file:///wheels/mypkg.whl",
    "tight@file:///wheels/tight.whl",
    "extras[gpu]==2.0",
    "-e git+https://github.com/o/x@abc#egg=x_pkg",
    "-e /home/u/src/local-thing",
)


def test_each_form_of_a_freeze_line() -> None:
    kinds = {k: (r.name, r.spec, r.kind) for k, r in parse_freeze_lines(LINES).items()}
    assert kinds == {
        "foo-bar": ("Foo_Bar", "1.0", "pin"),
        "legacy": ("legacy", "2013b", "pin"),
        "mypkg": ("mypkg", "@ file:///wheels/mypkg.whl", "direct"),
        "tight": ("tight", "@ file:///wheels/tight.whl", "direct"),
        "extras": ("extras", "2.0", "pin"),
        "x-pkg": ("x_pkg", "-e git+https://github.com/o/x@abc#egg=x_pkg", "editable"),
        "local-thing": ("local-thing", "-e /home/u/src/local-thing", "editable"),
    }
    assert parse_freeze_line("   ") is None
    assert parse_freeze_line("# comment") is None


def test_the_diff_and_the_bisect_see_the_same_packages() -> None:
    """Every package the diff shows is one the bisect's states install, with the same pin."""
    shown = parse_pip_lines(LINES)
    states = packages_from_freeze(LINES)
    assert set(shown) == set(states)
    assert states["legacy"] == "2013b"
    assert states["tight"] == "@ file:///wheels/tight.whl"
    # an editable install without #egg= was dropped by the bisect's own reader: its states were
    # built without a package the user had; now its lock installs it from where it was
    assert states["local-thing"] == "@ -e /home/u/src/local-thing"
    assert "-e /home/u/src/local-thing" in lock_for(states).lines


def test_a_line_in_no_freeze_form_is_shown_but_installs_nothing() -> None:
    assert parse_pip_lines(("not a requirement",)) == {
        "not a requirement": ("not a requirement", "not a requirement")
    }
    assert packages_from_freeze(["not a requirement"]) == {}

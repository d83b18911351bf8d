"""procutil: children forked with the parent-death signal, and Ctrl-C never lost in the fork.

A ``preexec_fn`` makes CPython fork and then run the at-fork handlers in the parent; a
signal arriving during the fork is handled inside such a handler, where KeyboardInterrupt is
only printed ("Exception ignored") and the bisect went on. Each test below delivers SIGINT
from an at-fork handler -- exactly that moment -- in a real process, and checks that the
Ctrl-C still stops the caller, after the child was started (and, for a replay server,
registered so the Ctrl-C path kills it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bisect_git import git

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")

CTRL_C_IN_THE_FORK = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path

    def ctrl_c_during_the_fork():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(3):  # a bytecode boundary: the pending SIGINT is handled here
            pass

    os.register_at_fork(after_in_parent=ctrl_c_during_the_fork)
    """
)

VIA_GITREPO = CTRL_C_IN_THE_FORK + textwrap.dedent(
    """
    from oom_sentinel.bisect.state import gitrepo
    try:
        gitrepo._run(Path(sys.argv[1]), ["tag", "made-by-git"], what="test", config={},
                     env=None, pass_fds=())
    except KeyboardInterrupt:
        print("interrupted")
    else:
        print("lost")
    """
)

VIA_REPLAY_SPAWNER = CTRL_C_IN_THE_FORK + textwrap.dedent(
    """
    from oom_sentinel.bisect.measure import replay
    from oom_sentinel.bisect.measure.procutil import pdeathsig_preexec
    try:
        replay._spawner.popen([sys.executable, "-c", "pass"], preexec_fn=pdeathsig_preexec())
    except KeyboardInterrupt:
        (proc,) = replay._live.values()  # registered: the Ctrl-C path can kill it
        proc.wait()
        print("interrupted")
    else:
        print("lost")
    """
)


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )


@linux_only
def test_a_ctrl_c_during_a_git_fork_still_interrupts(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    done = _run(VIA_GITREPO, str(repo))
    assert done.stdout.strip() == "interrupted", done.stderr
    assert "Exception ignored" not in done.stderr
    assert git(repo, "tag").split() == ["made-by-git"]  # git itself ran to its end


@linux_only
def test_a_ctrl_c_during_a_replay_spawn_still_interrupts() -> None:
    done = _run(VIA_REPLAY_SPAWNER)
    assert done.stdout.strip() == "interrupted", done.stderr
    assert "Exception ignored" not in done.stderr


def test_signals_deferred_hands_a_noted_signal_to_its_own_handler() -> None:
    script = textwrap.dedent(
        """
        import os, signal
        from oom_sentinel.bisect.measure.procutil import signals_deferred
        seen = []
        signal.signal(signal.SIGTERM, lambda s, f: seen.append(("handler", s)))
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(3):
                pass
            seen.append(("inside", None))
        print(seen == [("inside", None), ("handler", signal.SIGTERM)],
              signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        """
    )
    done = _run(script)
    assert done.stdout.split() == ["True", "True"], done.stderr

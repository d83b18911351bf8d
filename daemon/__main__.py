"""``python -m oom_sentinel.daemon`` is the ``oom-sentinel`` command."""

from oom_sentinel.daemon.cli.main import main

main()

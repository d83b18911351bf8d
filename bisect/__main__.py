"""``python -m oom_sentinel.bisect`` is the ``oom-bisect`` command."""

from oom_sentinel.bisect.cli.main import main

main()

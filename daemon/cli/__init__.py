"""The ``oom-sentinel`` command, one module per subcommand."""

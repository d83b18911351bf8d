"""The ``oom-bisect`` command."""

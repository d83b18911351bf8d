"""What both command-line front ends share: one-line errors with documented exit statuses,
and JSON output that scripts can rely on.

Only the CLIs and the service loop catch ``SentinelError`` (see errors.py); everything below
them raises. A traceback is shown only with ``-v``/``--verbose``, for bug reports.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any, TypeVar

import click

from oom_sentinel.daemon.core.errors import EXIT_ERROR, SentinelError

__all__ = ["echo_json", "echo_table", "fail", "handle_errors"]

F = TypeVar("F", bound=Callable[..., Any])


def fail(prog: str, message: str, code: int) -> None:
    """Print ``prog: error: message`` on stderr and exit with ``code``."""
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


def handle_errors(prog: str) -> Callable[[F], F]:
    """Turn our exceptions (and stray OS errors) into one line and an exit status."""

    def decorate(func: F) -> F:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except SentinelError as exc:
                if _verbose():
                    raise
                fail(prog, str(exc), exc.exit_code)
            except BrokenPipeError:
                sys.stderr.close()  # the reader went away (`| head`): not an error
                sys.exit(0)
            except KeyboardInterrupt:
                click.echo(f"{prog}: interrupted", err=True)
                sys.exit(130)
            except OSError as exc:
                if _verbose():
                    raise
                where = f"{exc.filename}: " if exc.filename else ""
                fail(prog, f"{where}{exc.strerror or exc}", EXIT_ERROR)
            return None

        return wrapper  # type: ignore[return-value]

    return decorate


def _verbose() -> bool:
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.obj and isinstance(ctx.obj, dict) and ctx.obj.get("verbose"):
            return True
        ctx = ctx.parent
    return False


def echo_json(value: Any) -> None:
    """Print one JSON document (sorted keys are not used: field order is documented order)."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def echo_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Plain aligned columns (two spaces apart, no trailing blanks), for listings that
    ``grep`` and ``awk`` should read as easily as a person."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())

"""Which of the user's ComfyUI flags a given commit understands, read from that commit's
``comfy/cli_args.py`` without importing it.

A bisect starts ComfyUI at commits months apart, and argparse exits on an unknown flag
(``--reserve-vram`` did not exist before 2024-08, ``--cache-ram`` before v0.3.68). So the
user's memory flags are kept, but each commit only gets those its own parser declares.
Importing ``cli_args.py`` would run ComfyUI code (and parse our argv); instead its text is
parsed: with ``ast`` when it compiles, else with a tolerant scanner. Both understand either
quote style, several option strings per call (``"-h", "--help"``), and calls on argument
groups and mutually exclusive groups (``vram_group.add_argument(...)``), and take each
option's arity from ``action``/``nargs`` so ``--reserve-vram 2`` drops or stays as a unit.

Flags that would break the isolation (``--listen``, ``--port``, the path flags, the
database, auto-launch, the Manager, the Windows updater) are always dropped; the workspace
sets its own.
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ISOLATION_FLAGS",
    "ArgSpec",
    "FilterResult",
    "FlagUse",
    "filter_flags",
    "parse_cli_args",
    "split_flags",
]

#: dropped from the user's flags: the workspace sets these itself, or they reach outside it
ISOLATION_FLAGS = frozenset(
    {
        "--listen",
        "--port",
        "--tls-keyfile",
        "--tls-certfile",
        "--enable-cors-header",
        "--base-directory",
        "--output-directory",
        "--input-directory",
        "--temp-directory",
        "--user-directory",
        "--database-url",
        "--auto-launch",
        "--disable-auto-launch",
        "--windows-standalone-build",  # modifies the portable build's updater folder
        "--multi-user",
        "--enable-manager",  # the Manager runs pip at startup
        "--enable-manager-legacy-ui",
        "--disable-manager-ui",
        "--front-end-version",  # anything but the default downloads a frontend
        "--front-end-root",
        "--quick-test-for-ci",
        "--dont-print-server",
    }
)

_ZERO_ARG_ACTIONS = frozenset(
    {
        "store_true",
        "store_false",
        "store_const",
        "append_const",
        "count",
        "help",
        "version",
    }
)


@dataclass(frozen=True)
class ArgSpec:
    """One ``add_argument`` call: its option strings and how many values follow."""

    options: tuple[str, ...]
    #: minimum and maximum number of values (max None: unbounded)
    min_args: int
    max_args: int | None


def _arity(action: str | None, nargs: str | int | None) -> tuple[int, int | None]:
    if action is not None and (action in _ZERO_ARG_ACTIONS or "BooleanOptional" in action):
        return 0, 0
    if nargs is None:
        return 1, 1
    if isinstance(nargs, int):
        return nargs, nargs
    return {"?": (0, 1), "*": (0, None), "+": (1, None)}.get(nargs, (1, 1))


#: CPython 3.11-3.12 keep the AST constructor's recursion depth in interpreter-wide state, so
#: two threads building trees at once can end one of them with ``SystemError: AST constructor
#: recursion depth mismatch`` (python/cpython#106905). A parallel bisect's lanes launch their
#: replays from threads and each parses its commit's ``cli_args.py``: one parse at a time.
_AST_LOCK = threading.Lock()


def parse_cli_args(text: str) -> dict[str, ArgSpec]:
    """Option string → spec for every ``*.add_argument(...)`` call in ``text``. Pure."""
    try:
        with _AST_LOCK:
            tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return _scan(text)
    out: dict[str, ArgSpec] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        options = tuple(
            a.value
            for a in node.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        )
        if not options:
            continue
        action: str | None = None
        nargs: str | int | None = None
        for kw in node.keywords:
            if kw.arg == "action":
                action = _expr_name(kw.value)
            elif kw.arg == "nargs":
                value = kw.value
                if isinstance(value, ast.Constant) and isinstance(value.value, str | int):
                    nargs = value.value
                else:
                    nargs = {"OPTIONAL": "?", "ZERO_OR_MORE": "*", "ONE_OR_MORE": "+"}.get(
                        _expr_name(value) or ""
                    )
        _add(out, options, action, nargs)
    return out


def _expr_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _add(out: dict[str, ArgSpec], options: tuple[str, ...], action: str | None, nargs: Any) -> None:
    lo, hi = _arity(action, nargs)
    spec = ArgSpec(options, lo, hi)
    for opt in options:
        out[opt] = spec
    if action is not None and "BooleanOptional" in action:
        for opt in options:
            if opt.startswith("--"):
                out["--no-" + opt[2:]] = spec


_STR_RE = re.compile(r"""(?:[rRbBuU]{0,2})("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")


def _scan(text: str) -> dict[str, ArgSpec]:
    """Fallback for text ``ast`` rejects: find each call's balanced argument list."""
    out: dict[str, ArgSpec] = {}
    for m in re.finditer(r"\.add_argument\s*\(", text):
        body = _balanced(text, m.end())
        strings = [s[1:-1] for s in _STR_RE.findall(body.split("=", 1)[0])]
        options = tuple(s for s in strings if s.startswith("-"))
        if not options:
            continue
        am = re.search(r"\baction\s*=\s*(?:[\"']([\w-]+)[\"']|(?:\w+\.)*(\w+))", body)
        action = (am.group(1) or am.group(2)) if am else None
        nm = re.search(r"\bnargs\s*=\s*(?:[\"']([?*+])[\"']|(\d+))", body)
        nargs: str | int | None = None
        if nm:
            nargs = nm.group(1) if nm.group(1) else int(nm.group(2))
        _add(out, options, action, nargs)
    return out


def _balanced(text: str, start: int) -> str:
    depth = 1
    i = start
    quote: str | None = None
    while i < len(text) and depth:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        i += 1
    return text[start : i - 1]


@dataclass(frozen=True)
class FlagUse:
    """One flag as the user gave it: the canonical option and the argv words it spans."""

    option: str
    words: tuple[str, ...]


def _canonical(word: str, spec: Mapping[str, ArgSpec]) -> str | None:
    if word in spec:
        return word
    if not word.startswith("--"):
        return None
    # argparse accepts an unambiguous prefix of a long option (allow_abbrev)
    matched = [o for o in spec if o.startswith("--") and o.startswith(word)]
    if matched and len({spec[o] for o in matched}) == 1:
        return min(matched, key=len)
    return None


def _is_value(word: str) -> bool:
    return not word.startswith("-") or bool(re.fullmatch(r"-\d+(\.\d*)?", word))


def split_flags(argv: Sequence[str], spec: Mapping[str, ArgSpec]) -> list[FlagUse]:
    """Group ``argv`` into flags with their values, using the arities in ``spec``.

    An option ``spec`` doesn't know is taken with the values that follow it up to the next
    option; stray words (positionals) become a FlagUse with option "".
    """
    uses: list[FlagUse] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or word in ("-", "--"):
            uses.append(FlagUse("", (word,)))
            i += 1
            continue
        name, eq, _ = word.partition("=")
        opt = _canonical(name, spec) if word.startswith("--") else (name if name in spec else None)
        if opt is None:
            j = i + 1
            while not eq and j < len(argv) and _is_value(argv[j]):
                j += 1
            uses.append(FlagUse(name, tuple(argv[i:j])))
            i = j
            continue
        s = spec[opt]
        j = i + 1
        if not eq:
            limit = s.max_args if s.max_args is not None else len(argv)
            taken = 0
            while taken < limit and j < len(argv) and _is_value(argv[j]):
                j += 1
                taken += 1
        uses.append(FlagUse(opt, tuple(argv[i:j])))
        i = j
    return uses


@dataclass(frozen=True)
class FilterResult:
    kept: tuple[str, ...]
    #: (the words dropped, why)
    dropped: tuple[tuple[str, str], ...]


def filter_flags(
    argv: Sequence[str],
    user_spec: Mapping[str, ArgSpec],
    target_spec: Mapping[str, ArgSpec],
    drop: Iterable[str] = ISOLATION_FLAGS,
) -> FilterResult:
    """The user's flags a target commit accepts, minus the isolation-breaking ones.

    ``user_spec`` is parsed from the user's own ``cli_args.py`` (it explains the argv);
    ``target_spec`` from the commit about to run.
    """
    deny = set(drop)
    kept: list[str] = []
    dropped: list[tuple[str, str]] = []
    for use in split_flags(argv, user_spec):
        shown = " ".join(use.words)
        if not use.option:
            dropped.append((shown, "not a flag"))
        elif use.option in deny or any(o in deny for o in _aliases(use.option, user_spec)):
            dropped.append((shown, "set by the workspace"))
        elif not any(o in target_spec for o in _aliases(use.option, user_spec)):
            dropped.append((shown, "unknown to this commit"))
        else:
            # the spelling the user wrote if this commit knows it, else a long alias
            known = [o for o in _aliases(use.option, user_spec) if o in target_spec]
            target_opt = use.option if use.option in target_spec else max(known, key=len)
            words = list(use.words)
            _, eq, value = words[0].partition("=")
            words[0] = target_opt + (eq + value if eq else "")
            tspec = target_spec[target_opt]
            nvalues = 1 if eq else len(words) - 1
            if nvalues < tspec.min_args or (
                tspec.max_args is not None and nvalues > tspec.max_args
            ):
                dropped.append((shown, "takes other values at this commit"))
                continue
            kept.extend(words)
    return FilterResult(tuple(kept), tuple(dropped))


def _aliases(option: str, spec: Mapping[str, ArgSpec]) -> tuple[str, ...]:
    s = spec.get(option)
    return s.options if s is not None else (option,)

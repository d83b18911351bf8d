"""Remove secrets from everything the daemon writes into a snapshot or sends in an alert.

Snapshots get attached to public bug reports and alerts go to chat rooms, while what we capture
(prompts, ``extra_data``, process command lines and environments, log lines, URLs) routinely
holds API keys, Hugging Face tokens and webhook URLs. So there is one function, ``redact``,
applied at the last step before anything leaves memory. It is pure and never raises: a redactor
that crashes would lose the snapshot it was protecting.

Three kinds of rule, applied at any depth:

* **by key name** -- a mapping value whose key looks like a secret (``api_key``, ``token``,
  ``password``, ``authorization``, ``cookie``, ``*_KEY`` env names, ComfyUI's
  ``api_key_comfy_org`` / ``auth_token_comfy_org`` ...) is replaced whole;
* **by shape in text** -- credentials in URLs, secret query parameters, bearer tokens, known
  token formats (``hf_``, ``sk-``, ``ghp_``, ``github_pat_``, ``AKIA``, ``xox?-``, JWTs, Telegram
  bot tokens, Discord/Slack webhooks, PEM private keys) and ``NAME=value`` / ``name: value``
  pairs whose name looks like a secret;
* **by position in argv** -- ``["--api-key", "abc"]``: the value after a secret-named flag.

Key names are matched by words, not substrings, so ComfyUI inputs such as ``max_tokens`` or
``token_normalization`` survive and a redacted ``prompt.json`` still replays.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "redact", "redact_text"]

REDACTED = "[REDACTED]"

# Deeper than any real prompt/workflow; past it we drop the content rather than risk a leak.
_MAX_DEPTH = 200
# Strings (and key names) up to this length are memoised: workflows repeat the same node
# types, sampler names and widget values thousands of times. Bounded: 4096 entries each.
_CACHED_LEN = 256

# A whole word (after splitting snake_case, kebab-case and camelCase) that marks a secret.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "secrets",
        "credential",
        "credentials",
        "authorization",
        "cookie",
        "cookies",
        "apikey",
        "accesskey",
        "privatekey",
        "secretkey",
        "authtoken",
        "accesstoken",
        "refreshtoken",
        "bearer",
    }
)
# A last word that marks a secret on its own: `token`, `hf_token`, `bot_token`, `HTTP_AUTH`.
_SECRET_LAST_WORDS = frozenset({"token", "auth", "pat"})
# Two consecutive words that mark a secret wherever they stand: `api_key_comfy_org`.
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("access", "key"),
        ("private", "key"),
        ("secret", "key"),
        ("signing", "key"),
        ("encryption", "key"),
        ("client", "key"),
        ("license", "key"),
        ("master", "key"),
        ("service", "key"),
        ("account", "key"),
        ("subscription", "key"),
        ("auth", "token"),
        ("access", "token"),
        ("refresh", "token"),
        ("session", "token"),
        ("api", "token"),
        ("id", "token"),
        ("security", "token"),
        ("webhook", "url"),
        ("private", "token"),
    }
)
# Query-string parameters that carry a secret even though the name alone is too short for the
# general rule: `?key=` (Google), `?sig=` (Azure SAS), `?X-Amz-Signature=` (S3 presigned).
_SECRET_QUERY_NAMES = frozenset(
    {
        "key",
        "sig",
        "signature",
        "pass",
        "pwd",
        "auth",
        "code",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
    }
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def is_secret_name(name: object) -> bool:
    """Whether a key, env var, flag or parameter name looks like it holds a secret."""
    if not isinstance(name, str) or not name:
        return False
    if len(name) > _CACHED_LEN:
        return _is_secret_name.__wrapped__(name)
    return _is_secret_name(name)


@functools.lru_cache(maxsize=4096)
def _is_secret_name(name: str) -> bool:
    text = name.strip().lstrip("-")
    if not text:
        return False
    env_style = text.upper() == text and any(c.isalpha() for c in text)
    words = [w for w in _NON_ALNUM.split(_CAMEL.sub("_", text).lower()) if w]
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if words[-1] in _SECRET_LAST_WORDS:
        return True
    if any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)):
        return True
    # Environment variables: `FAL_KEY`, `STABILITY_KEY`, `SMTP_PASS`, `CIVITAI_TOKEN`.
    if env_style and len(words) > 1 and words[-1] in {"key", "pass", "secret", "token"}:
        return True
    return "password" in "".join(words) or "passwd" in "".join(words)


def _is_secret_query_name(name: str) -> bool:
    return name.lower() in _SECRET_QUERY_NAMES or is_secret_name(name)


# --- text rules -------------------------------------------------------------------------------
# Each is (pattern, replacement); replacements keep the surrounding structure (scheme, host,
# the name in NAME=value) so a reader still sees *what* was there.


def _keep(group: int) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(group) + REDACTED


_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----.*?(?:-----END \1-----|\Z)", re.DOTALL)
# user:password@ -- or a lone long user part, which is how tokens ride in git remotes.
_URL_USERINFO = re.compile(
    r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/@:\"'<>]*:[^\s/@\"'<>]*|[A-Za-z0-9_.~\-]{16,})@"
)
_DISCORD_WEBHOOK = re.compile(
    r"(https?://(?:[a-z0-9-]+\.)?discord(?:app)?\.com/api/webhooks/)[^\s\"'<>]+", re.IGNORECASE
)
_SLACK_WEBHOOK = re.compile(r"(https?://hooks\.slack\.com/)[^\s\"'<>]+", re.IGNORECASE)
_TELEGRAM_URL = re.compile(r"(https?://api\.telegram\.org/bot)[^\s/\"'<>]+", re.IGNORECASE)
# apprise notification URLs carry their credentials in the path (discord://id/token, ...).
_APPRISE_URL = re.compile(
    r"\b((?:discord|slack|tgram|pover|pushover|msteams|gotifys?|ntfys?|matrixs?|mailtos?|pbul"
    r"|join|signals?|twilio|rocket|rockets|mmost|mmosts|ifttt|zulip|apprises?)://)[^\s\"'<>]+",
    re.IGNORECASE,
)
_QUERY_PARAM = re.compile(r"([?&;])([A-Za-z0-9_.\-]{1,64})=([^&#\s\"'<>]*)")
_AUTH_HEADER = re.compile(
    r"(\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?)"
    r"((?:bearer|basic|token|digest|bot)\s+)?[^\s\"',;]+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/\-]{12,}=*", re.IGNORECASE)
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_])(?:"
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_\-]{20,}"  # OpenAI / Anthropic style
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    r"|xox[abposre]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|AIza[0-9A-Za-z_\-]{35}"  # Google API keys
    r"|npm_[A-Za-z0-9]{36}"
    r"|eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*"  # JWT
    r"|\d{6,12}:[A-Za-z0-9_\-]{30,}"  # Telegram bot token 123456:ABC...
    r")"
)
# NAME=value, name: value, "name": "value", --name=value -- kept only when the name is secret.
_NAME_VALUE = re.compile(
    r"(?P<lead>(?<![A-Za-z0-9_\-])-{0,2})"
    r"(?P<q>[\"']?)(?P<name>[A-Za-z_][A-Za-z0-9_.\-]{0,80})(?P=q)"
    r"(?P<sep>\s*(?::|=|=>)\s*)"
    r"(?P<value>\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[^\s,;&\"'(){}\[\]<>]+)"
)
# `--api-key abc` inside one string (a command line as text).
_FLAG_SPACE_VALUE = re.compile(r"(?<![A-Za-z0-9_])(--?[A-Za-z][A-Za-z0-9_\-]*)(\s+)([^\s\-][^\s]*)")


_AUTH_SCHEMES = frozenset({"bearer", "basic", "token", "digest", "bot"})


def _name_value(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")):
        return m.group(0)
    value = m.group("value")
    if value in (REDACTED, f'"{REDACTED}"', f"'{REDACTED}'"):
        return m.group(0)
    if value.lower() in _AUTH_SCHEMES:  # `Authorization: Bearer [REDACTED]` is already done
        return m.group(0)
    quote = value[0] if value[:1] in "\"'" and len(value) >= 2 else ""
    return (
        m.group("lead")
        + m.group("q")
        + m.group("name")
        + m.group("q")
        + m.group("sep")
        + f"{quote}{REDACTED}{quote}"
    )


def _flag_value(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1)):
        return m.group(0)
    return m.group(1) + m.group(2) + REDACTED


def _query_param(m: re.Match[str]) -> str:
    if not m.group(3) or not _is_secret_query_name(m.group(2)):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}={REDACTED}"


def _auth_header(m: re.Match[str]) -> str:
    return m.group(1) + (m.group(2) or "") + REDACTED


# Each rule runs only when a cheap substring test on the lower-cased text says it could match:
# most strings in a workflow are short identifiers that need none of them.
_RULES: tuple[
    tuple[Callable[[str], bool], re.Pattern[str], Callable[[re.Match[str]], str]], ...
] = (
    (
        lambda low: "-----begin" in low,
        _PEM,
        lambda m: f"-----BEGIN {m.group(1)}-----{REDACTED}-----END {m.group(1)}-----",
    ),
    (lambda low: "://" in low, _URL_USERINFO, lambda m: f"{m.group(1)}{REDACTED}@"),
    (lambda low: "webhooks" in low, _DISCORD_WEBHOOK, _keep(1)),
    (lambda low: "hooks.slack" in low, _SLACK_WEBHOOK, _keep(1)),
    (lambda low: "api.telegram" in low, _TELEGRAM_URL, _keep(1)),
    (lambda low: "://" in low, _APPRISE_URL, _keep(1)),
    (
        lambda low: "=" in low and ("?" in low or "&" in low or ";" in low),
        _QUERY_PARAM,
        _query_param,
    ),
    (lambda low: "authorization" in low, _AUTH_HEADER, _auth_header),
    (lambda low: "bearer" in low, _BEARER, _keep(1)),
    (lambda low: True, _TOKEN_SHAPES, lambda m: REDACTED),
    (lambda low: "=" in low or ":" in low, _NAME_VALUE, _name_value),
    (lambda low: "-" in low, _FLAG_SPACE_VALUE, _flag_value),
)

# Cheap pre-filter: text with none of these characters/markers cannot match any rule.
_MAYBE_SECRET = re.compile(
    r"[:=@]|hf_|sk-|sk_|rk_|pk_|gh[pousr]_|github_pat_|glpat-|AKIA|ASIA|xox|AIza|npm_|eyJ"
    r"|bearer|-----BEGIN|--",
    re.IGNORECASE,
)


def redact_text(text: str) -> str:
    """Free text with every credential shape replaced by ``[REDACTED]``; never raises."""
    try:
        if not text:
            return text
        if len(text) <= _CACHED_LEN:
            return _redact_short(text)
        return _redact_text(text)
    except Exception:  # a redactor must never lose the snapshot; but never leak either
        return REDACTED


@functools.lru_cache(maxsize=4096)
def _redact_short(text: str) -> str:
    return _redact_text(text)


def _redact_text(text: str) -> str:
    if not _MAYBE_SECRET.search(text):
        return text
    for gate, pattern, replace in _RULES:
        if gate(text.lower()):
            text = pattern.sub(replace, text)
    return text


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (nested dicts/lists/tuples/strings) with secrets replaced.

    Structure is kept: keys stay, a secret value becomes ``"[REDACTED]"``; ``None`` and empty
    values stay as they are (they hold nothing). Other scalars pass through unchanged.
    """
    try:
        return _redact(obj, 0, set())
    except Exception:
        return REDACTED


def _redact(obj: Any, depth: int, active: set[int]) -> Any:
    if isinstance(obj, str):
        return redact_text(obj)
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, bytes | bytearray):
        text = bytes(obj).decode("utf-8", "surrogateescape")
        return redact_text(text).encode("utf-8", "surrogateescape")
    if depth >= _MAX_DEPTH:
        return REDACTED
    marker = id(obj)
    if marker in active:  # a cycle: stop rather than recurse forever
        return REDACTED
    active.add(marker)
    try:
        if isinstance(obj, dict | Mapping):
            out: dict[Any, Any] = {}
            for key, value in obj.items():
                new_key = redact_text(key) if isinstance(key, str) else key
                if is_secret_name(key) and not _is_empty(value):
                    out[new_key] = REDACTED
                else:
                    out[new_key] = _redact(value, depth + 1, active)
            return out
        if isinstance(obj, list | tuple):
            items = _redact_argv(obj, depth, active)
            return items if isinstance(obj, list) else tuple(items)
        if isinstance(obj, set | frozenset):
            return type(obj)(_redact(v, depth + 1, active) for v in obj)
        return obj
    finally:
        active.discard(marker)


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple | dict) and len(value) == 0)


def _redact_argv(items: list[Any] | tuple[Any, ...], depth: int, active: set[int]) -> list[Any]:
    """Redact a sequence; in a command line, the value after ``--api-key`` is a secret too."""
    out: list[Any] = []
    hide_next = False
    for item in items:
        if hide_next and isinstance(item, str) and not item.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = (
            isinstance(item, str)
            and item.startswith("-")
            and "=" not in item
            and " " not in item
            and is_secret_name(item)
        )
        out.append(_redact(item, depth + 1, active))
    return out

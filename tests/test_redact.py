"""Secrets never survive redaction, and what is not a secret survives it unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oom_sentinel.daemon.core.redact import REDACTED, is_secret_name, redact, redact_text

HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
GHP = "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
TELEGRAM = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"

TEXT_CASES: list[tuple[str, str, str]] = [
    # (id, input, the secret part that must be gone)
    ("hf-token-env", f"HF_TOKEN={HF}", HF),
    ("hf-token-bare", f"using token {HF} for download", HF),
    ("openai-key", "key is sk-proj-AbCdEfGhIjKlMnOpQrStUvWx", "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx"),
    ("github-pat-classic", f"remote {GHP}", GHP),
    (
        "github-pat-fine",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "github_pat_11ABCDEFG0123456789",
    ),
    ("aws-access-key-id", "aws AKIAIOSFODNN7EXAMPLE configured", "AKIAIOSFODNN7EXAMPLE"),
    ("slack-bot-token", "slack xoxb-1234567890-0987654321-AbCdEfGh", "xoxb-1234567890"),
    ("jwt", f"session {JWT}", JWT),
    ("telegram-bot-token", f"bot {TELEGRAM}", TELEGRAM),
    ("telegram-api-url", f"https://api.telegram.org/bot{TELEGRAM}/sendMessage", "AAHdqTcvCH1v"),
    (
        "discord-webhook",
        "https://discord.com/api/webhooks/123456789012/AbCdEf-GhIjKl_MnOp",
        "AbCdEf-GhIjKl_MnOp",
    ),
    (
        "slack-webhook",
        "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX",
        "XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    ("apprise-discord", "discord://1234567/WebhookTokenValue", "WebhookTokenValue"),
    ("url-user-pass", "clone https://alice:hunter2@example.com/repo.git", "hunter2"),
    ("url-user-pass-user", "clone https://alice:hunter2@example.com/repo.git", "alice"),
    ("url-token-user", "https://x-access-token:abc123def@github.com/o/r", "abc123def"),
    ("query-token", "GET https://h.example/m.safetensors?token=abc123&v=2", "abc123"),
    ("query-key", "https://maps.example/api?key=AKeyValue99&q=x", "AKeyValue99"),
    ("query-sig", "https://blob.example/c/f.bin?sv=2020&sig=Zm9vYmFy%3D", "Zm9vYmFy"),
    ("query-amz", "https://s3.example/o?X-Amz-Signature=deadbeefcafe&a=1", "deadbeefcafe"),
    ("bearer-header", "Authorization: Bearer abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnop"),
    ("basic-header", "authorization=Basic YWxhZGRpbjpvcGVuc2VzYW1l", "YWxhZGRpbjpvcGVuc2VzYW1l"),
    ("bearer-bare", "sent bearer AbCdEfGhIjKlMnOp1234", "AbCdEfGhIjKlMnOp1234"),
    ("civitai-env", 'export CIVITAI_API_KEY="0123456789abcdef0123"', "0123456789abcdef0123"),
    ("secret-env", "MY_SERVICE_SECRET=s3cr3tvalue ./run.sh", "s3cr3tvalue"),
    ("password-env", "DB_PASSWORD=hunter22 DB_USER=bob", "hunter22"),
    ("password-colon", "login password: hunter23, user: bob", "hunter23"),
    ("json-in-text", '{"api_key": "abc-json-secret", "seed": 1}', "abc-json-secret"),
    ("python-repr", "extra={'api_key_comfy_org': 'comfyui-xyz987'}", "comfyui-xyz987"),
    ("auth-token-comfy", "auth_token_comfy_org=tok987654", "tok987654"),
    ("cli-flag-equals", "python main.py --token=flagsecret1 --port 8188", "flagsecret1"),
    ("cli-flag-space", "python main.py --api-key flagsecret2 --port 8188", "flagsecret2"),
    (
        "pem-private-key",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXktdjEAAAA",
    ),
    ("cookie-header", "Cookie: session=abcdef123456", "abcdef123456"),
]


@pytest.mark.parametrize(
    ("text", "secret"), [(c[1], c[2]) for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES]
)
def test_secret_shapes_in_text_are_redacted(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out


KEEP_CASES: list[tuple[str, str]] = [
    ("oom-message", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
    ("manager-prefix", "[2026-01-02 10:11:12.345] got prompt"),
    ("prompt-executed", "Prompt executed in 12.34 seconds"),
    ("model-load", "loaded completely; 9000.00 MB usable, 4000.00 MB loaded, full load: True"),
    ("max-tokens", "max_tokens=512 token_normalization=none"),
    ("plain-url", "To see the GUI go to: http://127.0.0.1:8188"),
    ("ssh-git-url", "remote ssh://git@github.com/comfyanonymous/ComfyUI.git"),
    ("query-harmless", "http://127.0.0.1:8188/view?filename=a.png&type=output"),
    ("flags", "python main.py --listen 0.0.0.0 --port 8188 --lowvram --reserve-vram 1.5"),
    ("env-harmless", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PWD=/home/u"),
    ("token-prose", "Token indices sequence length is longer than the specified maximum"),
    ("empty", ""),
]


@pytest.mark.parametrize("text", [c[1] for c in KEEP_CASES], ids=[c[0] for c in KEEP_CASES])
def test_ordinary_text_passes_unchanged(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("apiKey", True),
        ("X-Api-Key", True),
        ("api_key_comfy_org", True),
        ("auth_token_comfy_org", True),
        ("token", True),
        ("hf_token", True),
        ("HF_TOKEN", True),
        ("CIVITAI_API_KEY", True),
        ("FAL_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("client_secret", True),
        ("password", True),
        ("DB_PASSWORD_FILE", True),
        ("passwd", True),
        ("Authorization", True),
        ("Set-Cookie", True),
        ("credentials", True),
        ("private_key", True),
        ("access_key", True),
        ("GITHUB_PAT", True),
        ("--api-key", True),
        ("max_tokens", False),
        ("token_normalization", False),
        ("tokenizer", False),
        ("key", False),
        ("cache_key", False),
        ("PWD", False),
        ("PATH", False),
        ("SSH_AUTH_SOCK", False),
        ("author", False),
        ("seed", False),
        ("client_id", False),
        ("", False),
    ],
)
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_nested_structure_keeps_shape_and_drops_secrets_at_any_depth() -> None:
    prompt_request: dict[str, Any] = {
        "client_id": "oom-sentinel-1",
        "prompt": {
            "3": {
                "class_type": "KSampler",
                "inputs": {"seed": 42, "steps": 20, "cfg": 7.5, "model": ["4", 0]},
            },
            "9": {
                "class_type": "SomeApiNode",
                "inputs": {"api_key": "sk-live-node-secret", "max_tokens": 256},
            },
        },
        "extra_data": {
            "api_key_comfy_org": "comfy-org-key-1",
            "auth_token_comfy_org": "comfy-org-token-2",
            "extra_pnginfo": {"workflow": {"nodes": [{"widgets_values": [HF, 1.0]}]}},
        },
    }
    out = redact(prompt_request)
    assert out["prompt"]["3"] == prompt_request["prompt"]["3"]
    assert out["prompt"]["9"]["inputs"] == {"api_key": REDACTED, "max_tokens": 256}
    assert out["extra_data"]["api_key_comfy_org"] == REDACTED
    assert out["extra_data"]["auth_token_comfy_org"] == REDACTED
    assert out["extra_data"]["extra_pnginfo"]["workflow"]["nodes"][0]["widgets_values"] == [
        REDACTED,
        1.0,
    ]
    assert out["client_id"] == "oom-sentinel-1"
    dumped = json.dumps(out)
    for secret in ("sk-live-node-secret", "comfy-org-key-1", "comfy-org-token-2", HF):
        assert secret not in dumped
    # the input is not modified
    assert prompt_request["extra_data"]["api_key_comfy_org"] == "comfy-org-key-1"


def test_env_dict_and_argv_list() -> None:
    proc = {
        "cmdline": ["python", "main.py", "--api-key", "argv-secret", "--port", "8188"],
        "env": {
            "HF_TOKEN": "env-secret-1",
            "CIVITAI_API_KEY": "env-secret-2",
            "OPENAI_API_KEY": "env-secret-3",
            "SMTP_PASSWORD": "env-secret-4",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "PATH": "/usr/bin",
        },
    }
    out = redact(proc)
    assert out["cmdline"] == ["python", "main.py", "--api-key", REDACTED, "--port", "8188"]
    assert out["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert out["env"]["PATH"] == "/usr/bin"
    assert "env-secret" not in json.dumps(out)


def test_tuples_stay_tuples_and_none_stays_none() -> None:
    assert redact(("--token", "t0ken-value", None)) == ("--token", REDACTED, None)
    assert redact({"token": None, "password": ""}) == {"token": None, "password": ""}


def test_cycles_and_absurd_depth_do_not_raise() -> None:
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = loop
    assert redact(loop) == {"a": 1, "self": REDACTED}
    deep: Any = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    for _ in range(5000):
        deep = [deep]
    assert HF not in repr(redact(deep))


def test_foreign_objects_pass_through() -> None:
    class Thing:
        pass

    thing = Thing()
    assert redact({"x": thing})["x"] is thing
    assert redact(b"HF_TOKEN=" + HF.encode()) == b"HF_TOKEN=" + REDACTED.encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_redact_never_raises_and_keeps_json_shape(value: Any) -> None:
    out = redact(value)
    json.dumps(out)  # still serialisable
    assert type(out) is type(value)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.sampled_from([HF, GHP, JWT, TELEGRAM, "AKIAIOSFODNN7EXAMPLE"]), st.text())
def test_known_token_is_redacted_whatever_text_surrounds_it(
    before: str, token: str, after: str
) -> None:
    # a token is whole when it stands apart from word characters on both sides
    out = redact_text(f"{before} {token} {after}")
    assert token not in out

"""Configuration: the documented defaults, the search order, and one-line errors."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from oom_sentinel.config.settings import (
    ENV_CONFIG,
    Settings,
    default_toml_text,
    load_settings,
    parse_settings,
)
from oom_sentinel.daemon.core.errors import ConfigError


def _all_keys(model: type, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            keys |= _all_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_default_toml_documents_every_key_and_equals_the_model_defaults() -> None:
    text = default_toml_text()
    data = tomllib.loads(text)
    assert parse_settings(data, "default.toml") == Settings()
    flat: set[str] = set()
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= {f"{key}.{sub}" for sub in value}
        else:
            flat.add(key)
    assert flat == _all_keys(Settings)


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[[instances]]\nport = 0\n", "instances[0].port: must be 1..65535, got 0"),
        ("[logs]\npoll_interval_ms = 0\n", "logs.poll_interval_ms: must be >= 1, got 0"),
        ("[logs]\npoll_intervl_ms = 5\n", "logs.poll_intervl_ms: unknown key"),
        (
            'log_level = "loud"\n',
            "log_level: input should be 'debug', 'info', 'warning' or 'error', got 'loud'",
        ),
        (
            '[sampling]\ninterval_ms = "fast"\n',
            "sampling.interval_ms: input should be a valid integer",
        ),
        ("[logs\n", "invalid TOML"),
    ],
    ids=["port-zero", "poll-zero", "typo", "bad-enum", "bad-int", "bad-toml"],
)
def test_invalid_config_is_one_line_naming_file_and_key(
    tmp_path: Path, toml: str, expected: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


def test_search_order_env_then_user_then_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "env.toml"
    env_file.write_text('log_level = "debug"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    user_file = tmp_path / "xdg" / "oom-sentinel" / "config.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text('log_level = "warning"\n')

    loaded = load_settings(environ={ENV_CONFIG: str(env_file)})
    assert (loaded.source, loaded.settings.log_level) == (env_file, "debug")
    loaded = load_settings(environ={})
    assert (loaded.source, loaded.settings.log_level) == (user_file, "warning")
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('log_level = "error"\n')
    loaded = load_settings(explicit, environ={ENV_CONFIG: str(env_file)})
    assert (loaded.source, loaded.settings.log_level) == (explicit, "error")


def test_env_config_naming_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(environ={ENV_CONFIG: str(tmp_path / "nope.toml")})


def test_cli_config_check_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[[instances]]\nport = 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr == f"oom-sentinel: error: {path}: instances[0].port: must be 1..65535, got 0\n"
    )
    assert "Traceback" not in proc.stderr


def test_cli_config_show_json_reports_source(tmp_path: Path) -> None:
    import json

    path = tmp_path / "config.toml"
    path.write_text("[sampling]\ninterval_ms = 500\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "oom_sentinel.daemon",
            "config",
            "show",
            "--json",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(proc.stdout)
    assert data["source"] == str(path)
    assert data["settings"]["sampling"]["interval_ms"] == 500

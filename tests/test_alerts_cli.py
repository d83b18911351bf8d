"""``oom-sentinel alert test``, run as a real process against a real webhook receiver."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from webhook_receiver import serve

from oom_sentinel.bisect.measure.workspace import free_port

PASSWORD = "pa55-w0rd-XYZ"
TOKEN = "TOKENabcdef123456"


def _run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "oom_sentinel.daemon",
            "alert",
            "test",
            "--config",
            str(config),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _config(tmp_path: Path, urls: list[str]) -> Path:
    path = tmp_path / "config.toml"
    listed = ", ".join(json.dumps(u) for u in urls)
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[alerts]\nurls = [{listed}]\n')
    return path


def test_alert_test_reports_every_channel_and_passes(tmp_path: Path) -> None:
    with serve() as receiver:
        url = receiver.url(auth=f"oom:{PASSWORD}", path=f"hook/{TOKEN}")
        proc = _run(_config(tmp_path, [url]))
        (request,) = receiver.received()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"ok      json://127.0.0.1:{receiver.port} #")
    assert lines[1].split() == ["ok", "log", "logged"]
    assert lines[2].startswith("ok      desktop feed (") and lines[2].endswith("written")
    assert request.json()["title"].startswith("TEST from oom-sentinel")
    assert base64.b64decode(request.headers["Authorization"][6:]).decode() == f"oom:{PASSWORD}"
    assert (tmp_path / "data" / "feed.json").is_file()
    for text in (proc.stdout, proc.stderr):
        assert PASSWORD not in text and TOKEN not in text


def test_alert_test_exits_1_when_a_channel_fails_and_leaks_nothing(tmp_path: Path) -> None:
    down = f"json://oom:{PASSWORD}@127.0.0.1:{free_port()}/{TOKEN}"
    with serve([500]) as receiver:
        erroring = receiver.url(path=f"x/{TOKEN}")
        proc = _run(_config(tmp_path, [down, erroring]), "--json")
    assert proc.returncode == 1
    results = json.loads(proc.stdout)
    assert [r["ok"] for r in results] == [False, False, True, True]
    assert "Connection error" in results[0]["detail"]
    assert "500" in results[1]["detail"]
    for text in (proc.stdout, proc.stderr):
        assert PASSWORD not in text and TOKEN not in text


def test_alert_test_with_a_bad_url_is_one_config_line(tmp_path: Path) -> None:
    proc = _run(_config(tmp_path, [f"nosuchservice://u:{PASSWORD}@host/{TOKEN}"]))
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "oom-sentinel: error: alerts.urls[0]: apprise cannot use nosuchservice://"
    )
    assert PASSWORD not in line and TOKEN not in line

"""A real S3-protocol server for the tests: moto's standalone server (``moto[server]``, the
[test] extra) in a child process on 127.0.0.1, and the dummy credentials boto3 needs, set for
the test only (no ~/.aws is ever read: the config and credentials files point into tmp)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["aws_env", "free_port", "s3_server"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def aws_env(tmp: Path) -> dict[str, str]:
    """Dummy credentials and a region; boto3's other sources switched off."""
    return {
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@contextmanager
def s3_server(log: Path) -> Iterator[str]:
    """Start moto's server; yields its endpoint URL, stops it afterwards."""
    port = free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=err,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MOTO_CALL_RESET_API": "false"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start: {log.read_text()}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

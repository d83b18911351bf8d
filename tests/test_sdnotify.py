"""The notify protocol against a real datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from oom_sentinel.daemon.service.sdnotify import Notifier, watchdog_interval_s


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield sock, path
    sock.close()


def test_messages_arrive_as_systemd_expects(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("watching 1 instance")
    assert sock.recv(4096) == b"READY=1\nSTATUS=watching 1 instance"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.reloading()
    fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
    assert fields["RELOADING"] == "1" and int(fields["MONOTONIC_USEC"]) > 0
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    notifier.close()


def test_abstract_namespace_socket() -> None:
    name = f"oom-sentinel-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).status("hello")
        assert sock.recv(100) == b"STATUS=hello"
    finally:
        sock.close()


def test_without_systemd_every_call_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready("x") is False
    assert notifier.watchdog() is False


def test_a_vanished_socket_is_not_fatal(tmp_path: Path) -> None:
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).watchdog() is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "20000000"}, 10.0),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "junk"}, None),
    ],
    ids=["unset", "zero", "20s", "other-pid", "junk"],
)
def test_watchdog_interval_is_half_the_timeout(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval_s(env) == expected


def test_watchdog_pid_of_this_process_enables_it() -> None:
    env = {"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval_s(env) == 2.0

"""A stand-in desktop notification server on a D-Bus session bus (not a test module).

Run as ``python notification_server.py OUT.jsonl`` with DBUS_SESSION_BUS_ADDRESS set: it owns
``org.freedesktop.Notifications`` (the freedesktop notification spec's name and interface),
appends every Notify call to OUT.jsonl, and prints ``ready`` once it owns the name. Nothing of
any real notification daemon is here.

No ``from __future__ import annotations`` here: dbus-fast reads D-Bus type signatures ("as",
"a{sv}") from the annotations, which must stay plain strings.
"""
# ruff: noqa: F821, F722

import asyncio
import json
import sys

from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, method, signal


class Notifications(ServiceInterface):
    def __init__(self, out: str) -> None:
        super().__init__("org.freedesktop.Notifications")
        self.out = out
        self.next_id = 0

    @method()
    def GetCapabilities(self) -> "as":
        return ["body"]

    @method()
    def GetServerInformation(self) -> "ssss":
        return ["stand-in", "oom-sentinel tests", "1.0", "1.2"]

    @method()
    def Notify(
        self,
        app_name: "s",
        replaces_id: "u",
        app_icon: "s",
        summary: "s",
        body: "s",
        actions: "as",
        hints: "a{sv}",
        expire_timeout: "i",
    ) -> "u":
        self.next_id += 1
        urgency = hints.get("urgency")
        record = {
            "app_name": app_name,
            "summary": summary,
            "body": body,
            "urgency": getattr(urgency, "value", None),
        }
        with open(self.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        return self.next_id

    @method()
    def CloseNotification(self, notification_id: "u"):
        return None

    @signal()
    def NotificationClosed(self) -> "uu":
        return [0, 0]

    @signal()
    def ActionInvoked(self) -> "us":
        return [0, ""]


async def main(out: str) -> None:
    bus = await MessageBus().connect()
    bus.export("/org/freedesktop/Notifications", Notifications(out))
    await bus.request_name("org.freedesktop.Notifications")
    print("ready", flush=True)
    await bus.wait_for_disconnect()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""The controller's MQTT link survives a broker restart: it reconnects by itself and subscribes again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.devcluster import broker as broker_module
from corral.devcluster.files import BROKER_CONTROLLER
from corral.devcluster.processes import free_port
from corral.devices.link import Inbound, MqttLink
from corral.devices.topics import Topics
from tests.broker_harness import own_broker
from tests.fleet_harness import publish

pytestmark = pytest.mark.integration


PASSWORDS = broker_module.new_passwords()  # the same accounts each time the test's broker starts


def controller_url(port: int) -> str:
    return f"mqtt://{BROKER_CONTROLLER}:{PASSWORDS['controller']}@127.0.0.1:{port}"


def test_the_link_reconnects_and_resubscribes_after_the_broker_restarts(tmp_path: Path) -> None:
    port = free_port()

    async def scenario() -> tuple[list[bytes], int]:
        received: list[bytes] = []
        link = MqttLink(controller_url(port), Topics("lnk"), lambda m: received.append(m.payload))
        with own_broker(tmp_path, port, PASSWORDS) as running:
            await link.start()
            await asyncio.wait_for(link.connected.wait(), 10)
            await asyncio.sleep(0.2)  # the subscription is made right after CONNACK
            await asyncio.to_thread(publish, running, [("lnk/dev-1/telemetry", b"before", False)])
            await _until(lambda: b"before" in received)
        # The broker is gone; the link notices and keeps retrying with backoff.
        await _until(lambda: not link.connected.is_set())
        with own_broker(tmp_path, port, PASSWORDS) as running:
            await asyncio.wait_for(link.connected.wait(), 40)
            await asyncio.sleep(0.2)
            await asyncio.to_thread(publish, running, [("lnk/dev-1/telemetry", b"after", False)])
            await _until(lambda: b"after" in received)
            reconnects = link.reconnects
            await link.stop()
        return received, reconnects

    received, reconnects = asyncio.run(scenario())
    assert received == [b"before", b"after"]
    assert reconnects == 1


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def test_inbound_messages_arrive_on_the_event_loop_thread(tmp_path: Path) -> None:
    port = free_port()

    async def scenario() -> bool:
        loop_thread = asyncio.get_running_loop()
        seen: list[bool] = []

        def on_message(_message: Inbound) -> None:
            seen.append(asyncio.get_running_loop() is loop_thread)

        link = MqttLink(controller_url(port), Topics("lnk"), on_message)
        with own_broker(tmp_path, port, PASSWORDS) as running:
            await link.start()
            await asyncio.wait_for(link.connected.wait(), 10)
            await asyncio.sleep(0.2)
            await asyncio.to_thread(publish, running, [("lnk/dev-1/status", b"online", False)])
            await _until(lambda: bool(seen))
            await link.stop()
        return all(seen)

    assert asyncio.run(scenario())

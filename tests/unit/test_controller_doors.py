"""The controller's doors and gates with several replicas (reconcile/doors.py), the command id an Intent keeps across
replicas, the epoch in every command, and `corral run`'s leader-election options. No I/O."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from click.testing import CliRunner

from corral.cli.run import run
from corral.contract.model import Contract
from corral.devices.link import MqttLink
from corral.devices.messages import Ack
from corral.devices.plan import Command
from corral.devices.topics import Topics
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.driver import DeviceRefused, Driver, Expectations
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.doors import Doors, NotOwned
from corral.reconcile.intents.execute import new_command_id
from corral.reconcile.shardwork import unheard
from corral.scale.hashing import shard_of
from corral.scale.ownership import ShardCallback, Standalone
from corral_sim.catalog import contract_for

SHARDS = 4


class Holding:
    """An Ownership holding a fixed set of shards (what ShardOwnership answers between two renewals)."""

    shards = SHARDS

    def __init__(self, held: set[int], epoch: int = 1_700_000_000_000) -> None:
        self.held, self._epoch = held, epoch

    def owns(self, device_id: str) -> bool:
        return shard_of(device_id, SHARDS) in self.held

    def epoch(self, device_id: str) -> int | None:
        return self._epoch if self.owns(device_id) else None

    def is_leader(self) -> bool:
        return 0 in self.held

    def owned(self) -> frozenset[int]:
        return frozenset(self.held)

    def set_callbacks(self, acquired: ShardCallback, releasing: ShardCallback, lost: ShardCallback) -> None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def device_in(shard: int, avoid: str = "") -> str:
    return next(d for i in range(1000) if shard_of(d := f"lamp-{i}", SHARDS) == shard and d != avoid)


def cached_device(cache: DeviceCache, namespace: str, name: str, device_id: str) -> None:
    cache.upsert({"apiVersion": "corral.dev/v1alpha1", "kind": "Device",
                  "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1,
                               "creationTimestamp": "2026-01-01T00:00:00Z"},
                  "spec": {"deviceId": device_id}})


def test_a_controller_alone_has_every_door_open_and_puts_no_epoch() -> None:
    doors = Doors(Standalone())
    assert not doors.sharded
    assert doors.takes("anything") and doors.takes(None) and doors.takes_intent("ns", "missing")
    doors.check("anything", "sending a command")
    doors.check_intent("ns", "missing", "writing Intent status")
    assert doors.epoch("anything") is None


def test_doors_refuse_devices_of_shards_not_held_and_an_intent_follows_its_device() -> None:
    cache = DeviceCache()
    mine, theirs = device_in(1), device_in(2)
    cached_device(cache, "home", "mine", mine)
    cached_device(cache, "home", "theirs", theirs)
    doors = Doors(Holding({1}), cache)
    assert doors.takes(mine) and not doors.takes(theirs)
    doors.check(mine, "sending a command")
    with pytest.raises(NotOwned, match=theirs):
        doors.check(theirs, "sending a command")
    assert doors.owns_intent("home", "mine") and not doors.owns_intent("home", "theirs")
    with pytest.raises(NotOwned, match="home/theirs"):
        doors.check_intent("home", "theirs", "writing Intent status")
    # An Intent whose Device does not exist is the leader's (shard 0's holder): not this replica's.
    assert not doors.takes_intent("home", "nowhere")
    assert Doors(Holding({0}), cache).takes_intent("home", "nowhere")


def test_a_draining_shard_takes_no_new_work_while_its_doors_stay_open() -> None:
    doors = Doors(Holding({0, 1}))
    device = device_in(1)
    doors.waiting.add(1)
    assert not doors.takes(device)
    doors.check(device, "writing Device status")  # work in flight may still finish
    doors.waiting.add(0)
    assert not doors.takes(None), "a draining leader takes no new leader's work either"


def test_an_intents_command_id_is_the_same_in_every_replica_and_another_for_another_intent() -> None:
    first = new_command_id("0b6a3c1e-5d7f-4e0a-9b51-2f1f3c9d8e70")
    assert first == new_command_id("0b6a3c1e-5d7f-4e0a-9b51-2f1f3c9d8e70")
    assert first.startswith("i-") and len(first) == 26
    assert first != new_command_id("0b6a3c1e-5d7f-4e0a-9b51-2f1f3c9d8e71")


class Published:
    def wait_for_publish(self, timeout: float | None = None) -> None:
        return None


class Link:
    """Records what would go to the broker."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def publish(self, topic: str, payload: dict[str, Any], qos: int = 1,
                trace: dict[str, str] | None = None) -> Published:
        self.sent.append((topic, payload))
        return Published()


def test_commands_carry_the_epoch_and_none_leaves_for_a_device_not_owned() -> None:
    mine, theirs = device_in(1), device_in(2)
    link = Link()
    # Only publish() is used: the recorder stands in for the broker connection.
    driver = Driver(cast(MqttLink, link), Topics("iot"), 0.05, Doors(Holding({1}, epoch=42)))

    async def attempt() -> None:
        with pytest.raises(TimeoutError):  # nobody acks: the command went out all the same
            await driver.send(mine, Command("c-1", "brightness", "set_value", 5))
        with pytest.raises(NotOwned):
            await driver.send(theirs, Command("c-2", "brightness", "set_value", 5))
        with pytest.raises(NotOwned):
            await driver.get_state(theirs)

    asyncio.run(attempt())
    assert link.sent == [(f"iot/{mine}/cmd", {"id": "c-1", "cmd": "set_value", "epoch": 42,
                                             "params": {"actuator": "brightness", "value": 5}})]
    assert driver.tracker.in_flight == 0, "a refused command left a wait behind"


@pytest.mark.parametrize(("args", "said"), [
    (["--shards", "3"], "--shards 3 needs --leader-elect"),
    (["--leader-elect", "--lease-duration", "3", "--renew-deadline", "3"], "renew deadline < lease duration"),
    (["--leader-elect", "--identity", " "], "an empty identity"),
])
def test_corral_run_refuses_leader_election_settings_that_cannot_work(args: list[str], said: str) -> None:
    result = CliRunner().invoke(run, ["--mqtt", "mqtt://corral-controller@127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    assert said in result.output


STALE = {"id": "i-1", "ok": False, "error": "stale epoch 5: this device has seen epoch 9", "state": {},
         "stale_epoch": {"sent": 5, "seen": 9}}


@pytest.mark.parametrize(("owned", "raised"), [(False, NotOwned), (True, DeviceRefused)])
def test_a_stale_epoch_refusal_leaves_the_intent_to_the_new_owner_only_when_the_device_is_no_longer_ours(
        owned: bool, raised: type[Exception]) -> None:
    """A replica whose command lost to a newer epoch records no decision (its Intent is the new owner's); a device
    that says so while this replica still owns it is refusing, and the Intent fails with its words."""
    async def settle() -> BaseException | None:
        expectations = Expectations()
        pin = expectations.pin("lamp-1", "power", True, "i-1", "intent-1")
        assert expectations.settle("lamp-1", Ack.model_validate(STALE), owned)
        return pin.future.exception()

    error = asyncio.run(settle())
    assert type(error) is raised
    assert "9" in str(error)


def test_a_malformed_stale_epoch_field_does_not_lose_the_ack() -> None:
    ack = Ack.model_validate({**STALE, "stale_epoch": {"sent": "five"}})
    assert ack.stale_epoch is None and not ack.ok and ack.id == "i-1"


def test_a_shard_taken_over_waits_for_each_devices_contract_and_presence() -> None:
    """Between a device's retained contract and its retained status, an Intent decided at once would find it
    offline (DEVICE_GONE, seen in the sharding test): both must have come in."""
    fleet = Fleet()
    heard, contract_only, nothing, elsewhere = "lamp-1", "lamp-2", "lamp-3", "lamp-4"
    runtimes = {device_id: fleet.add(device_id) for device_id in (heard, contract_only)}
    for rt in runtimes.values():
        rt.contract = Contract.model_validate({**contract_for("light"), "device_id": rt.device_id})
    runtimes[heard].online = False  # an `offline` heard is presence known: the device is gone, truly
    mine = {heard, contract_only, nothing}
    assert unheard([heard, contract_only, nothing, elsewhere], fleet, mine.__contains__) == [contract_only, nothing]
    runtimes[contract_only].online = True
    assert unheard([heard, contract_only, nothing, elsewhere], fleet, mine.__contains__) == [nothing]

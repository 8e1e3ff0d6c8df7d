"""Leader election on the local plane: two `corral run --leader-elect` processes, one shard, a few simulated lights.

What is proved comes from outside the controllers: the shard Lease as the API server holds it (who, since when:
its acquireTime in ms is the epoch the holder puts in its commands), the broker (a spy account that reads every
command on `<prefix>/+/cmd`, with the time it arrived) and the simulated hardware (what each light was told to
do). The controllers' logs are only read to say why a test failed.

- Only the leader commands, and every command carries its epoch.
- SIGKILL of the leader with Intents in flight: the standby takes the Lease within the lease duration plus 5 s,
  every Intent ends once, and each light applied its value once (a command resent by the new leader carries the
  Intent's deterministic id, which the firmware answers from its stored ack).
- SIGSTOP of the leader past its renew deadline, then SIGCONT: nothing with its epoch reached the broker after
  its deadline, and it carries on as a follower (alive, the Lease stays with the other, no command of its own).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import GROUP, VERSION
from corral.client.intents import submit
from corral.devcluster.plane import Plane
from corral.reconcile.intents.execute import new_command_id
from tests.controller_harness import ControllerProcess, finals
from tests.fleet_harness import Watcher, hardware_applies, running_fleet
from tests.harness import grant, healthz, wait_for

pytestmark = pytest.mark.integration

LEASE_DURATION_S = 4.0
RENEW_DEADLINE_S = 3.0
ELECTION = ["--leader-elect", "--lease-duration", f"{LEASE_DURATION_S:g}", "--renew-deadline",
            f"{RENEW_DEADLINE_S:g}", "--retry-period", "0.5"]
LEASE = "corral-controller-shard-0"  # --lease-prefix's default, shard 0
LIGHTS = [f"lamp-{i}" for i in range(4)]
REPLICAS = ("replica-a", "replica-b")


@dataclass(frozen=True)
class Hold:
    holder: str
    epoch: int | None  # acquireTime in ms

    @property
    def replica(self) -> int | None:
        return next((i for i, name in enumerate(REPLICAS) if self.holder.startswith(name + "_")), None)


def read_hold(admin: kubernetes.client.ApiClient, namespace: str) -> Hold | None:
    try:
        lease = kubernetes.client.CoordinationV1Api(admin).read_namespaced_lease(LEASE, namespace)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return None
        raise
    acquired = lease.spec.acquire_time
    epoch = (acquired - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1) if acquired else None
    return Hold(lease.spec.holder_identity or "", epoch)


def held(admin: kubernetes.client.ApiClient, namespace: str, by: set[int]) -> Hold | None:
    hold = read_hold(admin, namespace)
    return hold if hold is not None and hold.replica in by and hold.epoch is not None else None


def commands(watcher: Watcher, since: float = 0.0) -> list[tuple[float, str, dict[str, Any]]]:
    """(arrival, device id, command) of every command the broker delivered since `since` (monotonic)."""
    return [(m.at, m.device_id, m.json()) for m in watcher.messages(kind="cmd") if m.at >= since]


def same_epoch(epoch: Any, hold: Hold) -> bool:
    # acquireTime is kept in microseconds by the API server, the epoch in ms: a rounding apart at most.
    return isinstance(epoch, int) and hold.epoch is not None and abs(epoch - hold.epoch) <= 1


def brightness(light: str, value: int, requester: str) -> dict[str, Any]:
    return {"device": light, "actuator": "brightness", "action": "set_value", "params": {"value": value},
            "reason": "leader election test", "requester": requester}



def in_sync(admin: kubernetes.client.ApiClient, namespace: str) -> bool:
    items = kubernetes.client.CustomObjectsApi(admin).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "devices")["items"]
    return sum(1 for i in items if (i.get("status") or {}).get("inSync")
               and (i.get("status") or {}).get("reported")) == len(LIGHTS)


@dataclass
class Setup:
    admin: kubernetes.client.ApiClient
    operator: kubernetes.client.ApiClient
    requester: str
    namespace: str
    replicas: list[ControllerProcess]
    watcher: Watcher
    fleet: Any

    def submit_all(self, tag: str, value: int) -> dict[str, str]:
        """An Intent per light; Intent name -> light."""
        asked = {f"{tag}-{light}": light for light in LIGHTS}
        for name, light in asked.items():
            submit(self.operator, self.namespace, name, brightness(light, value, self.requester))
        return asked

    def ended(self, asked: dict[str, str], timeout_s: float = 60) -> dict[str, str]:
        return wait_for(lambda: finals(self.admin, self.namespace, list(asked)), f"Intents {sorted(asked)} to end",
                        timeout_s=timeout_s)

    def applied_once(self, asked: dict[str, str], value: int) -> None:
        for name, light in asked.items():
            times = hardware_applies(self.fleet, light).count(("brightness", value))
            sent = [(round(at, 2), c.get("id"), c.get("epoch"), c.get("params")) for at, d, c in commands(self.watcher)
                    if d == light]
            assert times == 1, f"{name}: {light} was set to {value} {times} times; its commands: {sent}"


@contextmanager
def two_replicas(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str,
                 tmp_path: Path) -> Iterator[Setup]:
    operator = grant(plane, admin, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    requester = f"system:serviceaccount:{namespace}:operator"
    prefix = f"elect-{uuid.uuid4().hex[:6]}"
    replicas = [
        ControllerProcess(plane, namespace, prefix, tmp_path / f"{name}.log", *ELECTION,
                          "--identity", f"{name}_{secrets.token_hex(4)}", "--lease-namespace", namespace,
                          username=f"corral-controller-{i + 1}", checkpoint=f"corral-controller-{name}")
        for i, name in enumerate(REPLICAS)
    ]
    watcher = Watcher(plane, prefix, "election")
    with running_fleet(plane, prefix, dict.fromkeys(LIGHTS, "light"), enroll_in=(admin, namespace)) as fleet:
        try:
            for replica in replicas:
                replica.start()
            wait_for(lambda: in_sync(admin, namespace), "every light in sync", timeout_s=90, interval_s=0.5)
            yield Setup(admin, operator, requester, namespace, replicas, watcher, fleet)
        except BaseException:
            for replica in replicas:
                print(f"--- {replica.log_path.name}\n{replica.log_tail(60)}")
            raise
        finally:
            watcher.close()
            for replica in replicas:
                if replica.proc is not None:
                    replica.stop()


def test_only_the_leader_commands_and_a_killed_leader_is_replaced_with_intents_ending_once(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path,
) -> None:
    with two_replicas(plane, corral_api, namespace, tmp_path) as setup:
        admin = setup.admin
        leader = wait_for(lambda: held(admin, namespace, {0, 1}), "a leader", timeout_s=30)
        assert leader is not None and leader.replica is not None

        # (a) Steady: every command so far, and those of a round of Intents, come from the leader alone.
        steady = setup.submit_all("steady", 21)
        assert set(setup.ended(steady).values()) == {"EXECUTED"}
        sent = commands(setup.watcher)
        assert sent, "no command reached the broker"
        foreign = [(d, c.get("id"), c.get("epoch")) for _at, d, c in sent if not same_epoch(c.get("epoch"), leader)]
        assert not foreign, f"commands without the leader's epoch {leader.epoch}: {foreign[:10]}"
        assert read_hold(admin, namespace) == leader, "the Lease changed hands with both replicas up"
        setup.applied_once(steady, 21)

        # (b) Kill the leader with Intents in flight.
        before = time.monotonic()
        flight = setup.submit_all("flight", 63)
        setup.watcher.wait_for("a command of an Intent in flight", lambda: any(
            c.get("params", {}).get("value") == 63 for _at, _d, c in commands(setup.watcher, before)), timeout_s=30)
        setup.replicas[leader.replica].kill()
        killed = time.monotonic()
        standby = 1 - leader.replica
        successor = wait_for(lambda: held(admin, namespace, {standby}), "the standby to take the Lease",
                             timeout_s=LEASE_DURATION_S + 10, interval_s=0.1)
        assert successor is not None
        took_s = time.monotonic() - killed
        assert took_s <= LEASE_DURATION_S + 5, f"the standby took the Lease {took_s:.1f} s after the kill"
        assert successor.epoch is not None and leader.epoch is not None and successor.epoch > leader.epoch

        assert set(setup.ended(flight).values()) == {"EXECUTED"}
        setup.applied_once(flight, 63)
        by_id: dict[str, set[Any]] = defaultdict(set)
        for at, _light, command in commands(setup.watcher, before):
            epoch = command.get("epoch")
            # The dead leader's last commands may reach the spy a moment after the kill; the successor's only
            # after it took the Lease.
            assert same_epoch(epoch, leader) or (same_epoch(epoch, successor) and at > killed), \
                f"command {command.get('id')} at +{at - before:.2f} s carries epoch {epoch}"
            if command.get("params", {}).get("value") == 63:
                by_id[command["id"]].add(epoch)
        # One command id per Intent, whoever sent it; one sent under both epochs is an Intent the dead leader had
        # sent and not finished: the new leader resent the same id, and the firmware answered it from its memory
        # (the hardware acted once, above).
        assert len(by_id) == len(flight), f"the Intents in flight went out under {len(by_id)} ids: {dict(by_id)}"
        unfinished = {n for n, s in _statuses(admin, namespace, list(flight)).items() if "after a restart" in s}
        print(f"standby took over {took_s:.1f} s after the kill; {sum(len(e) > 1 for e in by_id.values())} "
              f"command id(s) resent under the new epoch; {len(unfinished)} Intent(s) said resumed")


def test_a_frozen_leader_sends_nothing_after_its_deadline_and_resumes_as_a_follower(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path,
) -> None:
    with two_replicas(plane, corral_api, namespace, tmp_path) as setup:
        admin = setup.admin
        leader = wait_for(lambda: held(admin, namespace, {0, 1}), "a leader", timeout_s=30)
        assert leader is not None and leader.replica is not None
        follower = 1 - leader.replica
        frozen, other = setup.replicas[leader.replica], setup.replicas[follower]

        # Intents flowing as it freezes: some of its work is cut off mid-way.
        before = setup.submit_all("before", 33)
        frozen.freeze()
        # Its last renewal was before the freeze: its deadline is at most this far after it.
        deadline = time.monotonic() + RENEW_DEADLINE_S
        successor = wait_for(lambda: held(admin, namespace, {follower}), "the other replica to lead",
                             timeout_s=LEASE_DURATION_S + 10, interval_s=0.1)
        assert successor is not None
        during = setup.submit_all("during", 44)
        assert set(setup.ended(during).values()) == {"EXECUTED"}

        thawed = time.monotonic()
        frozen.thaw()
        # Back as a follower: it answers its probe again, the Lease stays with the other, and Intents made now are
        # driven by the new leader alone.
        wait_for(lambda: healthz(frozen.health_port), "the thawed replica to answer /healthz", timeout_s=30)
        after = setup.submit_all("after", 55)
        assert set(setup.ended(after).values()) == {"EXECUTED"}
        assert frozen.proc is not None and frozen.proc.poll() is None, "the thawed replica exited"
        assert other.proc is not None and other.proc.poll() is None
        assert held(admin, namespace, {follower}) == successor, "the Lease left the new leader"

        # Nothing of its epoch while it was frozen past its deadline. A command it had handed to its MQTT client
        # just before the freeze is written when it resumes (no check-then-send closes that gap: the device's
        # epoch does): such a command may arrive after the thaw, only for an Intent it was executing when frozen
        # (made before the freeze), and the hardware below acted once all the same. Nothing else of its own.
        in_flight = {new_command_id(uid) for uid in _uids(admin, namespace, list(before))}
        late = [(round(at - deadline, 2), d, c.get("id")) for at, d, c in commands(setup.watcher, deadline)
                if same_epoch(c.get("epoch"), leader)]
        assert all(at > thawed - deadline and command_id in in_flight for at, _d, command_id in late), \
            f"the frozen leader's epoch reached the broker after its renew deadline (while frozen, or new): {late}"
        stray = [(d, c.get("id"), c.get("epoch")) for _at, d, c in commands(setup.watcher, thawed)
                 if not same_epoch(c.get("epoch"), successor)
                 and not (same_epoch(c.get("epoch"), leader) and c.get("id") in in_flight)]
        assert not stray, f"commands after the thaw not from the new leader: {stray}"
        assert set(setup.ended(before).values()) == {"EXECUTED"}
        setup.applied_once(before, 33)
        setup.applied_once(during, 44)
        setup.applied_once(after, 55)


def _uids(admin: kubernetes.client.ApiClient, namespace: str, names: list[str]) -> list[str]:
    objects = kubernetes.client.CustomObjectsApi(admin)
    return [objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", n)["metadata"]["uid"]
            for n in names]


def _statuses(admin: kubernetes.client.ApiClient, namespace: str, names: list[str]) -> dict[str, str]:
    items = kubernetes.client.CustomObjectsApi(admin).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "intents")["items"]
    return {i["metadata"]["name"]: str((i.get("status") or {}).get("message", "")) for i in items
            if i["metadata"]["name"] in names}

"""Devices sharded across three controller replicas on the local plane, and one replica killed.

Three `corral run --leader-elect --shards 12` processes, each with its own broker account and its own Kubernetes
identity (a ServiceAccount of its own, so kube-apiserver's audit log says which replica wrote what), drive a fleet
of simulated lights: 300 in the default run, 3,000 with `--slow`. What is proved comes from outside the
controllers: the shard Leases (who holds what since when), the broker (every command and the epoch it carries,
seen by an observer account), the API server's audit log (who wrote each Device's status) and the simulated
hardware (what each light was told to do).

- Each device is driven by exactly one replica: once the shards are settled, every command a device receives
  carries the epoch of its shard's Lease (its acquireTime in ms) as the holder took it, and the Device's status
  is written by the holder's identity only.
- SIGKILL the replica that holds shard 0 (the leader) while Intents are in flight on its devices: its shards move
  to the two others within the lease duration plus 10 s, the others' shards do not move (same holder, same
  acquireTime), and every Intent ends EXECUTED with its light set exactly once (a resend by the new owner carries
  the same command id, which the firmware deduplicates).

The default run took 50 s on two cores, plane start included (enrolling and registering 300 devices is most of
it); the broker starts with every device account already made (tests/sharding_harness.py).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import GROUP, VERSION
from corral.client.intents import submit
from corral.devcluster.plane import Plane
from corral.scale.hashing import shard_of
from tests.controller_harness import ControllerProcess, finals
from tests.fleet_harness import Watcher, hardware_applies, running_fleet
from tests.gateway_harness import kubeconfig_for
from tests.harness import grant, service_account_token, wait_for
from tests.sharding_harness import broker_with_accounts, enroll_many

pytestmark = pytest.mark.integration

REPLICAS = 3
SHARDS = 12
LEASE_DURATION_S = 4.0
ELECTION = ["--leader-elect", "--shards", str(SHARDS), "--lease-duration", f"{LEASE_DURATION_S:g}",
            "--renew-deadline", "3", "--retry-period", "0.5"]
LEASE_PREFIX = "corral-controller"  # --lease-prefix's default
STEADY_VALUE = 11  # brightness asked of the probed lights once settled (no light boots at it)
IN_FLIGHT_VALUE = 37  # brightness asked by the Intents in flight when a replica dies


@dataclass(frozen=True)
class Hold:
    """One shard Lease as read from the API server."""

    replica: int | None  # which of our replicas holds it (by its identity's prefix), None: nobody
    holder: str
    epoch_ms: int | None  # acquireTime in ms: the epoch the holder puts in its commands
    transitions: int


def replica_name(i: int) -> str:
    return f"sharding-r{i}"


def replica_kubeconfig(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str, i: int,
                       directory: Path) -> Path:
    """A kubeconfig of replica i's own ServiceAccount, bound to cluster-admin: the API server's audit log then
    names the replica behind each write (every replica on the plane's admin token would be one user)."""
    account = replica_name(i)
    token = service_account_token(admin, namespace, account)
    kubernetes.client.RbacAuthorizationV1Api(admin).create_cluster_role_binding({
        "metadata": {"name": f"{namespace}-{account}", "labels": {"corral.dev/test": "sharding"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    })
    return kubeconfig_for(plane, token, directory / f"{account}.kubeconfig", namespace)


def epoch_ms(at: datetime | None) -> int | None:
    if at is None:
        return None
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // _MS


_MS = datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


def read_leases(admin: kubernetes.client.ApiClient, namespace: str) -> dict[int, Hold]:
    listed = kubernetes.client.CoordinationV1Api(admin).list_namespaced_lease(namespace).items
    holds: dict[int, Hold] = {}
    for lease in listed:
        name = lease.metadata.name
        if not name.startswith(f"{LEASE_PREFIX}-shard-"):
            continue
        shard = int(name.rsplit("-", 1)[1])
        holder = lease.spec.holder_identity or ""
        replica = next((i for i in range(REPLICAS) if holder.startswith(replica_name(i) + "_")), None)
        holds[shard] = Hold(replica, holder, epoch_ms(lease.spec.acquire_time), lease.spec.lease_transitions or 0)
    return holds


def settled(admin: kubernetes.client.ApiClient, namespace: str, live: set[int]) -> dict[int, Hold]:
    """The Leases once every shard is held by a live replica, each holding its even share; else {}."""
    holds = read_leases(admin, namespace)
    if len(holds) != SHARDS or any(h.replica not in live for h in holds.values()):
        return {}
    per = Counter(h.replica for h in holds.values())
    share = -(-SHARDS // len(live))
    return holds if all(per[i] <= share for i in live) else {}


def stable(admin: kubernetes.client.ApiClient, namespace: str, live: set[int], timeout_s: float) -> dict[int, Hold]:
    """Settled Leases that stay the same over two reads a retry period and more apart."""
    def probe() -> dict[int, Hold]:
        first = settled(admin, namespace, live)
        if not first:
            return {}
        time.sleep(1.0)  # two reads of the Leases apart, not a wait for an outcome
        return first if settled(admin, namespace, live) == first else {}

    return wait_for(probe, f"the {SHARDS} shards held evenly by replicas {sorted(live)}", timeout_s=timeout_s,
                    interval_s=0.5)


def status_writers(plane: Plane, namespace: str, since: datetime) -> dict[str, set[str]]:
    """Device name -> the users whose writes of its status the API server accepted since `since` (its audit)."""
    writers: dict[str, set[str]] = defaultdict(set)
    with plane.audit_log.open() as log:
        for line in log:
            if namespace not in line or '"status"' not in line:
                continue
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if (event.get("stage") != "ResponseComplete" or ref.get("namespace") != namespace
                    or ref.get("resource") != "devices" or ref.get("subresource") != "status"
                    or (event.get("responseStatus") or {}).get("code", 500) >= 300):
                continue
            at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if at >= since:
                writers[ref["name"]].add(event["user"]["username"])
    return writers


def commands_since(watcher: Watcher, since: float) -> list[tuple[str, dict[str, Any]]]:
    """(device id, command) of every command the broker delivered to devices since `since` (monotonic)."""
    return [(m.device_id, m.json()) for m in watcher.messages(kind="cmd") if m.at >= since]


def assert_one_driver(commands: list[tuple[str, dict[str, Any]]], holds: dict[int, Hold]) -> None:
    """Every command carries the epoch of its device's shard as its current holder took it."""
    wrong = []
    for device_id, command in commands:
        hold = holds[shard_of(device_id, SHARDS)]
        epoch = command.get("epoch")
        if hold.epoch_ms is None or not isinstance(epoch, int) or abs(epoch - hold.epoch_ms) > 1:
            wrong.append((device_id, command.get("id"), epoch, hold.holder, hold.epoch_ms))
    assert not wrong, f"{len(wrong)} commands not from their shard's holder (device, id, epoch, holder, its epoch): " \
                      f"{wrong[:10]}"


def assert_status_by_holders(plane: Plane, namespace: str, since: datetime, holds: dict[int, Hold]) -> int:
    writers = status_writers(plane, namespace, since)
    wrong = {}
    for name, users in writers.items():
        holder = holds[shard_of(name, SHARDS)].replica
        expected = f"system:serviceaccount:{namespace}:{replica_name(holder if holder is not None else -1)}"
        if users != {expected}:
            wrong[name] = (sorted(users), expected)
    assert not wrong, f"Device status written by others than the shard's holder: {dict(list(wrong.items())[:10])}"
    return len(writers)


def pick(devices: list[str], shards: set[int], per_shard: int) -> list[str]:
    chosen: dict[int, list[str]] = defaultdict(list)
    for device_id in devices:
        shard = shard_of(device_id, SHARDS)
        if shard in shards and len(chosen[shard]) < per_shard:
            chosen[shard].append(device_id)
    return [d for shard in sorted(chosen) for d in chosen[shard]]


def intent_spec(device_id: str, value: int, requester: str) -> dict[str, Any]:
    return {"device": device_id, "actuator": "brightness", "action": "set_value", "params": {"value": value},
            "reason": "sharding test", "requester": requester}



def all_in_sync(admin: kubernetes.client.ApiClient, namespace: str, count: int) -> bool:
    items = kubernetes.client.CustomObjectsApi(admin).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "devices")["items"]
    return sum(1 for i in items if (i.get("status") or {}).get("inSync")) >= count


@pytest.fixture
def replica_bindings(kube: kubernetes.client.ApiClient) -> Iterator[None]:
    yield
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube)
    for binding in rbac.list_cluster_role_binding(label_selector="corral.dev/test=sharding").items:
        rbac.delete_cluster_role_binding(binding.metadata.name)


@pytest.mark.parametrize("size", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_each_device_has_one_driver_and_a_killed_replicas_shards_move_with_intents_ending_once(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path,
    replica_bindings: None, size: int,
) -> None:
    admin = corral_api
    scale = size / 300  # timeouts grow with the fleet
    operator = grant(plane, admin, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    requester = f"system:serviceaccount:{namespace}:operator"
    prefix = f"shard-{uuid.uuid4().hex[:6]}"
    names = [f"light-{i:05d}" for i in range(size)]
    credentials = enroll_many(admin, namespace, dict.fromkeys(names, "light"))
    # Every device's account is in the broker's state before it starts (tests/sharding_harness.py).
    with broker_with_accounts(tmp_path / "broker", prefix, credentials) as prebuilt:
        ours = prebuilt.plane(plane)
        replicas = [
            ControllerProcess(replace(ours, kubeconfig=replica_kubeconfig(plane, admin, namespace, i, tmp_path)),
                              namespace, prefix, tmp_path / f"{replica_name(i)}.log", *ELECTION,
                              "--identity", f"{replica_name(i)}_{secrets.token_hex(4)}", "--lease-namespace",
                              namespace, mqtt_url=prebuilt.controller_url(f"corral-controller-{i + 1}"),
                              checkpoint=f"corral-controller-{replica_name(i)}")
            for i in range(REPLICAS)
        ]
        watcher = Watcher(ours, prefix, "sharding")
        with running_fleet(ours, prefix, dict.fromkeys(names, "light"), credentials=credentials,
                           telemetry_interval_s=30.0, connect_spread_s=size / 300) as fleet:
            try:
                for replica in replicas:
                    replica.start()
                live = set(range(REPLICAS))
                try:
                    wait_for(lambda: all_in_sync(admin, namespace, size), f"all {size} devices in sync",
                             timeout_s=180 * scale, interval_s=1.0)
                except AssertionError as err:
                    # Shards that keep changing hands never let the devices settle: say so, from the Leases.
                    transitions = sum(h.transitions for h in read_leases(admin, namespace).values())
                    raise AssertionError(f"{err}; the {SHARDS} shard Leases changed hands {transitions} times "
                                         f"(replica logs: {tmp_path})") from None
                holds = stable(admin, namespace, live, timeout_s=60)
                since_mono, since_wall = time.monotonic(), datetime.now(UTC)

                # Steady: two lights per shard asked for a brightness; every command carries the holder's epoch.
                probes = pick(names, set(range(SHARDS)), 2)
                steady = {f"steady-{d}": d for d in probes}
                for name, device_id in steady.items():
                    submit(operator, namespace, name, intent_spec(device_id, STEADY_VALUE, requester))
                codes = wait_for(lambda: finals(admin, namespace, list(steady)), "the steady Intents to end", timeout_s=60)
                assert set(codes.values()) == {"EXECUTED"}, codes
                assert read_leases(admin, namespace) == holds, "the shards moved with no replica gone"
                assert_one_driver(commands_since(watcher, since_mono), holds)
                written = assert_status_by_holders(plane, namespace, since_wall, holds)
                assert written >= len(probes), f"only {written} Devices had their status written after their Intents"

                # Kill the leader (shard 0's holder) with Intents in flight on its devices and, beside them, others'.
                victim = holds[0].replica
                assert victim is not None
                moved = {k for k, h in holds.items() if h.replica == victim}
                kept = {k: h for k, h in holds.items() if h.replica != victim}
                in_flight = {f"flight-{d}": d for d in pick(names, moved, 3) + pick(names, set(kept), 1)}
                before_kill = time.monotonic()
                for name, device_id in in_flight.items():
                    submit(operator, namespace, name, intent_spec(device_id, IN_FLIGHT_VALUE, requester))
                victims_devices = {d for d in in_flight.values() if shard_of(d, SHARDS) in moved}
                watcher.wait_for("a command from the victim for an Intent in flight", lambda: any(
                    d in victims_devices and c.get("params", {}).get("value") == IN_FLIGHT_VALUE
                    for d, c in commands_since(watcher, before_kill)), timeout_s=30)
                replicas[victim].kill()
                killed = time.monotonic()
                live.discard(victim)

                def taken_over() -> dict[int, Hold]:
                    now = read_leases(admin, namespace)
                    unmoved = {k: now[k] for k in kept}
                    assert unmoved == kept, f"shards of live replicas moved: {kept} -> {unmoved}"
                    return now if all(now[k].replica in live for k in moved) else {}

                after = wait_for(taken_over, f"shards {sorted(moved)} taken by replicas {sorted(live)}",
                                 timeout_s=LEASE_DURATION_S + 10 + 5, interval_s=0.2)
                took_s = time.monotonic() - killed
                assert took_s <= LEASE_DURATION_S + 10, f"the dead replica's shards moved after {took_s:.1f} s"
                since_mono, since_wall = time.monotonic(), datetime.now(UTC)

                codes = wait_for(lambda: finals(admin, namespace, list(in_flight)), "the Intents in flight to end",
                                 timeout_s=60)
                assert set(codes.values()) == {"EXECUTED"}, codes
                # Exactly once on the hardware: each light was set to the in-flight value once, under one command id.
                for name, device_id in in_flight.items():
                    applies = hardware_applies(fleet, device_id).count(("brightness", IN_FLIGHT_VALUE))
                    assert applies == 1, f"{name}: the light {device_id} was set {applies} times"
                    ids = {c.get("id") for d, c in commands_since(watcher, before_kill)
                           if d == device_id and c.get("params", {}).get("value") == IN_FLIGHT_VALUE}
                    assert len(ids) == 1, f"{name} was sent under several command ids: {ids}"
                # After the takeover, the new holders alone drive and write their devices.
                assert read_leases(admin, namespace) == after, "the shards moved again after the takeover"
                assert_one_driver(commands_since(watcher, since_mono), after)
                assert_status_by_holders(plane, namespace, since_wall, after)
                print(f"{size} devices: the dead replica's {len(moved)} shards moved in {took_s:.1f} s; "
                      f"{len(in_flight)} Intents in flight ended once")
            finally:
                watcher.close()
                for replica in replicas:
                    if replica.proc is not None:
                        replica.stop()

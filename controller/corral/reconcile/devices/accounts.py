"""The broker's device accounts, kept equal to the enrollment Secrets (Mosquitto's dynamic security plugin).

The controller is the only writer of device accounts. It reads the enrollment Secrets (type
`corral.dev/device-credential`, see client/enroll.py) and, whenever they change and whenever its MQTT link
(re)connects, lists what the broker holds and sends only the commands that close the difference
(`devices.accounts.plan_accounts`). The broker may have restarted without its state: every account comes
back from the Secrets. Revoked enrollments are disabled (the broker disconnects the device), deleted ones
deleted. A namespace enrolls at most `limit` devices; enrollments beyond it (the newest) get no account,
and a Warning Event on their Device says why.

Disabling, deleting or changing an account throws its device off the broker without its Last Will, so the
device's retained status still says `online`. The broker's answer to such a command is the moment the device is
gone: `on_kicked` is told right then, on the loop, in the order the link delivers messages, so a device that
reconnects (it has the new password) and says `online` again is heard after, and wins. A revoked device stays
barred (`barred`): a retained `online` of it, read after a restart, is an old word.

Bridge and source Secrets (devices.bridge_accounts) are read only from the namespaces the operator names
(`bridge_namespaces`: `corral run --bridge-namespace`, by default the controller's own): anyone who may create a
Secret in some watched namespace must not be able to make a broker account. What is refused (a Secret elsewhere, a
username Corral keeps for another purpose, an overlapping topic root, a broker client Corral did not make) is told
on the Secret (reconcile/devices/secret_refusals.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from corral.api.device import Device
from corral.client.enroll import Credential, credential_of
from corral.devices.accounts import CONTROL_TOPIC, Account, Command, account_plan, disconnects
from corral.devices.bridge_accounts import (
    BridgeCredential,
    Bridged,
    Refused,
    Source,
    plan_bridge_accounts,
    secret_of,
)
from corral.devices.bridge_checks import Reserved
from corral.devices.link import MqttLink
from corral.devices.topics import Topics
from corral.kube.cache import Key, key_of
from corral.kube.tasks import cancel_all
from corral.kube.typed import Body
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.secret_refusals import SecretRefusals

log = logging.getLogger(__name__)

# Commands per message. The plugin rewrites its whole state file for every command, and the broker does
# nothing else meanwhile: at 5,000 devices a 200-command message held it for over 20 s. Small messages,
# each answered before the next, let device traffic through in between; the total time is the same.
BATCH = 10
ANSWER_S = 30.0
GRANTS_CHECK_S = 1.0
# Broker commands that change who may connect, as the audit log names them.
ENROLLMENT_FACTS = {"createClient": "device.enrolled", "enableClient": "device.enrolled",
                    "disableClient": "device.revoked", "deleteClient": "device.revoked"}


class BrokerAccounts:
    def __init__(self, link: MqttLink, topics: Topics, notices: DeviceNotices, limit_per_namespace: int,
                 on_kicked: Callable[[str, str], None] = lambda device_id, why: None,
                 devices: Callable[[], list[Device]] = lambda: [], home_namespace: str = "",
                 bridge_namespaces: tuple[str, ...] = (), controller_username: str = "") -> None:
        self.link = link
        self.home_namespace = home_namespace  # the controller's own (its pod's), where the chart's bridge Secret is
        self.bridge_namespaces = bridge_namespaces  # the only namespaces whose bridge and source Secrets count
        self.controller_username = controller_username  # its replicas' share the stem: no bridge may take them
        self.secret_refusals = SecretRefusals(notices)
        self._bridge_owners: dict[str, tuple[str, str]] = {}  # bridge or source username -> its Secret
        # Bridged sources and bridges (devices.bridge_accounts): their Secrets, and the accepted bridged Devices
        # (`devices`: the Device cache), whose topics a person granted.
        self._bridge_secrets: dict[Key, Source | BridgeCredential] = {}
        self.devices = devices
        self._granted: tuple[Bridged, ...] = ()
        self.on_kicked = on_kicked  # (device id, why): the broker threw it off without its Will
        self.topics = topics
        self.notices = notices
        self.limit = limit_per_namespace
        self._enrollments: dict[Key, tuple[str, Credential]] = {}  # secret -> (creationTimestamp, credential)
        self._dirty = asyncio.Event()
        # Questions to the plugin by correlation id: every controller on a broker hears every answer.
        self._answers: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self._asked: dict[str, list[Command]] = {}  # what each question asked, to know whom an answer kicked
        self._by_device: dict[str, set[Key]] = {}  # device id -> its enrollment Secrets
        self._refused: set[str] = set()
        self.synced = asyncio.Event()  # the broker matched the enrollments at least once
        self._task: asyncio.Task[None] | None = None

    # ---- inputs ---------------------------------------------------------------------------------------------

    def on_secret(self, event_type: str, body: Body) -> None:
        key = key_of(body)
        held = secret_of(body) if event_type != "DELETED" else None
        if held is not None or key in self._bridge_secrets:
            self.secret_refusals.seen(key, body if held is not None else None)
            if held is None:
                self._bridge_secrets.pop(key, None)
            elif self._bridge_secrets.get(key) != held:
                self._bridge_secrets[key] = held
            self._dirty.set()
            return
        credential = credential_of(body) if event_type != "DELETED" else None
        if credential is None:
            old = self._enrollments.pop(key, None)
            if old is not None:
                self._by_device.get(old[1].device_id, set()).discard(key)
                self._dirty.set()
            return
        created = body["metadata"].get("creationTimestamp") or ""
        if self._enrollments.get(key) != (created, credential):
            self._enrollments[key] = (created, credential)
            self._by_device.setdefault(credential.device_id, set()).add(key)
            self._dirty.set()

    def barred(self, device_id: str) -> bool:
        """Whether the enrollment that makes this device id's account (the oldest) is revoked: the broker refuses
        it, so it cannot be online, whatever an old retained status says."""
        enrolled = [(self._enrollments[key], key) for key in self._by_device.get(device_id, ()) if key in self._enrollments]
        return bool(enrolled) and min(enrolled, key=lambda e: (e[0][0], e[1]))[0][1].revoked

    def on_connected(self) -> None:
        for answer in self._answers.values():  # asked on the old connection: never answered now
            if not answer.done():
                answer.set_exception(ConnectionError("the MQTT link was lost"))
        self._answers.clear()
        self._dirty.set()

    def on_response(self, payload: bytes) -> None:
        try:
            responses = list(json.loads(payload).get("responses") or [])
        except (ValueError, AttributeError):
            return
        question = str((responses[0] if responses else {}).get("correlationData") or "").split("/")[0]
        asked = self._asked.pop(question, [])
        for response in responses:
            index = str(response.get("correlationData") or "").partition("/")[2]
            command = asked[int(index)] if index.isdigit() and int(index) < len(asked) else None
            kicked = disconnects(command) if command is not None and not response.get("error") else None
            if kicked is not None:
                self.on_kicked(*kicked)
        answer = self._answers.pop(question, None)
        if answer is not None and not answer.done():
            answer.set_result(responses)

    # ---- the loop -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Keep the broker's accounts equal to the enrollments, beginning with a full sync: a replica that just
        became the leader cannot know what its predecessor left undone."""
        if self._task is not None and not self._task.done():
            return
        self._dirty.set()
        self._task = asyncio.create_task(self._run(), name="corral-broker-accounts")

    async def stop(self) -> None:
        await cancel_all([self._task])
        self._task = None

    def bridged(self) -> tuple[Bridged, ...]:
        """What people granted bridged devices (Device spec.bridge): the oldest claim of each device id wins, as it
        does for driving it."""
        def age(device: Device) -> tuple[str, str, str]:
            created = device.metadata.creation_timestamp
            return (created.isoformat() if created else "~", device.metadata.namespace or "", device.metadata.name or "")

        oldest: dict[str, Bridged] = {}
        for device in sorted(self.devices(), key=age):
            bridge = device.spec.bridge
            if bridge is not None and device.metadata.deletion_timestamp is None:
                oldest.setdefault(device.spec.device_id, Bridged(
                    device.metadata.namespace or "", device.spec.device_id, bridge.source, tuple(bridge.topics.command),
                    tuple(bridge.topics.state), tuple(bridge.topics.availability)))
        return tuple(oldest[device_id] for device_id in sorted(oldest))

    async def _changes(self) -> None:
        """Until something changed: a Secret (at once), or what people granted bridged Devices (checked each
        second: the Device cache tells no one, and a grant or its revocation may wait that long)."""
        while not self._dirty.is_set():
            if self._bridge_secrets and self.bridged() != self._granted:
                self._dirty.set()
                break
            try:
                await asyncio.wait_for(self._dirty.wait(), GRANTS_CHECK_S)
            except TimeoutError:
                continue

    async def _run(self) -> None:
        while True:
            await self._changes()
            await self.link.connected.wait()
            self._dirty.clear()
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the broker was away or refused: try again soon
                log.warning("could not bring the broker's device accounts in line with the enrollments: %s", err)
                await asyncio.sleep(2.0)
                self._dirty.set()

    async def sync(self) -> None:
        listings = await self._ask([{"command": "listClients", "verbose": True}, {"command": "listRoles", "verbose": True}])
        clients = _data(listings, "listClients").get("clients") or []
        roles = _data(listings, "listRoles").get("roles") or []
        self._granted = self.bridged()
        plan = account_plan(self.topics, self.wanted(), clients, roles)
        commands = plan.commands
        for username, why in plan.refused:
            self._refuse_client(username, why)
        for start in range(0, len(commands), BATCH):
            batch = commands[start:start + BATCH]
            for command, answer in zip(batch, await self._ask(batch), strict=False):
                if answer.get("error"):
                    log.warning("broker refused %s for %s: %s", command["command"],
                                command.get("username") or command.get("rolename"), answer["error"])
                elif command["command"] in ENROLLMENT_FACTS:
                    self.notices.fact(ENROLLMENT_FACTS[command["command"]], command["username"],
                                      {"brokerCommand": command["command"]})
        if commands or not self.synced.is_set():
            log.info("broker accounts: %d change(s) for %d enrolled device(s)", len(commands), len(self.wanted()))
        self.synced.set()

    def wanted(self) -> dict[str, Account]:
        """The accounts the enrollments ask for: the oldest enrollments of each namespace, up to the limit."""
        by_namespace: dict[str, list[tuple[str, Credential]]] = {}
        for created, credential in self._enrollments.values():
            by_namespace.setdefault(credential.namespace, []).append((created, credential))
        wanted: dict[str, Account] = {}
        for namespace, enrolled in by_namespace.items():
            for index, (_, credential) in enumerate(sorted(enrolled, key=lambda e: (e[0], e[1].device_id))):
                if index >= self.limit:
                    self._refuse(credential, namespace)
                    continue
                # One device id is one broker identity: the oldest enrollment of it wins.
                wanted.setdefault(credential.device_id, Account(credential.device_id, credential.password,
                                                               enabled=not credential.revoked))
        return self.with_bridges(wanted)

    def with_bridges(self, wanted: dict[str, Account]) -> dict[str, Account]:
        """The device accounts and those of bridged sources and bridges (a device's username wins a clash)."""
        held: list[Source | BridgeCredential] = []
        refused: list[Refused] = []
        for key, secret in self._bridge_secrets.items():
            why = self._not_read(key, secret)
            if why is None:
                held.append(secret)
            else:
                refused.append(Refused(why, key))
        plan = plan_bridge_accounts(self.topics, [h for h in held if isinstance(h, Source)],
                                    [h for h in held if isinstance(h, BridgeCredential)], self._granted,
                                    Reserved.around(self.controller_username, frozenset(wanted)))
        refused += plan.refused
        self._bridge_owners = plan.secrets
        for username, account in plan.accounts.items():
            if username in wanted:
                refused.append(Refused(f"bridge account {username}: a device enrolled with that id has it",
                                       plan.secrets.get(username)))
                continue
            wanted[username] = account
        for refusal in refused:
            self.secret_refusals.tell(refusal.why, refusal.secret)
        return wanted

    def _not_read(self, key: Key, secret: Source | BridgeCredential) -> str | None:
        """Why this Secret is not read at all (None: it is). Only the namespaces the operator named hold bridge and
        source credentials; a bridge Secret speaks for the Devices of its own namespace, and for another only from
        the controller's own namespace (the chart's), else anyone who may make Secrets in one namespace could
        claim another's devices."""
        what = "bridge credential" if isinstance(secret, BridgeCredential) else "bridged source"
        if key[0] not in self.bridge_namespaces:
            allowed = ", ".join(self.bridge_namespaces) or "none: no --bridge-namespace was given"
            return (f"this {what} is in namespace {key[0]}, where the controller reads no bridge or source "
                    f"credentials (it reads them only from: {allowed}; corral run --bridge-namespace, the chart's "
                    "controller.bridgeNamespaces); nothing is made of it")
        if isinstance(secret, BridgeCredential) and secret.secret_namespace and \
                secret.secret_namespace != self.home_namespace:
            return (f"this bridge credential names namespace {secret.namespace} (label corral.dev/bridge-namespace), "
                    "which only a Secret in the controller's own namespace may; nothing is made of it")
        return None

    def _refuse_client(self, username: str, why: str) -> None:
        """A wanted account the broker already has as a client Corral did not make: said on its Secret or Device."""
        secret = self._bridge_owners.get(username)
        if secret is not None or username not in self._by_device:
            self.secret_refusals.tell(f"broker account {username}: {why}", secret)
            return
        if username not in self._refused:
            self._refused.add(username)
            self.notices.post_for(username, "EnrollmentRefused", "Refuse",
                                  f"Device {username} gets no broker account: {why}.", "Warning")
            log.warning("enrollment of %s refused: %s", username, why)

    def _refuse(self, credential: Credential, namespace: str) -> None:
        if credential.device_id in self._refused:
            return
        self._refused.add(credential.device_id)
        self.notices.post_for(credential.device_id, "EnrollmentRefused", "Refuse",
                              f"Namespace {namespace} has reached its limit of {self.limit} enrolled devices: "
                              f"device {credential.device_id} gets no broker account.", "Warning")
        log.warning("enrollment of %s refused: namespace %s is at its limit of %d devices", credential.device_id,
                    namespace, self.limit)

    async def _ask(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        question = uuid.uuid4().hex
        answer: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._answers[question] = answer
        self._asked[question] = commands
        tagged = [{**command, "correlationData": f"{question}/{i}"} for i, command in enumerate(commands)]
        self.link.publish(CONTROL_TOPIC, {"commands": tagged})
        try:
            return await asyncio.wait_for(answer, ANSWER_S)
        finally:
            self._answers.pop(question, None)
            self._asked.pop(question, None)


def _data(responses: list[dict[str, Any]], command: str) -> dict[str, Any]:
    for response in responses:
        if response.get("command") == command:
            if response.get("error"):
                raise RuntimeError(f"{command}: {response['error']}")
            return dict(response.get("data") or {})
    raise RuntimeError(f"no answer to {command}")

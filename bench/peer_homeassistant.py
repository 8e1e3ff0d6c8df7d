"""A peer side by side: Home Assistant, what a home user would pick instead, timed in the same run as Corral.

Home Assistant runs from a virtualenv of its own (it needs a newer Python than Corral's; `--python`, default
the newest 3.13 that pyenv has) with its MQTT integration on the local plane's Mosquitto, set up as a person
would through its onboarding and config-flow REST API. One MQTT light is played by a tiny responder that
echoes every command to the state topic, as a real light does. The broker admits no anonymous client: Home
Assistant and the responder each get an account of their own (`peer_accounts`, limited to the light's and Home
Assistant's own topics), its password in a 0600 file; Home Assistant gets it the way a person gives it, in the
config flow's form (its REST API, never a process argument). Timed: the REST service call `light.turn_on` /
`light.turn_off` until the state change is visible (a `state_changed` event on HA's websocket API). In the
same run and on the same broker: Corral's `iot.control` on a simulated light until EXECUTED.

Opt-in, never in the test run: the first run installs Home Assistant (minutes).

    .venv/bin/python bench/peer_homeassistant.py [--calls 100] [--ha-version 2025.4.4] [--python PATH]

Prints p50/p99 of both; writes bench/results/peer_homeassistant-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt

from common import agent_namespace, bench_plane, percentile, running_corral, say, write_result
from control_latency import control_calls
from corral.devcluster.processes import free_port
from corral.privatefile import read_secret, write_private

CACHE = Path.home() / ".cache" / "corral" / "peer-homeassistant"
CONFIGURATION = """
homeassistant:
  name: Corral peer benchmark
  unit_system: metric
  time_zone: UTC
http:
  server_host: 127.0.0.1
  server_port: {port}
api:
websocket_api:
mqtt:
  light:
    - name: Bench light
      unique_id: corral_bench_light
      command_topic: peer/bench-light/set
      state_topic: peer/bench-light/state
      payload_on: "ON"
      payload_off: "OFF"
      optimistic: false
"""


# The accounts of the peer's side, and the topics each may use: Home Assistant its birth/status topics and the
# light's, the responder only the light's.
HA_ACCOUNT, LIGHT_ACCOUNT = "peer-homeassistant", "peer-light"
PEER_TOPICS = {HA_ACCOUNT: ("peer/bench-light/#", "homeassistant/#"), LIGHT_ACCOUNT: ("peer/bench-light/#",)}


def peer_accounts(plane: Any, directory: Path) -> dict[str, Path]:
    """Broker accounts for Home Assistant and the responder (username -> its password file, 0600), made with the
    plane's broker admin over the dynamic security plugin. Made again on every run: a new password each time."""
    from tests.broker_harness import dynsec

    files: dict[str, Path] = {}
    commands: list[dict[str, Any]] = []
    for username, topics in PEER_TOPICS.items():
        password = secrets.token_urlsafe(24)
        files[username] = directory / f"{username}.password"
        write_private(files[username], password + "\n")
        acls = [{"acltype": acltype, "topic": topic, "allow": True} for topic in topics
                for acltype in ("publishClientSend", "publishClientReceive", "subscribePattern", "unsubscribePattern")]
        commands += [{"command": "deleteClient", "username": username}, {"command": "deleteRole", "rolename": username},
                     {"command": "createRole", "rolename": username, "acls": acls},
                     {"command": "createClient", "username": username, "password": password,
                      "roles": [{"rolename": username}]}]
    answers = dynsec(plane, commands, check=False)
    failed = [(c["command"], a.get("error")) for c, a in zip(commands, answers, strict=False)
              if a.get("error") and not c["command"].startswith("delete")]
    if failed:
        raise SystemExit(f"the broker refused the peer's accounts: {failed}")
    return files


def mqtt_flow_input(port: int, username: str, password: str) -> dict[str, Any]:
    """What a person types into Home Assistant's MQTT broker form."""
    return {"broker": "127.0.0.1", "port": port, "username": username, "password": password}


def fitting(form: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` if the form Home Assistant showed asks for each of its keys and reports no error (a form shown
    again says why: cannot_connect, bad_login); otherwise a clear error. Its forms
    refuse any key they do not list (voluptuous: "extra keys not allowed @ data['broker']"), which says
    neither which step was shown nor what it wanted."""
    fields = {str(f.get("name")): f for f in form.get("data_schema") or []}
    extra = sorted(set(answer) - set(fields))
    missing = sorted(name for name, f in fields.items()  # HA lists "default": null for a field with none
                     if f.get("required") and name not in answer and f.get("default") is None)
    if form.get("type") != "form" or extra or missing or form.get("errors"):
        raise SystemExit(f"Home Assistant's MQTT config flow showed step {form.get('step_id')!r} "
                         f"({form.get('type')}) asking for {sorted(fields)}; the benchmark would send {sorted(answer)}"
                         + (f" (not asked: {extra})" if extra else "") + (f" (missing: {missing})" if missing else "")
                         + (f"; errors {form.get('errors')}" if form.get("errors") else ""))
    return answer


def newest_python313() -> str:
    versions = sorted(Path.home().glob(".pyenv/versions/3.13*"), key=lambda p: [int(x) for x in p.name.split(".")])
    if not versions:
        raise SystemExit("no Python 3.13 under ~/.pyenv/versions; pass --python (Home Assistant needs >= 3.13)")
    return str(versions[-1] / "bin" / "python")


def installed_hass(python: str, version: str) -> Path:
    venv = CACHE / f"venv-{version}"
    hass = venv / "bin" / "hass"
    if hass.exists():
        return hass
    say(f"installing Home Assistant {version} into {venv} (once; several minutes)")
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"homeassistant=={version}"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"Home Assistant {version} did not install with {python}:\n{result.stderr[-3000:]}")
    return hass


@contextlib.contextmanager
def light_responder(port: int, password_file: Path) -> Iterator[mqtt.Client]:
    """The played light: every command comes back on the state topic, retained, as the device would report.
    It connects with its own account (LIGHT_ACCOUNT; the broker uses the username as the client id)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=LIGHT_ACCOUNT)
    client.username_pw_set(LIGHT_ACCOUNT, read_secret(password_file, "broker password"))
    answered = threading.Event()
    reasons: list[Any] = []

    def on_connect(_c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        reasons.append(reason)
        answered.set()

    def echo(c: mqtt.Client, _u: Any, m: mqtt.MQTTMessage) -> None:
        c.publish("peer/bench-light/state", m.payload, qos=1, retain=True)

    client.on_connect, client.on_message = on_connect, echo
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        if not answered.wait(10) or reasons[0].is_failure:
            raise SystemExit(f"the broker did not let the light's account {LIGHT_ACCOUNT} in: "
                             f"{reasons[0] if reasons else 'no answer within 10 s'}")
        client.subscribe("peer/bench-light/set", qos=1)
        client.publish("peer/bench-light/state", "OFF", qos=1, retain=True).wait_for_publish(10)
        yield client
    finally:
        client.loop_stop()
        client.disconnect()


@contextlib.contextmanager
def running_hass(hass: Path, config_dir: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "configuration.yaml").write_text(CONFIGURATION.format(port=port))
    log = open(config_dir / "hass.log", "ab")  # noqa: SIM115 - Home Assistant writes it until it stops
    proc = subprocess.Popen([str(hass), "-c", str(config_dir)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def _until(what: str, probe: Any, timeout_s: float, proc: subprocess.Popen[bytes], log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"Home Assistant exited with {proc.returncode} while waiting for {what}; "
                             f"its log ends:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            found = await probe()
            if found:
                return found
        if time.monotonic() > deadline:
            raise SystemExit(f"Home Assistant: no {what} within {timeout_s:.0f} s; log: {log}")
        await asyncio.sleep(0.5)


async def onboard_and_set_up_mqtt(base: str, mqtt_port: int, password_file: Path, proc: subprocess.Popen[bytes],
                                  log: Path) -> tuple[str, list[Any]]:
    """A person's first minutes with Home Assistant, over its REST API: an owner, a token, the MQTT broker with
    Home Assistant's own account."""
    client_id = f"{base}/"
    async with aiohttp.ClientSession() as http:
        async def onboarding() -> Any:
            async with http.get(f"{base}/api/onboarding") as response:
                return await response.json() if response.status == 200 else None

        await _until("onboarding API", onboarding, 600, proc, log)
        password = secrets.token_urlsafe(16)
        async with http.post(f"{base}/api/onboarding/users", json={
                "client_id": client_id, "name": "Bench", "username": "bench", "password": password,
                "language": "en"}) as response:
            code = (await response.json())["auth_code"]
        async with http.post(f"{base}/auth/token", data={
                "grant_type": "authorization_code", "code": code, "client_id": client_id}) as response:
            token = str((await response.json())["access_token"])
        headers = {"Authorization": f"Bearer {token}"}
        async with http.post(f"{base}/api/config/config_entries/flow", headers=headers,
                             json={"handler": "mqtt", "show_advanced_options": False}) as response:
            flow = await response.json()
        form = list(flow.get("data_schema") or [])  # as shown, before anything is typed in: no secret
        answer = mqtt_flow_input(mqtt_port, HA_ACCOUNT, read_secret(password_file, "broker password"))
        async with http.post(f"{base}/api/config/config_entries/flow/{flow['flow_id']}", headers=headers,
                             json=fitting(flow, answer)) as response:
            flow = await response.json()
        if flow.get("type") == "form":  # shown again: the broker refused (errors say why) or the form changed
            fitting(flow, answer)
        if flow.get("type") != "create_entry":
            raise SystemExit(f"Home Assistant's MQTT config flow did not create an entry: {flow}")

        async def light_known() -> Any:
            async with http.get(f"{base}/api/states/light.bench_light", headers=headers) as response:
                return response.status == 200 and (await response.json()).get("state") in ("on", "off")

        await _until("the MQTT light", light_known, 120, proc, log)
        return token, form


async def ha_calls(base: str, token: str, calls: int) -> list[float]:
    """REST light.turn_on/turn_off, each timed until its state_changed arrives on the websocket API."""
    headers = {"Authorization": f"Bearer {token}"}
    times = []
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{base.replace('http', 'ws')}/api/websocket") as ws:
        await ws.receive_json()  # auth_required
        await ws.send_json({"type": "auth", "access_token": token})
        assert (await ws.receive_json())["type"] == "auth_ok"
        await ws.send_json({"id": 1, "type": "subscribe_events", "event_type": "state_changed"})
        await ws.receive_json()
        async with http.get(f"{base}/api/states/light.bench_light", headers=headers) as response:
            state = (await response.json())["state"]
        for _ in range(calls):
            wanted = "off" if state == "on" else "on"
            started = time.perf_counter()
            async with http.post(f"{base}/api/services/light/turn_{wanted}", headers=headers,
                                 json={"entity_id": "light.bench_light"}) as response:
                assert response.status == 200, await response.text()
            while True:
                event = (await ws.receive_json(timeout=10)).get("event") or {}
                data = event.get("data") or {}
                if data.get("entity_id") == "light.bench_light" and (data.get("new_state") or {}).get("state") == wanted:
                    break
            times.append((time.perf_counter() - started) * 1000)
            state = wanted
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--ha-version", default="2025.4.4",
                        help="the newest release pyenv's Python 3.13.0 installs (later ones need 3.13.2 or newer)")
    parser.add_argument("--python", help="a Python for Home Assistant (default: the newest pyenv 3.13)")
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    args = parser.parse_args()
    hass = installed_hass(args.python or newest_python313(), args.ha_version)
    with bench_plane(args.fresh_plane) as plane, agent_namespace(plane) as (admin, namespace, token), \
            tempfile.TemporaryDirectory() as work:
        ha_port = free_port()
        base = f"http://127.0.0.1:{ha_port}"
        accounts = peer_accounts(plane, Path(work) / "accounts")
        with light_responder(plane.mqtt_port, accounts[LIGHT_ACCOUNT]), \
                running_hass(hass, Path(work) / "ha", ha_port) as proc:
            say("  starting Home Assistant and setting up its MQTT integration")
            ha_token, form = asyncio.run(onboard_and_set_up_mqtt(base, plane.mqtt_port, accounts[HA_ACCOUNT], proc,
                                                           Path(work) / "ha" / "hass.log"))
            say(f"  {args.calls} Home Assistant light.turn_on/off calls")
            ha = asyncio.run(ha_calls(base, ha_token, args.calls))
        with running_corral(plane, admin, namespace, {"bench-light": "light"}) as (url, _):
            say(f"  {args.calls} Corral iot.control calls")
            corral, codes = asyncio.run(control_calls(url, token, args.calls))
    result = {
        "calls": args.calls, "home_assistant": args.ha_version,
        "ha_p50_ms": round(statistics.median(ha), 1), "ha_p99_ms": round(percentile(ha, 0.99), 1),
        "corral_p50_ms": round(statistics.median(corral), 1), "corral_p99_ms": round(percentile(corral, 0.99), 1),
        "corral_executed": codes.count("EXECUTED"),
        "ha_broker_form": form,  # what tests/integration/test_peer_benchmark.py checks the benchmark's answer against
    }
    print(f"Home Assistant {args.ha_version} light.turn_on/off (REST) -> state visible: p50 {result['ha_p50_ms']} ms, "
          f"p99 {result['ha_p99_ms']} ms")
    print(f"Corral iot.control -> EXECUTED ({result['corral_executed']}/{args.calls}): p50 {result['corral_p50_ms']} ms, "
          f"p99 {result['corral_p99_ms']} ms")
    write_result("peer_homeassistant", result)


if __name__ == "__main__":
    main()

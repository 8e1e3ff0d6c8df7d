"""`corral sim`: run simulated devices — the real firmware on simulated boards — against an MQTT broker."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
from collections import Counter
from pathlib import Path
from types import FrameType

import click

from corral.cli.mqttopts import password_file_option, refuse_password_in_url
from corral.client.signing import SigningError, firmware_contracts
from corral.devices.credentials import CredentialsError, read_credentials
from corral.privatefile import SecretFileError, read_secret
from corral_sim.catalog import CatalogError, contract_for, device_types, normalize_type
from corral_sim.fleet import Broker, DeviceSpec, Faults, Fleet, FleetError, FleetOptions, device_specs
from corral_sim.presets import PRESETS, preset

MQTT_URL_ENV = "CORRAL_MQTT_URL"


def _device_counts(devices: tuple[str, ...], count: int) -> dict[str, int]:
    """`--device TYPE` (count from --count) or `--device TYPE:N`, repeatable; the same type adds up."""
    counts: dict[str, int] = {}
    for entry in devices:
        name, _, n = entry.partition(":")
        try:
            how_many = int(n) if n else count
        except ValueError:
            raise click.UsageError(f"--device {entry!r}: the count after ':' must be a whole number") from None
        if how_many < 1:
            raise click.UsageError(f"--device {entry!r}: the count must be at least 1")
        try:
            device_type = normalize_type(name)
        except CatalogError as err:
            raise click.UsageError(str(err)) from None
        counts[device_type] = counts.get(device_type, 0) + how_many
    return counts


def _check_reachable(broker: Broker) -> None:
    try:
        with socket.create_connection((broker.host, broker.port), timeout=3):
            pass
    except OSError as err:
        raise click.ClickException(
            f"cannot reach the MQTT broker at {broker.url}: {err.strerror or err}. "
            f"Is it running? (`corral dev up` starts one; `source .corral/dev/env` sets {MQTT_URL_ENV})"
        ) from None


def _shared_password(path: str) -> str:
    try:
        return read_secret(path, "MQTT password")
    except SecretFileError as err:
        raise click.BadParameter(str(err), param_hint="--mqtt-password-file") from None


def _list_devices() -> None:
    for device_type in device_types():
        contract = contract_for(device_type)
        actions = ", ".join(f"{a['id']} ({a['action']}, {a['risk']})" for a in contract["actuators"]) or "-"
        click.echo(f"{device_type:<13} {contract['name']}: {actions}")


@click.command()
@click.option("--preset", "preset_name", type=click.Choice(sorted(PRESETS)), help="A ready-made fleet: home = a household of 43 devices in 8 rooms.")
@click.option("--device", "devices", multiple=True, metavar="TYPE[:N]", help="Simulate devices of TYPE (repeatable); N devices, or --count.")
@click.option("--count", default=1, show_default=True, type=click.IntRange(min=1), help="Devices per --device TYPE given without :N.")
@click.option("--mqtt", "mqtt_url", envvar=MQTT_URL_ENV, metavar="URL",
              help=f"Broker, mqtt://host:port or mqtts://host:8883 [env {MQTT_URL_ENV}]; an account in the URL is "
                   "ignored unless --shared-account.")
@click.option("--credentials", "credentials_file", envvar="CORRAL_SIM_CREDENTIALS", metavar="FILE",
              type=click.Path(dir_okay=False),
              help="Each device's own account, as `corral devices enroll --write FILE` wrote it "
                   "[env CORRAL_SIM_CREDENTIALS]. Without it devices connect anonymously.")
@click.option("--mqtt-ca", envvar="CORRAL_MQTT_CA", metavar="FILE", type=click.Path(dir_okay=False, exists=True),
              help="mqtts://: the CA that signed the broker's certificate [env CORRAL_MQTT_CA].")
@click.option("--shared-account", is_flag=True,
              help="Every device connects with the account named in the --mqtt URL, its password from "
                   "--mqtt-password-file (brokers that neither authenticate devices one by one nor use usernames as "
                   "client ids).")
@password_file_option
@click.option("--prefix", default="iot", show_default=True, help="Topic prefix: devices use PREFIX/ID/info, .../cmd, ...")
@click.option("--telemetry-interval", default=5.0, show_default=True, type=click.FloatRange(min=0.05), metavar="SECONDS", help="Each device publishes telemetry this often. The catalog's contracts declare 5 s "
              "(interval_s), from which the controller allows a cited reading 12.5 s: slower than that, a citation can "
              "be stale before the next sample comes.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of sensor noise, input changes and fault timing: same seed, same readings and faults.")
@click.option("--drop-link-every", type=click.FloatRange(min=0.1), metavar="SECONDS", help="Fault: each device's link dies (no DISCONNECT, so the Will fires) about this often.")
@click.option("--link-down", default=3.0, show_default=True, type=click.FloatRange(min=0), metavar="SECONDS", help="How long a dropped link stays down.")
@click.option("--ack-delay", default=0, show_default=True, type=click.IntRange(min=0), metavar="MS", help="Fault: every ack leaves this long after its command ran.")
@click.option("--power-cycle-every", type=click.FloatRange(min=0.1), metavar="SECONDS", help="Fault: each device loses power about this often (state lost, counters kept).")
@click.option("--power-off", default=5.0, show_default=True, type=click.FloatRange(min=0), metavar="SECONDS", help="How long a power-cycled device stays off.")
@click.option("--duration", type=click.FloatRange(min=0), metavar="SECONDS", help="Stop after this long (default: run until Ctrl-C or SIGTERM).")
@click.option("--signed-contracts", "signed_build", metavar="FILE", type=click.Path(dir_okay=False, exists=True),
              help="The firmware's contracts signed (`corral contracts sign --out FILE`): each device announces "
                   "its type's signed contract, as a controller with --require-signatures wants.")
@click.option("--list", "list_types", is_flag=True, help="List the device types of the catalog and exit.")
def sim(
    preset_name: str | None, devices: tuple[str, ...], count: int, mqtt_url: str | None, prefix: str,
    telemetry_interval: float, seed: int, drop_link_every: float | None, link_down: float, ack_delay: int,
    power_cycle_every: float | None, power_off: float, duration: float | None, list_types: bool,
    credentials_file: str | None, mqtt_ca: str | None, shared_account: bool, mqtt_password_file: str | None,
    signed_build: str | None,
) -> None:
    """Run simulated devices: each its own firmware instance with its own MQTT connection.

    \b
    corral devices enroll relay-1 relay-2 --type relay --write creds.json
    corral sim --device relay:2 --credentials creds.json
    corral sim --preset home --credentials home.json --mqtt mqtts://broker:8883 --mqtt-ca ca.crt
    corral sim --device relay:5 --device lock:2 --drop-link-every 60

    On Ctrl-C or SIGTERM every device publishes a retained `offline` status and
    disconnects cleanly (the Last Will covers only unclean losses).
    """
    if list_types:
        _list_devices()
        return
    specs: list[DeviceSpec] = preset(preset_name) if preset_name else []
    specs += device_specs(_device_counts(devices, count), start=1)
    if not specs:
        raise click.UsageError(f"nothing to simulate: pass --preset home or --device TYPE (types: {', '.join(device_types())})")
    if not mqtt_url:
        raise click.UsageError(f"no broker: pass --mqtt URL or set {MQTT_URL_ENV} (`source .corral/dev/env` after `corral dev up`)")
    refuse_password_in_url(mqtt_url)
    if credentials_file and shared_account:
        raise click.UsageError("--credentials and --shared-account exclude each other: each device has its own "
                               "account, or all share the URL's")
    try:
        credentials = read_credentials(credentials_file) if credentials_file else None
        broker = Broker.from_url(mqtt_url, credentials, mqtt_ca)
        if not shared_account:
            broker = dataclasses.replace(broker, username=None, password=None)
        elif mqtt_password_file:
            broker = dataclasses.replace(broker, password=_shared_password(mqtt_password_file))
        if credentials is not None:
            missing = sorted(spec.device_id for spec in specs if spec.device_id not in credentials)
            if missing:
                raise click.UsageError(f"{credentials_file} has no credential for {', '.join(missing[:5])}"
                                       f"{' and more' if len(missing) > 5 else ''}: enroll them first "
                                       f"(corral devices enroll NAME --type TYPE --write {credentials_file})")
        faults = Faults(drop_link_every, link_down, ack_delay, power_cycle_every, power_off)
        signed = firmware_contracts(Path(signed_build)) if signed_build else {}
        options = FleetOptions(prefix=prefix, telemetry_interval_s=telemetry_interval, seed=seed, faults=faults,
                               firmware_contracts=signed)
        fleet = Fleet(specs, broker, options, log=lambda line: click.echo(f"corral sim: {line}", err=True))
    except (FleetError, CatalogError, CredentialsError, SigningError) as err:
        raise click.ClickException(str(err)) from None
    _check_reachable(broker)

    kinds = Counter(d.spec.device_type for d in fleet.devices.values())
    click.echo(
        f"corral sim: {len(specs)} devices on {broker.url}, topics {prefix}/<id>/..., telemetry every {telemetry_interval:g} s, "
        f"seed {seed} (pid {os.getpid()}; Ctrl-C stops)",
        err=True,
    )
    click.echo("corral sim: " + ", ".join(f"{n} {t}" for t, n in sorted(kinds.items())), err=True)
    accounts = ("each device with its own account" if credentials is not None else
                f"all as {broker.username}" if broker.username else "anonymously")
    click.echo(f"corral sim: devices connect {accounts}", err=True)
    if signed:
        click.echo(f"corral sim: firmware signed ({signed_build}): {', '.join(sorted(signed))}", err=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        fleet.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        fleet.run(duration_s=duration)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    summary = fleet.summary()
    click.echo(
        f"corral sim: stopped; {summary['clean_offline']} of {summary['devices']} devices published retained offline; "
        f"{summary['telemetry_sent']} telemetry messages, {summary['executions']} commands executed, "
        f"{summary['link_drops']} link drops, {summary['power_cycles']} power cycles",
        err=True,
    )
    sys.stdout.flush()

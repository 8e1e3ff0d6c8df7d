"""The umqtt transport's login and TLS choices, on CPython with stand-ins for umqtt.simple and MicroPython's ssl.

Nothing here runs on a board: MicroPython's WebAssembly port has no sockets, so the real handshake with
mbedTLS is untested (firmware/README.md says so). What is checked is what the transport asks of umqtt
and ssl, and what it does with their answers: the device's own account, verification switched on, the
port, a refusal that says what it means and backs off.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest


class FakeMQTTException(Exception):
    pass


class FakeClient:
    made: ClassVar[list[FakeClient]] = []
    connack: int | None = None  # the return code of the next connect, None: accepted

    def __init__(self, client_id: str, server: str, port: int = 0, user: Any = None, password: Any = None,
                 keepalive: int = 0, ssl: Any = None) -> None:  # umqtt.simple 1.4: ssl=None, or an SSLContext
        self.args = {"client_id": client_id, "server": server, "port": port, "user": user, "password": password,
                     "ssl": ssl}
        self.ssl = ssl
        self.sock: Any = None
        self.connects = 0
        FakeClient.made.append(self)

    def set_last_will(self, *args: Any) -> None: ...
    def set_callback(self, callback: Any) -> None: ...

    def connect(self, clean_session: bool = True) -> None:
        self.connects += 1
        if FakeClient.connack is not None:
            raise FakeMQTTException(FakeClient.connack)


class FakeContext:
    def __init__(self, protocol: int) -> None:
        self.verify_mode = FakeSsl.CERT_NONE  # MicroPython's default, unlike CPython's
        self.cadata: Any = None

    def load_verify_locations(self, cadata: Any = None) -> None:
        self.cadata = cadata


class FakeSsl:
    CERT_NONE, CERT_REQUIRED, PROTOCOL_TLS_CLIENT = 0, 2, 16
    SSLContext = FakeContext


class Clock:
    now = 0

    def ms(self) -> int:
        return self.now


class Device:
    device_id = "porch-light"

    def __init__(self) -> None:
        self.clock = Clock()
        self.connected = 0
        self.transport: Any = None

    def will(self) -> tuple[str, bytes]:
        return "iot/porch-light/status", b"offline"

    def on_connect(self) -> None:
        self.connected += 1


@pytest.fixture
def umqtt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    simple = types.ModuleType("umqtt.simple")
    setattr(simple, "MQTTClient", FakeClient)  # noqa: B010 - a module made here has no such attribute to type
    setattr(simple, "MQTTException", FakeMQTTException)  # noqa: B010
    monkeypatch.setitem(sys.modules, "umqtt", types.ModuleType("umqtt"))
    monkeypatch.setitem(sys.modules, "umqtt.simple", simple)
    monkeypatch.setitem(sys.modules, "ssl", FakeSsl)
    monkeypatch.delitem(sys.modules, "corral_fw.transport_umqtt", raising=False)
    FakeClient.made, FakeClient.connack = [], None
    import corral_fw.transport_umqtt as module

    yield module
    sys.modules.pop("corral_fw.transport_umqtt", None)


def test_the_device_logs_in_with_its_own_account_as_its_client_id(umqtt: Any) -> None:
    transport = umqtt.UmqttTransport(Device(), "broker.lan", password="s3cret")
    transport.connect()
    args = FakeClient.made[-1].args
    assert (args["client_id"], args["user"], args["password"], args["port"], args["ssl"]) == \
        ("porch-light", "porch-light", "s3cret", 1883, None)
    assert transport.connected and transport.device.connected == 1


def test_with_a_ca_the_link_is_tls_on_8883_and_checks_the_broker(umqtt: Any) -> None:
    transport = umqtt.UmqttTransport(Device(), "broker.lan", password="s3cret", ca=b"-----BEGIN CERTIFICATE-----")
    context = FakeClient.made[-1].args["ssl"]
    assert FakeClient.made[-1].args["port"] == 8883 and transport.tls
    assert context.verify_mode == FakeSsl.CERT_REQUIRED, "verification is switched on (MicroPython starts with none)"
    assert context.cadata == b"-----BEGIN CERTIFICATE-----"


def test_tls_without_a_ca_is_refused_unless_verification_is_given_up_explicitly(umqtt: Any) -> None:
    with pytest.raises(ValueError, match="needs the broker's CA certificate"):
        umqtt.UmqttTransport(Device(), "broker.lan", password="x", tls=True)
    bench = umqtt.UmqttTransport(Device(), "broker.lan", password="x", verify=False)
    assert FakeClient.made[-1].args["ssl"].verify_mode == FakeSsl.CERT_NONE and bench.tls


def test_a_refused_login_says_why_and_waits_longer_each_time(umqtt: Any) -> None:
    device = Device()
    transport = umqtt.UmqttTransport(device, "broker.lan", password="wrong")
    FakeClient.connack = 5
    with pytest.raises(umqtt.ConnectRefused, match=r"not authorized .*is porch-light enrolled with this password"):
        transport.connect()
    client = FakeClient.made[-1]
    with pytest.raises(umqtt.ConnectRefused, match="next attempt in 5 s"):
        transport.connect()
    assert client.connects == 1, "no new attempt before the pause is over"
    device.clock.now = 5000
    with pytest.raises(umqtt.ConnectRefused):
        transport.connect()
    device.clock.now = 5000 + 9999
    with pytest.raises(umqtt.ConnectRefused, match="next attempt in 1 s"):
        transport.connect()
    assert client.connects == 2, "the second pause is twice as long"
    FakeClient.connack = None
    device.clock.now = 20000
    transport.connect()
    assert transport.connected and transport.refusal is None


def test_a_device_without_a_password_is_told_it_must_be_enrolled(umqtt: Any) -> None:
    transport = umqtt.UmqttTransport(Device(), "broker.lan")
    assert FakeClient.made[-1].args["user"] is None
    FakeClient.connack = 5
    with pytest.raises(umqtt.ConnectRefused, match="sent no password: the broker admits enrolled devices only"):
        transport.connect()


def test_an_umqtt_too_old_to_check_certificates_is_refused(umqtt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    class Old(FakeClient):
        def __init__(self, *args: Any, ssl: Any = False, ssl_params: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, ssl=ssl, **kwargs)  # before 1.4: ssl=True meant wrap_socket(), unchecked

    monkeypatch.setattr(umqtt, "MQTTClient", Old)
    with pytest.raises(NotImplementedError, match=r"older than 1\.4 and would not check"):
        umqtt.UmqttTransport(Device(), "broker.lan", password="x", ca=b"ca")

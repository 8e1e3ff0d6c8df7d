"""MQTT on MicroPython boards, with umqtt.simple (micropython-lib): the board side of the transport.

The broker admits enrolled devices only. A device logs in with its own account: the username is its
device id and the password is the one `corral devices enroll` printed; its client id is its username too
(the broker insists). Outside a single machine the link is TLS (mqtts://, port 8883), and the transport
checks the broker's certificate against the CA it is given (PEM or DER bytes, e.g. read from flash):

    transport = UmqttTransport(device, "broker.example.net", password=PASSWORD,
                               ca=open("broker-ca.crt", "rb").read())   # TLS on 8883, verified
    transport.connect()          # TLS, CONNECT as the device, Last Will, clean session, then device.on_connect()
    transport.poll()             # in the main loop: incoming commands, keep-alive pings

Without `ca` the link is plain MQTT on 1883 (a broker on the same machine or a test bench). TLS needs a
port with mbedTLS (esp32, rp2 on the Pico W, ...) and MicroPython 1.23 or later (its `ssl.SSLContext`),
with umqtt.simple 1.4 or later: older ones ignore an SSLContext, so the transport refuses them. mbedTLS
checks the certificate's dates against the board's clock: set it (ntptime.settime()) before connecting.

`connect` raises OSError when it fails, so the main loop (corral_fw.board.run) waits and tries again; a
broker's refusal (CONNACK with a return code, e.g. 5 "not authorized" for a wrong or revoked password)
or a certificate that does not verify raises `ConnectRefused`, an OSError that says what it means, and
connects again only after a growing pause (5 s, doubling, at most 5 minutes) so that a refused device
does not hammer the broker. `publish` returns False instead of raising when the link is gone, so the
firmware keeps its samples for later.
"""

from umqtt.simple import MQTTClient, MQTTException

PORT = 1883
TLS_PORT = 8883
REFUSED_PAUSE_MS = 5000
REFUSED_PAUSE_MAX_MS = 300000

# The CONNACK return codes of MQTT 3.1.1 (umqtt speaks nothing newer).
REFUSALS = {
    1: "unacceptable protocol version (the broker does not accept MQTT 3.1.1)",
    2: "identifier rejected (the client id must be the device id, which is also the username)",
    3: "server unavailable (the broker is up but not taking clients: try again later)",
    4: "bad user name or password",
    5: "not authorized",
}


class ConnectRefused(OSError):
    """The broker said no: `rc` is the CONNACK return code, or None when its TLS certificate did not verify."""

    def __init__(self, message, rc=None):
        super().__init__(message)
        self.rc = rc


def refusal_message(rc, device_id, password_sent=True) -> str:
    """What a CONNACK return code means for this device, in a sentence a person can act on."""
    reason = REFUSALS.get(rc, "return code " + str(rc))
    if rc in (4, 5):
        if password_sent:
            reason += " (is " + device_id + " enrolled with this password, and not revoked? `corral devices enroll`)"
        else:
            reason += " (" + device_id + " sent no password: the broker admits enrolled devices only, `corral devices enroll`)"
    return "the broker refused the connection: " + reason


def tls_context(ca=None, verify=True):
    """An ssl.SSLContext for a client that checks the broker's certificate against `ca` (PEM or DER bytes).

    MicroPython's `ssl.SSLContext` (micropython-lib's ssl over the `tls` module) starts with CERT_NONE,
    unlike CPython's, so verification is switched on here, and read back: axTLS ports (esp8266) accept the
    setting but cannot verify anything, and get an error instead of an unchecked link.
    """
    import ssl

    if not hasattr(ssl, "SSLContext"):
        raise NotImplementedError("this MicroPython has no ssl.SSLContext: TLS needs MicroPython 1.23 or later")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not verify:
        context.verify_mode = ssl.CERT_NONE
        return context
    if ca is None:
        raise ValueError("TLS with verification needs the broker's CA certificate (ca=PEM or DER bytes)")
    required = getattr(ssl, "CERT_REQUIRED", None)
    if required is not None:
        context.verify_mode = required
    if required is None or context.verify_mode != required:
        raise NotImplementedError("this port's TLS cannot verify certificates (axTLS, e.g. esp8266): "
                                  "use a port with mbedTLS (esp32, rp2), or verify=False to accept any broker")
    context.load_verify_locations(cadata=ca)
    return context


class _Verifying:
    """The context, with the certificate checked for `hostname` rather than the address umqtt connects to
    (umqtt.simple always passes its `server` as server_hostname)."""

    def __init__(self, context, hostname):
        self.context = context
        self.hostname = hostname

    def wrap_socket(self, sock, server_hostname=None):
        return self.context.wrap_socket(sock, server_hostname=self.hostname)


class UmqttTransport:
    """One device's MQTT link.

    device           the Device; its device id is the username and the client id
    server, port     the broker; port 8883 with TLS, 1883 without, unless given
    password         the device's password from `corral devices enroll` (None: no credentials at all)
    ca               the broker's CA certificate (PEM or DER bytes): TLS, verified against it
    tls              None: TLS exactly when a CA is given; True without a CA needs verify=False
    verify           False: TLS that checks nothing (anyone on the path can pose as the broker and take
                     the password); for a bench only
    server_hostname  the name the certificate must carry, if not `server` (e.g. when connecting by address)
    """

    def __init__(self, device, server: str, port: int = 0, password=None, ca=None, tls=None, verify: bool = True,
                 server_hostname=None, keepalive_s: int = 30):
        if tls is None:
            tls = ca is not None or not verify
        if not tls and ca is not None:
            raise ValueError("a CA certificate is for TLS: drop tls=False or the CA")
        self.device = device
        self.keepalive_s = keepalive_s
        self.tls = bool(tls)
        self.server_hostname = (server_hostname or server) if tls else None
        self.password_sent = password is not None
        ssl = None
        if tls:
            _refuse_old_umqtt(server)
            ssl = tls_context(ca, verify)
            if self.server_hostname != server:
                ssl = _Verifying(ssl, self.server_hostname)
        # The broker takes the username as the client id: they are the same, the device id.
        user = device.device_id if password is not None else None
        self.client = MQTTClient(device.device_id, server, port or (TLS_PORT if tls else PORT), user, password,
                                 keepalive_s, ssl=ssl)
        topic, payload = device.will()
        self.client.set_last_will(topic, payload, True, 1)
        self.client.set_callback(self._on_message)
        self.connected = False
        self.refusal = None  # why the broker (or its certificate) said no the last time, if it did
        self.refusals = 0  # refusals in a row
        self._retry_at_ms = 0
        self._last_ping_ms = 0
        device.transport = self

    def connect(self) -> None:
        """CONNECT (after the TLS handshake); raises OSError, or ConnectRefused when the broker said no."""
        now = self.device.clock.ms()
        if self.refusal is not None and now < self._retry_at_ms:
            raise ConnectRefused(self.refusal + "; next attempt in " + str((self._retry_at_ms - now + 999) // 1000)
                                 + " s", self._refused_rc)
        self._drop_socket()  # older umqtt versions leave the last one open, with its TLS buffers
        try:
            self.client.connect(True)
        except MQTTException as err:
            rc = err.args[0] if err.args else None
            self._refused(refusal_message(rc, self.device.device_id, self.password_sent), rc)
        except ValueError as err:
            if not self.tls:
                raise
            # mbedTLS reports a certificate that does not verify as ValueError, with its reasons.
            reasons = "; ".join(line for line in str(err).split("\n") if line)
            self._refused("TLS: the broker's certificate does not verify for " + self.server_hostname + ": " + reasons
                          + " (the broker's CA? the name in its certificate? the board's clock, ntptime.settime()?)",
                          None)
        except (IndexError, AssertionError):
            # umqtt indexes what it read where a CONNACK should be: the broker closed the connection first.
            self._drop_socket()
            raise OSError("the broker closed the connection before its CONNACK (" +
                          ("is this its TLS port?" if self.tls else "TLS only? then pass its CA") + ")") from None
        except OSError:
            self._drop_socket()
            raise
        self.refusal = None
        self.refusals = 0
        self.connected = True
        self._last_ping_ms = self.device.clock.ms()
        self.device.on_connect()

    def _refused(self, message, rc):
        self._drop_socket()
        self.refusal = message
        self._refused_rc = rc
        self.refusals += 1
        pause = REFUSED_PAUSE_MS << min(self.refusals - 1, 10)
        self._retry_at_ms = self.device.clock.ms() + min(pause, REFUSED_PAUSE_MAX_MS)
        raise ConnectRefused(message, rc)

    def _drop_socket(self) -> None:
        sock = self.client.sock
        self.client.sock = None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _on_message(self, topic, payload, retained=False) -> None:
        # umqtt.simple passes no retain flag (some forks do): the heartbeat's payload tells a live beat anyway.
        self.device.on_message(topic.decode(), payload, bool(retained))

    def publish(self, topic: str, payload: str, retain: bool, qos: int) -> bool:
        if not self.connected:
            return False
        try:
            self.client.publish(topic, payload, retain, qos)
            return True
        except OSError:
            self._lost()
            return False

    def subscribe(self, topic: str, qos: int) -> None:
        try:
            self.client.subscribe(topic, qos)
        except MQTTException:  # SUBACK 0x80: the broker's ACL does not let this device read the topic
            self._lost()
            self._refused("the broker refused the subscription to " + topic + " (is the device's account "
                          "allowed its own cmd topic?)", None)

    def poll(self) -> None:
        """Handle what arrived and ping before the broker's keep-alive runs out."""
        if not self.connected:
            return
        try:
            self.client.check_msg()
            now = self.device.clock.ms()
            if now - self._last_ping_ms >= self.keepalive_s * 500:
                self.client.ping()
                self._last_ping_ms = now
        except OSError:
            self._lost()

    def _lost(self) -> None:
        self.connected = False
        self._drop_socket()

    def close(self) -> None:
        """Clean stop: retained offline first (a Will fires only on an unclean loss), then DISCONNECT."""
        if self.connected:
            try:
                self.device.shutdown()
                self.client.disconnect()
            except OSError:
                pass
        self.connected = False


def _refuse_old_umqtt(server):
    """umqtt.simple before 1.4 (frozen into MicroPython 1.22 and older) takes any true `ssl` to mean
    ssl.wrap_socket() with no certificate check: it would ignore the context and trust any broker."""
    if MQTTClient("", server).ssl is False:
        raise NotImplementedError("this umqtt.simple is older than 1.4 and would not check the broker's "
                                  "certificate: install a newer one (mip.install('umqtt.simple')) where no "
                                  "frozen copy shadows it")

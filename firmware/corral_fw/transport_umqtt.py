"""MQTT on MicroPython boards, with umqtt.simple (micropython-lib): the board side of the transport.

    transport = UmqttTransport(device, "192.168.1.10", 1883)
    transport.connect()          # Last Will set, clean session, then device.on_connect()
    transport.poll()             # in the main loop: incoming commands, keep-alive pings

`publish` returns False instead of raising when the link is gone, so the
firmware keeps its samples for later; the main loop (corral_fw.board.run)
reconnects.
"""

from umqtt.simple import MQTTClient


class UmqttTransport:
    def __init__(self, device, server: str, port: int = 1883, client_id=None, keepalive_s: int = 30,
                 user=None, password=None):
        self.device = device
        self.keepalive_s = keepalive_s
        self.client = MQTTClient(client_id or device.device_id, server, port, user, password, keepalive_s)
        topic, payload = device.will()
        self.client.set_last_will(topic, payload, True, 1)
        self.client.set_callback(self._on_message)
        self.connected = False
        self._last_ping_ms = 0
        device.transport = self

    def connect(self) -> None:
        self.client.connect(True)
        self.connected = True
        self._last_ping_ms = self.device.clock.ms()
        self.device.on_connect()

    def _on_message(self, topic, payload) -> None:
        self.device.on_message(topic.decode(), payload)

    def publish(self, topic: str, payload: str, retain: bool, qos: int) -> bool:
        if not self.connected:
            return False
        try:
            self.client.publish(topic, payload, retain, qos)
            return True
        except OSError:
            self.connected = False
            return False

    def subscribe(self, topic: str, qos: int) -> None:
        self.client.subscribe(topic, qos)

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
            self.connected = False

    def close(self) -> None:
        """Clean stop: retained offline first (a Will fires only on an unclean loss), then DISCONNECT."""
        if self.connected:
            try:
                self.device.shutdown()
                self.client.disconnect()
            except OSError:
                pass
        self.connected = False

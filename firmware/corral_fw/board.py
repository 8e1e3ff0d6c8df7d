"""Running the firmware on a MicroPython board: a GPIO board and the main loop.

A board's main.py wires the pieces, e.g. a one-channel relay on GPIO 5 with a
door contact on GPIO 4 (pull-up: the pin reads 1 when the contact is open):

    import network, ntptime
    from corral_fw.board import GpioBoard, run
    from corral_fw.clock import TicksClock
    from corral_fw.contracts.relay import CONTRACT
    from corral_fw.device import Device
    from corral_fw.store import FileStore
    from corral_fw.transport_umqtt import UmqttTransport

    # ... join Wi-Fi, then ntptime.settime() so that `ts` is real time ...
    clock = TicksClock()
    board = GpioBoard(clock, outputs={"relay": 5})
    device = Device(CONTRACT, "garage-relay", board, clock, store=FileStore())
    run(device, UmqttTransport(device, "192.168.1.10"), clock)

Only this module and transport_umqtt need a board: everything else also runs
on CPython and in the simulator.
"""

import time

import machine


class GpioBoard:
    """Bool actuators on output pins; discrete inputs on pins whose edges an interrupt timestamps.

    outputs: {actuator id: pin number}
    inputs:  {event name: (pin number, value when the pin reads 0, value when it reads 1)}
    sensors: {metric: function returning a reading or None}
    """

    def __init__(self, clock, outputs=None, inputs=None, sensors=None):
        self.clock = clock
        self._outputs = {}
        for actuator_id, number in (outputs or {}).items():
            self._outputs[actuator_id] = machine.Pin(number, machine.Pin.OUT, value=0)
        self._inputs = {}
        self._edges = []
        for name, spec in (inputs or {}).items():
            pin = machine.Pin(spec[0], machine.Pin.IN, machine.Pin.PULL_UP)
            self._inputs[name] = (pin, spec[1], spec[2])
            pin.irq(self._irq_handler(name), machine.Pin.IRQ_RISING | machine.Pin.IRQ_FALLING)
        self._sensors = sensors or {}

    def _irq_handler(self, name):
        def handler(pin):
            self._edges.append((name, self._level(name), self.clock.ms()))

        return handler

    def _level(self, name):
        pin, when_low, when_high = self._inputs[name]
        return when_high if pin.value() else when_low

    def read(self, metric):
        reader = self._sensors.get(metric)
        return None if reader is None else reader()

    def apply(self, actuator_id, value, units):
        pin = self._outputs.get(actuator_id)
        if pin is None:
            raise ValueError("no output pin for '" + actuator_id + "'")
        pin.value(1 if value and value != "off" else 0)  # an enum's "off" is off too (a heater's power)

    def input_level(self, name):
        return self._level(name) if name in self._inputs else None

    def input_edges(self, now_ms):
        state = machine.disable_irq()
        edges = self._edges
        self._edges = []
        machine.enable_irq(state)
        return edges

    def next_input_ms(self):
        return None  # edges arrive by interrupt; the main loop polls often enough


def run(device, transport, clock, poll_ms: int = 20, reconnect_ms: int = 5000):
    """Forever: stay connected, handle commands, tick the device."""
    while True:
        if not transport.connected:
            try:
                transport.connect()
            except OSError:
                time.sleep_ms(reconnect_ms)
                continue
        transport.poll()
        wake = device.tick(clock.ms())
        time.sleep_ms(max(0, min(poll_ms, wake - clock.ms())))

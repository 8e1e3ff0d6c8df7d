"""Corral device firmware: the MQTT contract protocol of docs/protocol.md, written for MicroPython.

Every module of this package compiles with mpy-cross, and every module except
the two transports and `board` imports and runs on MicroPython: they use only
`json`, `time` and each other (no typing, dataclasses, enum, abc, threading,
and no `from __future__`). Annotations are fine: MicroPython parses them and
never evaluates them, so they stay to built-in names.

    device      the protocol: info/status on connect, commands -> acks, telemetry, events
    actuators   one deterministic state machine per actuator: parameter checks and clamping
    dedup       the bounded store of recent command ids and their acks
    debounce    edges of a discrete input -> one event per settled change
    ringbuf     bounded buffer of timestamped samples
    rng         a small seeded PRNG, identical on CPython and MicroPython
    clock       clocks: manual (tests) and ticks-based (boards)
    simboard    simulated hardware with deterministic noise (the simulator's "board")
    profiles    per device type: firmware sampling options and simulated behaviour
    contracts/  generated: one frozen module per catalog contract (firmware/devices/*.json)
    board       a board's main loop and a GPIO board (MicroPython only)
    transport_umqtt  MQTT on boards (umqtt.simple)
    transport_paho   MQTT on CPython (paho-mqtt)
"""

FIRMWARE_NAME = "corral-fw"

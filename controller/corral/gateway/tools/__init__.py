"""The gateway's tools, one object per tool: its name, texts and schemas beside what it does when called.

base      - the Tool class, the call's context (Call, Services) and the answers every tool gives
schemas   - schema fragments several tools share (request_id, reason, the outcome of an Intent)
arguments - the checks every Intent-making tool runs on its arguments (ArgumentError)
intents   - making an Intent in the caller's name and following it to its outcome
read      - iot.list_devices, iot.query, iot.read: answered from the caller's view and the readings
status    - iot.intent_status
control   - iot.control and the per-device tools ({device}.{actuator}.{action})
lease     - iot.acquire, iot.release
overlay   - iot.set_alias, iot.set_note, iot.set_location

Which of them a caller sees is `toolset`'s to say.
"""

"""Persistent storage for what must survive a power cycle: counter totals, and on-time limits that acted.

A counter's state is the total executed so far; if it restarted at 0 after a
reboot, repeating "feed to 3" would feed again. So counters are saved after
every execution and loaded at boot. An actuator its on-time limit switched off
stays reported so after a reboot (until set again), or a controller would switch
it on again. Everything else starts from its boot state.
"""

import json


class MemoryStore:
    """Kept by the owner across firmware instances (the simulator's "flash")."""

    def __init__(self):
        self.data = {}

    def load(self) -> dict:
        return json.loads(json.dumps(self.data))

    def save(self, data: dict) -> None:
        self.data = json.loads(json.dumps(data))


class FileStore:
    """A JSON file on the board's flash, replaced atomically (write a temporary file, then rename)."""

    def __init__(self, path: str = "corral_state.json"):
        self.path = path

    def load(self) -> dict:
        try:
            with open(self.path) as f:
                data = json.load(f)
            return data if type(data) is dict else {}
        except Exception:
            return {}

    def save(self, data: dict) -> None:
        import os

        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.rename(tmp, self.path)

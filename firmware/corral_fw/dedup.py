"""Command-id deduplication: the acks of the most recent command ids, bounded, oldest out first.

A command id seen again gets the very bytes of its first ack and executes
nothing. Memory is bounded: after `size` newer ids, the oldest is forgotten
(the controller retries within seconds, not after 64 other commands).
"""

DEFAULT_SIZE = 64


class AckCache:
    def __init__(self, size: int = DEFAULT_SIZE):
        if size < 1:
            raise ValueError("AckCache size must be at least 1")
        self.size = size
        self._acks = {}
        self._order = []

    def get(self, command_id: str):
        """The stored ack (bytes) for command_id, or None."""
        return self._acks.get(command_id)

    def put(self, command_id: str, ack: bytes) -> None:
        if command_id in self._acks:
            return
        self._acks[command_id] = ack
        self._order.append(command_id)
        if len(self._order) > self.size:
            del self._acks[self._order.pop(0)]

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, command_id) -> bool:
        return command_id in self._acks

"""A bounded ring buffer of timestamped samples: when full, the oldest sample is overwritten."""


class RingBuffer:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("RingBuffer capacity must be at least 1")
        self.capacity = capacity
        self._items = [None] * capacity
        self._start = 0
        self._count = 0
        self.dropped = 0

    def push(self, item) -> None:
        end = (self._start + self._count) % self.capacity
        self._items[end] = item
        if self._count < self.capacity:
            self._count += 1
        else:
            self._start = (self._start + 1) % self.capacity
            self.dropped += 1

    def items(self) -> list:
        """Oldest first."""
        return [self._items[(self._start + i) % self.capacity] for i in range(self._count)]

    def clear(self) -> None:
        for i in range(self.capacity):
            self._items[i] = None
        self._start = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

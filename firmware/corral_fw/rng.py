"""A small seeded PRNG (xorshift32) that gives the same numbers on CPython and MicroPython.

The simulator's noise must be deterministic for a seed, on every interpreter,
so it cannot rely on `random` (CPython's Mersenne Twister and MicroPython's
yasmarang differ). Everything is 32-bit integer arithmetic.
"""

import math

MASK32 = 0xFFFFFFFF


def fnv1a(text: str) -> int:
    """32-bit FNV-1a of text's UTF-8 bytes: a stable hash to derive per-device seeds."""
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & MASK32
    return h


class Rng:
    def __init__(self, seed: int):
        self.state = (seed & MASK32) or 0x9E3779B9  # xorshift must not start at 0

    @classmethod
    def for_device(cls, seed: int, device_id: str, stream: str = ""):
        return cls(fnv1a(str(seed) + "/" + device_id + "/" + stream))

    def next_u32(self) -> int:
        x = self.state
        x ^= (x << 13) & MASK32
        x ^= x >> 17
        x ^= (x << 5) & MASK32
        self.state = x
        return x

    def random(self) -> float:
        """Uniform in [0, 1)."""
        return self.next_u32() / 4294967296.0

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high]."""
        return low + self.next_u32() % (high - low + 1)

    def exponential_ms(self, mean_ms: float) -> int:
        """A waiting time with the given mean (memoryless arrivals), at least 1 ms."""
        return max(1, int(-mean_ms * math.log(1.0 - self.random())))

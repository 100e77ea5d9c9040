"""A seeded random order of ``n`` samples, computed one position at a time.

Why not ``rng.permutation(n)`` at every epoch start (the order hpctrain used first): at a
trillion tokens that is 2.4·10^8 samples, about 2 GB and 14 s per reading rank per attempt,
rebuilt at every epoch and every restart. Here the order is a *bijection* of ``[0, n)``:
a balanced Feistel network on the smallest even number of bits ``2h`` with ``4^h ≥ n``,
whose round function is splitmix64 of (half, round key), and cycle walking (apply the
network again while the value is ``≥ n``) to stay inside ``[0, n)``; a permutation of
``[0, 4^h)`` restricted this way is a permutation of ``[0, n)``. ``4^h < 4n``, so a
position costs four network passes at most on average: a few microseconds, constant memory,
nothing built at start. The round keys come from ``(seed, epoch, *stream)`` through numpy's
``SeedSequence``, so every epoch, corpus and split has its own order, identical on every rank.

``PermutationOrder`` is the former order, kept so checkpoints written before this one
resume on exactly the samples they would have read (the checkpoint records which one).
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
MASK64 = (1 << 64) - 1
FEISTEL = "feistel-v1"
PERMUTATION = "permutation"
KINDS = (FEISTEL, PERMUTATION)


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class FeistelOrder:
    """Position within an epoch -> sample index, a bijection of ``[0, n)`` per ``key``."""

    kind = FEISTEL

    def __init__(self, n: int, seed: int, stream: tuple = ()) -> None:
        if n < 1:
            raise ValueError("an order needs at least one sample")
        self.n = n
        self.half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        self.half_mask = (1 << self.half_bits) - 1
        self.seed, self.stream = seed, tuple(stream)
        self._epoch, self._keys = -1, ()

    def _round_keys(self, epoch: int) -> tuple:
        if epoch != self._epoch:
            state = np.random.SeedSequence([self.seed, epoch, *self.stream]).generate_state(
                ROUNDS, np.uint64)
            self._keys = tuple(int(k) for k in state)
            self._epoch = epoch
        return self._keys

    def _network(self, x: int, keys: tuple) -> int:
        bits, mask = self.half_bits, self.half_mask
        left, right = x >> bits, x & mask
        for key in keys:
            left, right = right, left ^ (_splitmix64(right ^ key) & mask)
        return (left << bits) | right

    def index(self, epoch: int, within: int) -> int:
        """The sample at position ``within`` (``0 ≤ within < n``) of ``epoch``."""
        keys = self._round_keys(epoch)
        x = self._network(within, keys)
        while x >= self.n:    # cycle walking: ends, since the network permutes [0, 4^h)
            x = self._network(x, keys)
        return x


class PermutationOrder:
    """The order before ``FeistelOrder``: ``rng.permutation(n)`` per epoch (8 bytes a sample)."""

    kind = PERMUTATION

    def __init__(self, n: int, seed: int, stream: tuple = ()) -> None:
        self.n, self.seed, self.stream = n, seed, tuple(stream)
        self._epoch, self._order = -1, None

    def index(self, epoch: int, within: int) -> int:
        if epoch != self._epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch, *self.stream]))
            self._order = rng.permutation(self.n)
            self._epoch = epoch
        return int(self._order[within])


def make_order(kind: str, n: int, seed: int, stream: tuple = ()):
    if kind == FEISTEL:
        return FeistelOrder(n, seed, stream)
    if kind == PERMUTATION:
        return PermutationOrder(n, seed, stream)
    raise ValueError(f"unknown sample order {kind!r} (known: {', '.join(KINDS)})")

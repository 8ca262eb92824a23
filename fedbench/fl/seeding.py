"""Derived seeds: one independent, reproducible stream per (run seed, purpose, round, client, step).

`derive_seed` / `numpy_rng` make one stream; `SeededStreams` makes the same streams for many
coordinates at once (a round's clients), bit for bit, at a fraction of the cost (issue 29).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np
from numpy.random.bit_generator import ISeedSequence


def derive_seed(seed: int, purpose: str, *coords: int) -> int:
    """A 63-bit seed from the run seed, a purpose tag and integer coordinates.

    Coordinates may be negative (client -1 is the server); they are mapped to uint32 words.
    """
    tag = zlib.crc32(purpose.encode())
    words = [int(seed) & 0xFFFFFFFF, tag, *[int(c) & 0xFFFFFFFF for c in coords]]
    state = np.random.SeedSequence(words).generate_state(2)
    return int((int(state[0]) << 31 ^ int(state[1])) & ((1 << 63) - 1))


def torch_generator(seed: int, purpose: str, *coords: int):
    """A CPU torch.Generator seeded by `derive_seed`."""
    import torch

    return torch.Generator().manual_seed(derive_seed(seed, purpose, *coords))


def numpy_rng(seed: int, purpose: str, *coords: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *coords))


# numpy's SeedSequence hash (numpy/random/bit_generator.pyx; its output is stable across numpy versions
# by numpy's policy, and tests/test_seeding.py compares it with numpy's own on every run)
_POOL_SIZE = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)
_MASK32 = 0xFFFFFFFF


def _seed_sequence_words(entropy: list, n_words: int) -> np.ndarray:
    """`SeedSequence(e).generate_state(n_words)` (uint32) for many entropies at once: (m, n_words).

    `entropy` holds one uint32 array of length m (or a scalar) per entropy word; every entropy has the
    same number of words, and a word of 0 past the end of a shorter one, up to the pool size, hashes as
    numpy's padding does. numpy's hash constant advances the same way whatever the entropy, so the hash
    runs once, vectorised over the m entropies, instead of once per entropy in numpy's per-object code
    (where building the object and coercing the ints cost more than the hash).
    """
    words = [np.asarray(e, dtype=np.uint32) for e in entropy]
    m = max(w.size for w in words)
    words = [np.broadcast_to(w, (m,)) for w in words]
    shift = np.uint32(16)
    hash_a = [_INIT_A]

    def hashmix(value: np.ndarray) -> np.ndarray:
        xor = np.uint32(hash_a[0])
        hash_a[0] = hash_a[0] * _MULT_A & _MASK32
        value = (value ^ xor) * np.uint32(hash_a[0])
        return value ^ (value >> shift)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = _MIX_MULT_L * x - _MIX_MULT_R * y
        return result ^ (result >> shift)

    zero = np.zeros(m, dtype=np.uint32)
    pool = [hashmix(words[i] if i < len(words) else zero) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL_SIZE, len(words)):
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(words[src]))
    out = np.empty((m, n_words), dtype=np.uint32)
    hash_b = _INIT_B
    for i in range(n_words):
        value = pool[i % _POOL_SIZE] ^ np.uint32(hash_b)
        hash_b = hash_b * _MULT_B & _MASK32
        value = value * np.uint32(hash_b)
        out[:, i] = value ^ (value >> shift)
    return out


def derive_seeds(seed: int, purpose: str, coords: np.ndarray) -> np.ndarray:
    """`derive_seed(seed, purpose, *row)` for every row of an (m, c) integer array, as uint64."""
    coords = np.asarray(coords, dtype=np.int64).reshape(len(coords), -1)
    entropy = [int(seed) & _MASK32, zlib.crc32(purpose.encode())]
    entropy += [(coords[:, j] & _MASK32).astype(np.uint32) for j in range(coords.shape[1])]
    state = _seed_sequence_words(entropy, 2).astype(np.uint64)
    return (state[:, 0] << np.uint64(31) ^ state[:, 1]) & np.uint64((1 << 63) - 1)


class _SeedWords(ISeedSequence):
    """A seed sequence whose PCG64 words are already hashed (by `_pcg64_words`): PCG64 built from it
    runs numpy's own seeding on them, as `PCG64(SeedSequence(s))` does on the words it hashes."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if n_words != 4 or np.dtype(dtype) != np.uint64:
            raise ValueError(f"seed words for PCG64 (4 x uint64), asked for {n_words} x {np.dtype(dtype)}")
        return self.words


def _pcg64_words(seeds: np.ndarray) -> np.ndarray:
    """`SeedSequence(s).generate_state(4, np.uint64)` for each 63-bit seed s: (m, 4) uint64.

    An int seed is its uint32 words, low first (one word below 2**32: the zero high word hashes as
    numpy's padding); uint32 pairs make a uint64 little end first, whatever the machine, as in numpy.
    """
    seeds = np.asarray(seeds, dtype=np.uint64)
    low = (seeds & np.uint64(_MASK32)).astype(np.uint32)
    high = (seeds >> np.uint64(32)).astype(np.uint32)
    words = _seed_sequence_words([low, high], 8)
    return words.astype("<u4").view("<u8").astype(np.uint64)


class SeededStreams:
    """`numpy_rng(seed, purpose, *coords)` for many coordinates, bit for bit, seeded in one pass.

    Making a generator the usual way costs two SeedSequence objects and hashes (about 40 us, 140-220 us
    on a loaded machine: the review's profile of a 1,000-client run), more than drawing a client's batch
    order from it. The coordinates announced with `expect` are hashed together, vectorised over them
    (`derive_seeds`, `_pcg64_words`); `rng` then builds the stream's PCG64 from its hashed words
    (about 2 us), running numpy's own PCG64 seeding. Coordinates not announced get `numpy_rng`'s
    generator. An announced stream's words are handed out once, then forgotten.
    """

    def __init__(self, seed: int, purpose: str):
        self.seed, self.purpose = int(seed), purpose
        self._words: dict[tuple[int, ...], np.ndarray] = {}

    def expect(self, coords: Iterable[tuple[int, ...]]) -> None:
        """Hash the streams of these coordinates (tuples of one length) now, in one vectorised pass."""
        new = [row for row in map(tuple, coords) if row not in self._words]
        if new:
            words = _pcg64_words(derive_seeds(self.seed, self.purpose, np.array(new, dtype=np.int64)))
            self._words.update(zip(new, words, strict=True))

    def rng(self, *coords: int) -> np.random.Generator:
        """A new generator of the stream of `coords`, at its start."""
        words = self._words.pop(coords, None)
        if words is None:
            return numpy_rng(self.seed, self.purpose, *coords)
        return np.random.Generator(np.random.PCG64(_SeedWords(words)))

"""Derived seeds: one independent, reproducible stream per (run seed, purpose, round, client, step)."""

from __future__ import annotations

import zlib

import numpy as np


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

"""Derived random streams (issue 29): the vectorised seeding gives numpy's streams bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fedbench.fl.seeding import (
    SeededStreams,
    _pcg64_words,
    _seed_sequence_words,
    _SeedWords,
    derive_seed,
    derive_seeds,
    numpy_rng,
)


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("n_words", [2, 8])
def test_seed_sequence_words_equal_numpys_for_every_entropy_length(length, n_words):
    """Entropies shorter than the pool (numpy pads them), as long and longer (extra words mixed in)."""
    rng = np.random.default_rng(length)
    entropy = rng.integers(0, 2**32, size=(50, length), dtype=np.uint64)
    got = _seed_sequence_words([entropy[:, j] for j in range(length)], n_words)
    for row, words in zip(entropy.tolist(), got, strict=True):
        assert words.tolist() == np.random.SeedSequence(row).generate_state(n_words).tolist()


def test_derive_seeds_equal_derive_seed_also_for_negative_and_wide_coordinates():
    rng = np.random.default_rng(0)
    coords = rng.integers(-5, 2**34, size=(300, 3))
    coords[:3] = [[-1, 0, 0], [0, -1, 2**32 - 1], [2**32, 2**33 + 7, -(2**31)]]  # masked to uint32 words
    for seed in (0, 7, 2**40 + 3):
        got = derive_seeds(seed, "batches", coords)
        assert [int(g) for g in got] == [derive_seed(seed, "batches", *c) for c in coords.tolist()]
    assert [int(s) for s in derive_seeds(3, "participants", np.arange(5)[:, None])] == [
        derive_seed(3, "participants", r) for r in range(5)
    ]


def test_pcg64_words_seed_numpys_pcg64_state_also_below_two_to_the_32():
    seeds = np.concatenate(
        [
            derive_seeds(1, "x", np.arange(200)[:, None]),
            np.array([0, 1, 2**32 - 1, 2**32, 2**63 - 1], dtype=np.uint64),  # one-word ints pad with 0
        ]
    )
    for seed, words in zip(seeds.tolist(), _pcg64_words(seeds), strict=True):
        assert np.random.PCG64(_SeedWords(words)).state == np.random.PCG64(seed).state


def test_seed_words_refuse_what_pcg64_does_not_ask_for():
    words = _pcg64_words(np.array([5], dtype=np.uint64))[0]
    with pytest.raises(ValueError, match="4 x uint64"):
        _SeedWords(words).generate_state(8)
    with pytest.raises(ValueError, match="4 x uint64"):
        _SeedWords(words).generate_state(4, np.uint32)


def test_seeded_streams_draw_what_numpy_rng_draws_announced_or_not():
    streams = SeededStreams(11, "batches")
    coords = [(r, c, e) for r in range(3) for c in (0, 5, 999) for e in (0, 1)]
    streams.expect(coords[:-4])  # the last four are not announced: numpy_rng's own generator
    streams.expect(coords[:2])  # announcing again changes nothing
    for n, (r, c, e) in zip([1, 4, 40, 1000] * 9, coords, strict=False):
        assert (
            streams.rng(r, c, e).permutation(n).tolist()
            == numpy_rng(11, "batches", r, c, e).permutation(n).tolist()
        )
    # an announced stream is handed out once; asked again, it comes from numpy_rng, still the same
    streams.expect([(7, 7, 0)])
    first, again = streams.rng(7, 7, 0).random(3), streams.rng(7, 7, 0).random(3)
    assert first.tolist() == again.tolist() == numpy_rng(11, "batches", 7, 7, 0).random(3).tolist()
    draws = SeededStreams(11, "participants")
    draws.expect([(r,) for r in range(4)])
    for r in range(4):
        expected = numpy_rng(11, "participants", r).choice(100, 10, replace=False)
        assert draws.rng(r).choice(100, 10, replace=False).tolist() == expected.tolist()


def test_each_announced_stream_is_a_generator_of_its_own():
    """Two announced streams drawn interleaved do not share a state."""
    streams = SeededStreams(2, "batches")
    streams.expect([(0, 1, 0), (0, 2, 0)])
    a, b = streams.rng(0, 1, 0), streams.rng(0, 2, 0)
    a_draws = [a.random(), a.random()]
    b_draws = [b.random(), b.random()]
    assert a_draws == numpy_rng(2, "batches", 0, 1, 0).random(2).tolist()
    assert b_draws == numpy_rng(2, "batches", 0, 2, 0).random(2).tolist()

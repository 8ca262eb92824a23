"""Step-size schedules of signed Adam (Inverting Gradients) that need no torch: `fedbench list` imports
the plugin modules without paying for torch, and the attack's `settings()` builds its schedule here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plateau:
    """Signed Adam's step size by progress instead of by a fixed budget ('quality sooner').

    The paper's MultiStepLR decays at 3/8, 5/8 and 7/8 of a budget fixed in advance, so a budget large
    enough for a hard image wastes most of an easy one's time at a step size that no longer helps.
    Here a candidate's step size decays x`factor` once its objective has not improved by a relative
    `rtol` for `patience` iterations, and after `decays` decays the next such plateau stops it
    (converged). Decisions are taken every `check_every` iterations (one host sync each) and per
    candidate, so a restart's schedule does not depend on the others' progress (batched and separate
    runs still differ in the last float digits, which signed steps amplify over many iterations).
    """

    patience: int = 100
    rtol: float = 1e-3
    decays: int = 3
    factor: float = 0.1
    check_every: int = 25


#: (largest image size in values C*H*W, iteration cap, patience) of the auto schedule, smallest first.
#: The cap is inversefed's 4,800 iterations up to 32x32 colour images and the paper's 24,000 above. The
#: digits' patience of 50 comes from `benchmarks/sweep_ig_schedule.py` (LeNet, three digits: every run
#: stopped converged within 3,725 iterations; patience 100 ends 2-26 dB higher but takes twice as long,
#: docs/benchmarks.md). Colour and larger images are not swept on this CPU (one 24,000-iteration run of a
#: ConvNet-64 takes hours): their patience scales with the image.
AUTO_SCHEDULES = ((1024, 4800, 50), (3072, 4800, 100), (None, 24000, 200))


def auto_schedule(shape: tuple[int, ...]) -> tuple[int, int]:
    """(iteration cap, plateau patience) of the auto schedule for an input of `shape` (C, H, W)."""
    size = 1
    for s in shape:
        size *= int(s)
    for largest, cap, patience in AUTO_SCHEDULES:
        if largest is None or size <= largest:
            return cap, patience
    raise AssertionError("the last schedule has no size limit")

"""Step-size schedules of signed Adam (Inverting Gradients) that need no torch: `fedbench list` imports
the plugin modules without paying for torch, and the attack's `settings()` builds its schedule here.
"""

from __future__ import annotations

import dataclasses
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
    `growth` multiplies the patience after each decay (1: the same patience in every phase).
    """

    patience: int = 100
    rtol: float = 1e-3
    decays: int = 3
    factor: float = 0.1
    check_every: int = 25
    growth: float = 1.0

    def patience_after(self, decays: int) -> float:
        """The patience of the phase after `decays` decays: `patience * growth**decays`."""
        return self.patience * self.growth**decays


#: The paper's (and breaching's) Inverting Gradients budget: the stall schedule's iteration cap (issue
#: 28: an auto schedule is capped at the paper's budget; it stops on convergence long before).
PAPER_ITERATIONS = 24_000

#: The stall schedule ('decay on stall', the default of `inverting-gradients` since issue 29): signed
#: Adam's lr-0.1 phase ends on the objective's first stall, a 2 % relative improvement missing for 10
#: iterations (checked every 5), and each later phase waits twice as long (20, 40, then 80 before the
#: stop), where progress is slow but real. On breaching's case the old plateau rule (0.1 % for 50)
#: held the lr-0.1 plateau near 30 dB for about 120 of its 351 evaluations; tuned on mnist5k digits
#: 0-2 with LeNet-12 and ConvNet-64 (`benchmarks/bench_ig_converge.py`, docs/benchmarks.md).
STALL = Plateau(patience=10, rtol=2e-2, decays=3, factor=0.1, check_every=5, growth=2.0)

#: (largest image size in values C*H*W, iteration cap, patience) of the plateau schedule, smallest first
#: (the auto schedule until issue 29, `schedule=plateau` since; the stall schedule's patience scales
#: with the image in the same ratios).
#: The cap is inversefed's 4,800 iterations up to 32x32 colour images and the paper's 24,000 above. The
#: digits' patience of 50 comes from `benchmarks/sweep_ig_schedule.py` (LeNet, three digits: every run
#: stopped converged within 3,725 iterations; patience 100 ends 2-26 dB higher but takes twice as long,
#: docs/benchmarks.md). Colour and larger images are not swept on this CPU (one 24,000-iteration run of a
#: ConvNet-64 takes hours): their patience scales with the image.
AUTO_SCHEDULES = ((1024, 4800, 50), (3072, 4800, 100), (None, 24000, 200))


def auto_schedule(shape: tuple[int, ...]) -> tuple[int, int]:
    """(iteration cap, plateau patience) of the plateau schedule for an input of `shape` (C, H, W)."""
    size = 1
    for s in shape:
        size *= int(s)
    for largest, cap, patience in AUTO_SCHEDULES:
        if largest is None or size <= largest:
            return cap, patience
    raise AssertionError("the last schedule has no size limit")


def scaled(plateau: Plateau, scale: float) -> Plateau:
    """`plateau` with its patience multiplied by `scale` (at least 1 iteration); 1 returns it as is."""
    if scale == 1:
        return plateau
    return dataclasses.replace(plateau, patience=max(1, round(plateau.patience * scale)))


def stall_schedule(shape: tuple[int, ...], scale: float = 1.0) -> tuple[int, Plateau]:
    """(iteration cap, schedule) of the stall schedule for an input of `shape`, with the cap and the
    patience multiplied by `scale` (the budget check's doubling). The patience grows with the image in
    the plateau table's ratios (1x up to 1,024 values, 2x up to 3,072, 4x above): only 1x28x28 was
    tuned on this CPU."""
    smallest = AUTO_SCHEDULES[0][2]
    ratio = auto_schedule(shape)[1] / smallest
    return max(1, round(PAPER_ITERATIONS * scale)), scaled(STALL, ratio * scale)

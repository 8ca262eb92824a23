"""Reference models for the calibrated membership attacks (`mia-rmia`, `mia-lira-online`).

Why a module of its own: LiRA and RMIA stand or fall with reference models trained *like the target*.
`mia-lira` trains its references centrally (SGD on the attacker's data), but the target of an FL run
is the average of client updates over rounds, shaped by the defense (clipping, noise, pruning). A
central reference says how confident "a model" is on an example, not how confident a model *trained
by this federation* is. With `references="fl"` each reference is a run of the FL simulation
(`fedbench.fl.simulation.Simulation`, the engine the target ran in) that copies the target's protocol:
the same scenario (protocol, clients, partition, participation, rounds, local epochs or steps, batch
size, lr, server lr, loss) and a fresh instance of the run's defense with the same parameters (its
clipping and noise included; bound by `bind_defense`), on a training set of the target's size.
`references="central"` keeps `mia-lira`'s central training (`_membership_core.train_shadow`).

What a reference trains on (one per reference k = 0..K-1):
- offline (OUT only): `size` examples drawn from the attacker's own data, the training examples no
  client holds (`RunData.unused_train`), else pool examples not queried. No queried example is in it.
- online (IN and OUT, LiRA §IV-B / RMIA's online mode): every queried candidate is IN for exactly
  K/2 of the K references (K even), as in LiRA's reference code; fedbench pairs the references
  (2j and 2j+1 take complementary random halves of the candidates), so each also holds exactly half
  of them and none outgrows the target's training set; reference k trains on its IN candidates topped
  up with the attacker's own data to `size` examples.
`size` defaults to the target's training-set size (every client's examples), so a reference's clients
hold as many examples as the target's. Where the whole pool is queried (issue 30: mnist5k at
test_fraction 0.5, 2,500 members and 2,500 non-members, all candidates) the halves alone are the
target's size: the references are the LiRA paper's models on random halves of the pool, and
`mia-lira-online mode=offline` scores each candidate against its OUT half only. A size the candidates
and the attacker's data cannot give exactly fails in one line naming `reference_size`
(`_references_core.check_fill`).
A reference starts from the target's architecture re-initialised by its modules' `reset_parameters`
(as `mia-lira`'s do). An FL reference that diverges (a noisy protocol, a non-finite loss) is stored as
diverged and redrawn with its next seed, up to 3 draws (`references_diverged` counts them).

Sharing. References belong to the attacker, so nothing of the target's run keys them: the attacker's
own reference seed (`reference_seed`, not the run's seed) picks each reference's data and
initialisation, and each trained reference is an artifact (`fedbench.plugin.artifact`, kind
`membership-reference`) keyed by what it depends on: the content of its training set (a digest of
its x and y), the architecture, the scenario it trains under (`fl`) or its SGD schedule (`central`),
the defense's name, version and parameters (`fl`), and k's seed. Offline references therefore serve
every seed of a grid row (the attacker's data does not change with the target's seed), and the first
4 of 16 serve the cheap mode too; online references serve every run that queries the same candidates,
in whatever order its seed shuffled them (the halves are drawn in content order,
`_references_core.assign_halves`): on the membership board, where every digit of the pool is queried,
one set of references per row serves all its seeds. The seeds' estimates then share that reference
set, as LiRA's evaluations share theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fedbench.attacks.membership import _DesignParams, _MembershipAttack
from fedbench.spec.params import param

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from fedbench.attacks._references_core import ReferenceSet
    from fedbench.plugin import AttackOutput, Defense


@dataclass(frozen=True)
class ReferenceParams(_DesignParams):
    """How the attacker's reference models are trained (shared by mia-rmia and mia-lira-online)."""

    references: Literal["fl", "central"] = param(
        "fl", "fl: FL runs copying the target's protocol and defense; central: SGD as mia-lira"
    )
    references_n: int = param(16, "reference models K (<= 4: the cheap mode)", min=1)
    reference_size: int = param(
        0, "training examples per reference; 0 = the target's training-set size", min=0
    )
    central_epochs: int = param(30, "SGD epochs of a central reference (references=central)", min=1)
    reference_seed: int = param(0, "the attacker's seed for its references (not the target's seed)", min=0)


class ReferenceAttack(_MembershipAttack):
    """A membership attack scored against reference models (`train_references`), on the shared design.

    Subclasses set `online` (whether the references train on the queried candidates) and implement
    `calibrated`, the scores of every queried candidate given the references. The candidates are the
    calibration halves and the evaluated set; the decision threshold is the accuracy-maximising one on
    the calibration halves' scores, as `mia-lira` and `mia-loss` set theirs.
    """

    def __init__(self, params: Any = None):
        super().__init__(params)
        self.defense: Defense | None = None

    def bind_defense(self, defense: Defense) -> None:
        self.defense = defense  # references=fl copies it (a fresh instance per reference run)

    @property
    def online(self) -> bool:
        raise NotImplementedError

    def population_count(self, unused: np.ndarray) -> int:
        """How many population samples (non-member pool, not queried) the attack holds out; 0 = none."""
        return 0

    def calibrated(
        self, target: nn.Module, refs: ReferenceSet, x: torch.Tensor, y: torch.Tensor, z: Any, device
    ) -> np.ndarray:
        raise NotImplementedError

    def score(self, split, unused, target, observation, meta, generator, device, rng) -> AttackOutput:
        import numpy as np
        import torch

        from fedbench.attacks import _membership_core as core
        from fedbench.attacks._references_core import own_data, own_from_pool, population, train_references
        from fedbench.plugin import AttackOutput

        p = self.params
        x = torch.cat([split.x_in, split.x_out, split.x_eval])
        y = torch.cat([split.y_in, split.y_out, split.y_eval])
        n_z = self.population_count(unused)
        z = population(self.data, p.source, unused, n_z) if n_z else None
        own = own_data(self.data, p.source, unused, skip=n_z if own_from_pool(self.data, p.source) else 0)
        batch = observation.batch_size or 32
        refs = train_references(
            p, target, self.data, self.defense, (x, y), own, self.online, observation.lr, batch, device
        )
        scores = self.calibrated(target, refs, x, y, z, device)
        n_in, n_out = len(split.y_in), len(split.y_out)
        threshold = core.best_threshold(scores[:n_in], scores[n_in : n_in + n_out])
        evaluated = scores[n_in + n_out :]
        extra = {**refs.facts, "threshold": float(threshold)}
        if z is not None:
            extra["population"] = len(z[1])
        return AttackOutput(
            scores=evaluated, predictions=(evaluated > threshold).astype(np.int8), extra=extra
        )

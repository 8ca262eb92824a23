"""`frl`: Federated Regularization Learning (Su, Wang, Wang; AICAS 2021; spec 003 §3).

Every client trains its classifier F against a small simulated membership attacker A (the SA
network: prediction, label and judgment modules) and hides exact gradient values by delaying small
entries (gradient modification, Eq. 6, momentum factor m = 1.5). The torch code and the exact
losses are in `fedbench.defenses._frl_core`.

Where the paper is silent (spec 003 ambiguity table) the defaults are the spec's: SA sizes
128-64 / 64 / 64-1, Adam 1e-3 for A, one SA step per classifier step, flags local = 1 / aux = 0,
GM per local step with the top-10% entries of each tensor, residual kept on the client across
rounds, A aggregated with FedAvg. The classifier's privacy term is Eq. 5 as written (`term=bce`);
`term=mean` is the bounded term of Nasr et al.'s adversarial-regularisation code (an option, not
the paper's; see `_frl_core`).

The auxiliary set: `aux_fraction` of the training prefix, drawn at random (seeded by the run seed)
and set aside by the server before the data is split over the clients (`Defense.reserve`), as the
paper's "divided into a training dataset and an auxiliary dataset". No client trains on it, and
membership attacks do not count it as members. Every client samples its aux batch from it.
`aux_from=unused` takes the same number of examples from beyond the training prefix instead (records
no client holds, as the server's own data): the prefix stays whole, so a scenario with as many
one-record clients as training examples (the FedAvg board) can run FRL.

Engine hooks: `reserve` (the carve-out), `bind_data` (aux tensors, client sizes), `loss` (SA step
then Eq. 5), `step` (GM per local step), `update` (GM per round; the client's SA state is handed to
the server here), `aggregate` (FedAvg of the SA states; the classifier keeps the engine's mean).
The SA network and the residuals are defense-internal state: the defense object lives for the
whole simulation. Residuals cost one model copy per client that ever trained (memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fedbench.attacks.membership import FRL_PAPER
from fedbench.plugin import Defense, HookContext, RunData
from fedbench.registry import register_defense
from fedbench.spec.params import param


@register_defense("frl", "federated-regularization")
class FRL(Defense):
    """FRL: simulated-attacker (SA network) regulariser + gradient modification with momentum residuals."""

    version = "1"
    paper = FRL_PAPER
    key_optional = ("aux_from",)  # added later: at its default the run ids stay those of before

    @dataclass(frozen=True)
    class Params:
        lam: float = param(5.0, "lambda, weight of the SA network (paper: 3, 5, 7; 5 for Table II)", min=0)
        m: float = param(
            1.5, "gradient-modification momentum factor m (paper 1.5; must be > 1)", min=1, min_open=True
        )
        gm: Literal["step", "round", "off"] = param(
            "step", "gradient modification per local step (spec default), per round update, or off"
        )
        threshold: Literal["top-rho", "absolute"] = param(
            "top-rho", "S_select: the top-rho entries of |a| per tensor, or |a| > tau"
        )
        rho: float = param(
            0.1, "fraction of each tensor's entries sent now (top-rho)", min=0, max=1, min_open=True
        )
        tau: float = param(1e-3, "absolute GM threshold (threshold=absolute)", min=0)
        aux_fraction: float = param(
            0.1,
            "server's auxiliary set: this fraction of the training prefix, set aside before the split",
            min=0,
            max=1,
            min_open=True,
            max_open=True,
        )
        aux_from: Literal["train", "unused"] = param(
            "train",
            "auxiliary set: carved out of the training prefix (paper) or the examples beyond it (unused)",
        )
        aux_sampling: Literal["class-matched", "uniform"] = param(
            "class-matched", "aux batch: the local batch's labels (ours; see _frl_core) or uniform"
        )
        sa_arch: Literal["spec", "nasr"] = param("spec", "SA network sizes: spec default or Nasr et al.'s")
        sa_lr: float = param(1e-3, "Adam learning rate of the SA network", min=0, min_open=True)
        sa_steps: int = param(1, "SA steps before each classifier step", min=1)
        term: Literal["bce", "mean"] = param(
            "bce", "classifier's privacy term: -lambda*BCE(A,1) (Eq. 5) or lambda*(mean A - 1/2) (Nasr code)"
        )

    def __init__(self, params: Any = None):
        super().__init__(params)
        self._seed = 0
        self._state: Any = None

    def reserve(self, train_size: int, seed: int):
        from fedbench.errors import FedbenchError
        from fedbench.fl.seeding import numpy_rng

        self._seed = seed
        n_aux = round(self.params.aux_fraction * train_size)
        if n_aux < 1 or n_aux >= train_size:
            raise FedbenchError(
                f"frl: aux_fraction={self.params.aux_fraction} of {train_size} training examples leaves "
                f"an auxiliary set of {n_aux}; choose aux_fraction so that it holds 1 to {train_size - 1}"
            )
        if self.params.aux_from == "unused":  # the examples right after the prefix: no client's
            return list(range(train_size, train_size + n_aux))
        return sorted(numpy_rng(seed, "frl-aux").choice(train_size, n_aux, replace=False).tolist())

    def bind_data(self, data: RunData) -> None:
        import torch

        from fedbench.defenses._frl_core import FRLState
        from fedbench.errors import FedbenchError

        aux = torch.as_tensor(data.reserved, dtype=torch.long)
        available = len(data.bundle.y_train)
        if len(aux) and int(aux.max()) >= available:
            raise FedbenchError(
                f"frl: aux_from=unused needs {len(aux)} training examples beyond scenario.train_size, "
                f"the dataset has {available} in all; lower scenario.train_size or use aux_from=train"
            )
        self._state = FRLState(
            self.params,
            data.bundle.x_train[aux],
            data.bundle.y_train[aux],
            data.bundle.meta.num_classes,
            [len(ix) for ix in data.client_indices],
            self._seed,
        )

    def loss(self, model, x, y, base_loss, ctx: HookContext):
        return self._state.loss(model, x, y, base_loss, ctx)

    def sparsifying_hooks(self) -> tuple[str, ...]:
        """GM sends only the selected entries (the rest wait in the residual): where it runs, it zeroes."""
        return {"step": ("step",), "round": ("update",)}.get(self.params.gm, ())

    def step(self, grad, ctx: HookContext):
        return self._state.modify(grad, ctx.client) if self.params.gm == "step" else grad

    def update(self, delta, ctx: HookContext):
        self._state.client_done(ctx.client)
        return self._state.modify(delta, ctx.client) if self.params.gm == "round" else delta

    def aggregate(self, updates, weights, ctx: HookContext):
        self._state.aggregate_sa()
        return None  # the classifier: the engine's weighted mean (FedAvg)

"""`robbing-the-fed`: Robbing the Fed's binned imprint attack (Fowl, Geiping, Czaja, Goldblum, Goldstein,
ICLR 2022, arXiv 2110.13057; breaching's `ImprintBlock` and `ImprintAttacker`).

Threat model: a malicious server that ships a MODIFIED ARCHITECTURE, the `imprint` model
(`fedbench.models.imprint`: an imprint block of k bins in front of a base model). Trap weights and
SDAN only set the parameters of an honest architecture; this is a stronger server, so its numbers
are ranked apart from theirs. The attack skips any model without the block.

The server hook sets the block in every broadcast (the paper's construction, breaching's cumulative
`ImprintBlock` with `connection=linear`):

- every bin's weight row is the same measurement h(x) = <w, x> in [0, 1] pixel space: the image's
  mean brightness (w = 1/n, `measurement=brightness`) or a random Gaussian direction
  (`measurement=gaussian`, breaching's `randn`), divided by the measurement's spread on auxiliary data;
- bin i's bias is -c_i, with thresholds c_0 < c_1 < ... < c_{k-1} at the measurement's quantiles
  i/k (equal mass per bin) and c_0 ten spreads below the mean (breaching's -10), so bin i fires for
  every input with h(x) > c_i. The quantiles come from a Gaussian fitted to the measurement on
  auxiliary data (`quantiles=gaussian`, the paper's assumption) or from the auxiliary data itself
  (`quantiles=data`). Auxiliary data: the TEST split of the run's dataset, as `sdan-poisoning`;
- the decode layer maps the k activations back to the input size with equal columns (1/k), so the
  gradient reaching every bin from one input is the same number g(x).

Then bin i's gradients are sums over the inputs with h(x) > c_i: dL/dW_i = sum g(x) x and
dL/db_i = sum g(x). Consecutive differences keep the inputs inside one bin, (c_i, c_{i+1}]:
x = (dW_i - dW_{i+1}) / (db_i - db_{i+1}) is exact when one input of the batch falls in that bin
and a mixture of the bin's inputs otherwise (the attacker cannot tell which; see `bins_hit`).
The recovery, pixel-space mapping, filtering, dedupe and scoring are those of `fc-leakage`
(`fedbench.attacks._fc_recovery`), applied to the differenced gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedbench.attacks.fc_leakage import _FCRecovery, _RecoveryParams
from fedbench.models.imprint import RTF_PAPER
from fedbench.registry import register_attack
from fedbench.spec.params import param


class ImprintHook:
    """Malicious server: every broadcast carries the binned imprint block's parameters."""

    def __init__(self, params: Any, meta: Any = None):
        self.params = params
        self.meta = meta

    def broadcast(self, state: dict, round: int) -> dict:
        from fedbench.attacks._rtf_core import imprint_state

        return imprint_state(state, self.params, self.meta)


@register_attack("robbing-the-fed", "rtf", "imprint-attack")
class RobbingTheFed(_FCRecovery):
    """Malicious server that modifies the architecture: a binned imprint block, then recovery per bin."""

    version = "1"
    paper = RTF_PAPER
    threat: ClassVar[str] = "malicious server, modifies the architecture"

    @dataclass(frozen=True)
    class Params(_RecoveryParams):
        measurement: Literal["brightness", "gaussian"] = param(
            "brightness",
            "the linear measurement h(x) every bin reads: brightness = mean pixel value; gaussian = a "
            "random Gaussian direction (breaching's randn)",
        )
        quantiles: Literal["gaussian", "data"] = param(
            "gaussian",
            "bin thresholds at the i/k quantiles of: gaussian = a normal fitted to h on the aux data "
            "(the paper's assumption); data = the aux data's own distribution of h",
        )
        dataset: str = param("same", "aux data source (its TEST split); same = the run's own dataset")
        aux: int = param(0, "number of auxiliary examples drawn from the test split; 0 = all", min=0)
        seed: int = param(0, "seed of the Gaussian direction and of the aux draw", min=0)

    def check_model(self, model: Any) -> str | None:
        from fedbench.attacks._rtf_core import imprint_reason

        return imprint_reason(model)

    def server_hook(self, meta: Any = None) -> Any:
        return ImprintHook(self.params, meta)

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._rtf_core import recover_bins

        return recover_bins(self, observation, model, meta)

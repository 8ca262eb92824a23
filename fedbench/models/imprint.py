"""`imprint`: a base model behind Robbing the Fed's binned imprint block (Fowl et al., ICLR 2022).

Robbing the Fed's server changes the ARCHITECTURE it ships, not only the parameters: it puts a block
in front of any model, input -> Linear(n, k) -> ReLU -> Linear(k, n) -> reshape -> base model. This
model plugin is that shipped architecture, so the threat model is explicit in the run's model name
(`imprint[base="fcnn[depth=2]",bins=64]`) and an honest federation trains the same network for the
utility number. The block's parameters are set by the attack's server hook (`robbing-the-fed`,
`fedbench.attacks.rtf`); here they keep torch's default init, as an honest server would ship them.

Names in the state: `imprint.weight` [k, n] and `imprint.bias` [k] (the k bins, the layer the attack
reads), `decode.weight` [n, k] and `decode.bias` [n] (back to the input size, as breaching's
`connection=linear`), then the base model's own parameters under `base.`. The imprint layer is the
first layer with parameters, so the first-FC-layer attacks (`fc-leakage`) also apply to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedbench.models import TorchClasses, check_build_args
from fedbench.plugin import Model, Paper
from fedbench.registry import register_model
from fedbench.spec.params import param

if TYPE_CHECKING:
    from torch import nn

RTF_PAPER = Paper(
    "fowl2022robbing",
    "Robbing the Fed: Directly Obtaining Private Data in Federated Learning with Modified Models",
    "https://arxiv.org/abs/2110.13057",
)

TORCH_CLASSES = TorchClasses(__name__, "ImprintNet")
__getattr__ = TORCH_CLASSES.module_getattr


@TORCH_CLASSES.define
def _define_torch_classes() -> dict[str, type]:
    """Define the nn.Module class (importing torch)."""
    import torch
    from torch import nn

    class ImprintNet(nn.Module):
        """input -> imprint (Linear n->k) -> ReLU -> decode (Linear k->n) -> reshape -> base."""

        def __init__(self, input_shape: tuple[int, ...], bins: int, base: nn.Module) -> None:
            super().__init__()
            self.input_shape = tuple(input_shape)
            n = 1
            for s in self.input_shape:
                n *= s
            self.imprint = nn.Linear(n, bins)
            self.act = nn.ReLU()
            self.decode = nn.Linear(bins, n)
            self.base = base

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.act(self.imprint(x.reshape(x.shape[0], -1)))
            return self.base(self.decode(h).reshape(x.shape[0], *self.input_shape))

    return {"ImprintNet": ImprintNet}


def base_model(pattern: str) -> tuple[str, dict[str, Any]]:
    """(name, params) of the base model pattern, checked: a registered model other than `imprint`."""
    from fedbench.errors import ParamError
    from fedbench.models import create_model
    from fedbench.registry import models
    from fedbench.spec.patterns import parse_pattern

    name, params = parse_pattern(pattern)
    canonical = models.canonical(name)
    if canonical == "imprint":
        raise ParamError("model 'imprint': the base model cannot be another imprint model")
    create_model(canonical, params)  # validates the base's parameters now, not mid-run
    return canonical, params


@register_model("imprint", "rtf-imprint")
class Imprint(Model):
    """Robbing the Fed's imprint block (k bins) in front of a base model named by a pattern."""

    version = "1"
    paper = RTF_PAPER

    @dataclass(frozen=True)
    class Params:
        base: str = param(
            "mlp",
            "the model behind the block, a model pattern name[k=v], e.g. fcnn[fc1_width=1024,depth=2] "
            '(quote it inside a pattern: imprint[base="fcnn[depth=2]"])',
        )
        bins: int = param(
            64, "number of bins k of the imprint layer (breaching's RtF config: 64)", min=2, max=100_000
        )

        def validate(self) -> str | None:
            from fedbench.errors import FedbenchError

            try:
                base_model(self.base)
            except FedbenchError as exc:
                return f"parameter 'base' = {self.base!r}: {exc}"
            return None

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        from fedbench.models import build_model

        shape = check_build_args(f"model '{self.name}'", input_shape, num_classes)
        name, params = base_model(self.params.base)
        base = build_model(name, params, shape, num_classes)
        return TORCH_CLASSES["ImprintNet"](shape, self.params.bins, base)

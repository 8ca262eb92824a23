"""The membership classifier shared by FRL's simulated attacker and the `mia-direct`/`mia-shadow` attacks.

FRL (spec 003 §3.1) has three modules: a prediction branch on the classifier's probability vector,
a label branch on the one-hot true label, and a judgment MLP on their concatenation ending in one
logit (the sigmoid is applied by the BCE-with-logits loss, which is the numerically stable form of
the paper's sigmoid + BCE). The paper gives no sizes; `spec` is the spec's default, `nasr` the
sizes of Nasr et al.'s adversarial regularisation (2018). The black-box attack model uses the same
architecture (spec §2.2 default), so the defense trains against the kind of attacker it is judged by.

Private module (not a registered plugin): it imports torch at module level.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

MembershipArch = Literal["spec", "nasr"]
_SIZES: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    # (prediction branch, label branch, judgment hidden layers)
    "spec": ((128, 64), (64,), (64,)),
    "nasr": ((1024, 512, 64), (512, 64), (256, 64)),
}


def _mlp(sizes: tuple[int, ...], d_in: int) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for width in sizes:
        layers += [nn.Linear(d_in, width), nn.ReLU()]
        d_in = width
    return nn.Sequential(*layers), d_in


class MembershipNet(nn.Module):
    """A(F(x), y): membership logit from a probability vector and the true label (three modules)."""

    def __init__(self, num_classes: int, arch: MembershipArch = "spec"):
        super().__init__()
        pred, label, judge = _SIZES[arch]
        self.num_classes = num_classes
        self.prediction, d_pred = _mlp(pred, num_classes)
        self.label, d_label = _mlp(label, num_classes)
        body, d_judge = _mlp(judge, d_pred + d_label)
        self.judgment = nn.Sequential(body, nn.Linear(d_judge, 1))

    def forward(self, probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = nn.functional.one_hot(y, self.num_classes).to(probs.dtype)
        joint = torch.cat([self.prediction(probs), self.label(onehot)], dim=1)
        return self.judgment(joint).squeeze(1)

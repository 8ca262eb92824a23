"""A deliberately broken DP defense, for the privacy-audit end-to-end test (tests/test_audit_board.py).

`broken-dp` is `dp-sgd` with a bug: its per-example step returns the plain mean of the per-example
gradients, so it neither clips nor adds the Gaussian noise its sigma was calibrated for. Its
accounting is dp-sgd's untouched (`DPSGD.accounting`: the noise multiplier calibrated to the target
`epsilon`, example level, the participation accountant), so every row claims the formal (epsilon,
delta) of a correct dp-sgd at that target while the training is that of defense `none`. A privacy
audit must catch it: the mechanism is noiseless, so no finite epsilon holds, and an attack on a model
that memorised its training set certifies more than a small claimed epsilon.

Load it with `--plugin tests/plugins/broken_dp.py` (or `fedbench.registry.load_plugin_file`).
"""

from __future__ import annotations

from fedbench.defenses.dp_calibrated import DPSGD
from fedbench.registry import register_defense


@register_defense("broken-dp")
class BrokenDP(DPSGD):
    """dp-sgd with its noise and clipping silently dropped; it still reports dp-sgd's epsilon (tests)."""

    version = "1"
    paper = None

    def per_example(self, grads, ctx):
        # the bug: the clipped, noised mean of DPSGD.per_example is never computed
        return {k: g.mean(0) for k, g in grads.items()}

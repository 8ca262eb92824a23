"""Operations on gradient/update dicts shared by defenses: global L2 norm and clipping.

torch is imported inside the functions: defense modules are imported by `fedbench list`, which must
not pay for importing torch.
"""

from __future__ import annotations

from typing import Any


def global_norm(tensors: dict[str, Any]) -> Any:
    """L2 norm of all tensors flattened and concatenated (accumulated in float64)."""
    import torch

    return torch.sqrt(sum((t.double() ** 2).sum() for t in tensors.values())).to(torch.float32)


def clip_global(tensors: dict[str, Any], bound: float) -> dict[str, Any]:
    """Scale so that the global L2 norm is at most `bound`: g / max(1, ||g|| / B)."""
    factor = 1.0 / max(1.0, float(global_norm(tensors)) / bound)
    return {k: v * factor for k, v in tensors.items()}

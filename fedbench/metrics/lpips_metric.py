"""LPIPS (Zhang et al., 2018) through the `lpips` package, with real backbone weights only.

The `lpips` package ships its calibrated linear heads (`lpips/weights/v0.1/<net>.pth`), but its trunk
is torchvision's ImageNet AlexNet / VGG16 / SqueezeNet 1.1, which `lpips` 0.1.4 obtains by calling
`torchvision.models.alexnet(pretrained=True)`; that downloads the weights on first use. fedbench never
lets it download, and never scores with a randomly initialised trunk: the trunk weights must already
sit in the torch hub cache, `torch.hub.get_dir()/checkpoints/<file>` (i.e. `$TORCH_HOME/hub/checkpoints`),
under the file name torchvision gives them (for example `alexnet-owt-7be5be79.pth`). On a connected
machine, `torchvision.models.alexnet(weights="IMAGENET1K_V1")` puts it there; offline, copy it there.

When the file is missing, `lpips_available` says so and `get_lpips` returns None without importing
or constructing anything from `lpips`. When it is present, the `LPIPS` module is built with a random
trunk (`pnet_rand=True`, which never touches the network) and the trunk is immediately overwritten
from the cached file, strictly (every backbone tensor must be in the file with the right shape), so a
distance is only ever computed with the ImageNet trunk. Nothing is imported or loaded at import time.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

# Trunk weights file per `lpips` net name, as torchvision 0.28 names them (the basename of
# `AlexNet_Weights.IMAGENET1K_V1.url`, `VGG16_Weights.IMAGENET1K_V1.url`,
# `SqueezeNet1_1_Weights.IMAGENET1K_V1.url`; checked by the tests).
BACKBONE_FILES: dict[str, str] = {
    "alex": "alexnet-owt-7be5be79.pth",
    "vgg": "vgg16-397923af.pth",
    "squeeze": "squeezenet1_1-b8a52dc0.pth",
}
# torchvision builder per net name (its `features` module is what lpips slices).
_TV_BUILDERS: dict[str, str] = {"alex": "alexnet", "vgg": "vgg16", "squeeze": "squeezenet1_1"}

# Images whose shorter side is below this are upsampled (bilinear) before LPIPS: AlexNet's
# conv(11, stride 4) + two 3x3/2 max-pools need at least 31 px to produce a non-empty feature map.
MIN_SIDE = 32

LpipsFn = Callable[[Any, Any], np.ndarray]

_cache: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def backbone_path(net: str = "alex") -> str:
    """Where the trunk weights of `net` must be: `torch.hub.get_dir()/checkpoints/<torchvision file>`."""
    if net not in BACKBONE_FILES:
        raise ValueError(f"LPIPS net {net!r} is not one of {sorted(BACKBONE_FILES)}")
    import torch

    return os.path.join(torch.hub.get_dir(), "checkpoints", BACKBONE_FILES[net])


def lpips_available(net: str = "alex") -> tuple[bool, str]:
    """Whether real LPIPS(`net`) can be computed here, and a one-line reason when it cannot.

    Looks only at the file system (and whether `lpips` is installed); builds nothing.
    """
    path = backbone_path(net)
    if not os.path.isfile(path):
        return False, (
            f"LPIPS unavailable: backbone weights {BACKBONE_FILES[net]} not in {os.path.dirname(path)}; "
            "place them there (they download on a connected machine)"
        )
    import importlib.util

    if importlib.util.find_spec("lpips") is None:
        return False, "LPIPS unavailable: the 'lpips' package is not installed (pip install lpips)"
    return True, f"LPIPS ({net}, v0.1) with backbone weights from {path}"


def _build(net: str, path: str) -> Any:
    """The `lpips.LPIPS` module with its trunk loaded from `path` (never downloaded, never random)."""
    import torch

    from fedbench._compat import import_torchvision

    tv = import_torchvision()  # lpips imports torchvision at module level
    import lpips

    state = torch.load(path, map_location="cpu", weights_only=True)
    reference = getattr(tv.models, _TV_BUILDERS[net])(weights=None)
    # only the trunk (`features`) is used, and it must be complete: every tensor, the right shapes
    trunk = {k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")}
    try:
        reference.features.load_state_dict(trunk, strict=True)
    except RuntimeError as err:
        raise RuntimeError(
            f"LPIPS backbone weights {path} do not fit torchvision {_TV_BUILDERS[net]}: {err}"
        ) from err
    with warnings.catch_warnings():  # lpips passes torchvision's deprecated `pretrained=False`
        warnings.simplefilter("ignore", UserWarning)
        model = lpips.LPIPS(net=net, version="0.1", pnet_rand=True, verbose=False)
    # lpips slices `features` into slice1..sliceK whose children are named by their features index.
    for slice_name, part in model.net.named_children():
        if not slice_name.startswith("slice"):
            continue
        for idx, module in part.named_children():
            module.load_state_dict(reference.features[int(idx)].state_dict(), strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _as_tensor(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float32)
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def _prepare(x: Any, name: str) -> Any:
    import torch.nn.functional as F

    if x.dim() != 4:
        raise ValueError(f"LPIPS {name} must be [N, C, H, W], got shape {tuple(x.shape)}")
    c = x.shape[1]
    if c == 1:
        x = x.repeat(1, 3, 1, 1)
    elif c != 3:
        raise ValueError(f"LPIPS {name} must have 1 or 3 channels, got {c}")
    h, w = x.shape[2:]
    if min(h, w) < MIN_SIDE:
        scale = MIN_SIDE / min(h, w)
        size = (max(MIN_SIDE, int(np.ceil(h * scale))), max(MIN_SIDE, int(np.ceil(w * scale))))
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return x * 2.0 - 1.0  # lpips expects [-1, 1]


def get_lpips(net: str = "alex", device: Any = "cpu", batch_size: int = 64) -> LpipsFn | None:
    """A per-image LPIPS distance function, or None when `lpips_available(net)` is False.

    The function takes `(true, rec)`, each [N, C, H, W] in [0, 1] (numpy or torch, C = 1 or 3) and
    returns a float64 numpy array of N distances (lower = more similar = more leakage). Grayscale images
    are repeated to 3 channels, and images whose shorter side is below 32 px are upsampled bilinearly so
    that the shorter side is 32 px (AlexNet needs >= 31 px); LPIPS of upsampled 8x8 or 28x28 images is
    therefore only comparable with LPIPS computed at the same resolution. The module is built once per
    (net, weights file) and process.
    """
    ok, _ = lpips_available(net)
    if not ok:
        return None
    path = backbone_path(net)
    with _lock:
        key = (net, path)
        if key not in _cache:
            _cache[key] = _build(net, path)
        model = _cache[key]

    return _distance_fn(model, "LPIPS", device, batch_size)


# ------------------------------------------------------------------------------------- in a run
#
# `fedbench.metrics.attack_metrics` scores every reconstruction run with LPIPS whenever the trunk
# weights are in the torch hub cache and load (a file that does not fit is reported, never used), and
# with ST-LPIPS whenever the optional `stlpips-pytorch` package is installed. Metrics are computed
# outside the attack cache, so placing the weights later fills the column for cached runs too. When a
# metric cannot be computed, its column stays empty and the reason is stated once per process.

_stated: set[str] = set()
_failed: dict[tuple[str, ...], str] = {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def run_lpips(net: str = "alex") -> tuple[LpipsFn | None, str]:
    """(LPIPS function, one-line status) for scoring runs: None with the reason when the trunk weights
    are missing or do not load. Never raises, never downloads."""
    ok, reason = lpips_available(net)
    if not ok:
        return None, reason
    key = ("lpips", net, backbone_path(net))
    if key in _failed:  # tried once in this process: not reloaded for every row
        return None, _failed[key]
    try:
        return get_lpips(net), reason
    except Exception as exc:  # a file that is not the torchvision trunk: no LPIPS, never a random trunk
        _failed[key] = f"LPIPS unavailable: backbone weights {key[2]} do not load ({_first_line(exc)})"
        return None, _failed[key]


def state_once(reason: str) -> str | None:
    """`reason` the first time this process asks, None afterwards (a reason is stated once)."""
    with _lock:
        if reason in _stated:
            return None
        _stated.add(reason)
        return reason


# ST-LPIPS (Ghildyal & Liu, ECCV 2022): shift-tolerant LPIPS. The `stlpips-pytorch` wheel ships its whole
# network (anti-aliased AlexNet / VGG trunk and linear heads, trained by the authors), so it works
# offline. It is its own metric, reported in its own `st_lpips` column, never as LPIPS. The wheel
# imports `IPython` and `torchsummary` without declaring them; the `stlpips` extra installs both.
STLPIPS_PACKAGE = "stlpips_pytorch"
STLPIPS_VARIANT = "shift_tolerant"
_st_cache: dict[str, Any] = {}


def stlpips_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec(STLPIPS_PACKAGE) is not None


def _build_st(net: str) -> Any:
    """The ST-LPIPS module with the weights the wheel ships, loaded strictly (every tensor checked)."""
    import inspect

    import torch

    from fedbench._compat import import_torchvision

    import_torchvision()  # stlpips imports torchvision at module level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from stlpips_pytorch import stlpips

        model = stlpips.LPIPS(net=net, variant=STLPIPS_VARIANT, pretrained=False, verbose=False)
    folder = os.path.join(os.path.dirname(inspect.getfile(stlpips)), "weights", "vST0.0")
    path = os.path.join(folder, f"{net}_{STLPIPS_VARIANT}.pth")
    state = torch.load(path, map_location="cpu", weights_only=True)
    result = model.load_state_dict(state, strict=False)
    # `lins` is a ModuleList of the same lin0..linK modules, so its names are aliases, loaded through them
    missing = [k for k in result.missing_keys if not k.startswith("lins.")]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"ST-LPIPS weights {path} do not fit the network: missing {missing[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}"
        )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _distance_fn(model: Any, label: str, device: Any, batch_size: int) -> LpipsFn:
    """Per-image distances of a loaded (ST-)LPIPS network: inputs prepared alike, scored in batches."""

    def distance(true: Any, rec: Any) -> np.ndarray:
        import torch

        a, b = _as_tensor(true), _as_tensor(rec)
        if a.shape != b.shape:
            raise ValueError(f"{label} inputs differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
        a, b = _prepare(a, "true"), _prepare(b, "rec")
        out = []
        m = model.to(device)
        with torch.no_grad():
            for i in range(0, a.shape[0], batch_size):
                d = m(a[i : i + batch_size].to(device), b[i : i + batch_size].to(device))
                out.append(d.reshape(-1).double().cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float64)

    return distance


def get_st_lpips(net: str = "alex", device: Any = "cpu", batch_size: int = 64) -> LpipsFn | None:
    """A per-image ST-LPIPS distance function (same inputs and outputs as `get_lpips`), or None when
    `stlpips-pytorch` is not installed. Images are prepared like LPIPS's (grayscale repeated to RGB,
    shorter side upsampled to 32 px); raises when the package is installed but cannot be loaded."""
    if not stlpips_installed():
        return None
    with _lock:
        if net not in _st_cache:
            _st_cache[net] = _build_st(net)
        model = _st_cache[net]

    return _distance_fn(model, "ST-LPIPS", device, batch_size)


def run_st_lpips(net: str = "alex") -> tuple[LpipsFn | None, str | None]:
    """(ST-LPIPS function, reason) for scoring runs: (None, None) when the optional package is not
    installed (the column is simply absent), (None, reason) when it is installed but fails to load."""
    key = ("st_lpips", net)
    if key in _failed:
        return None, _failed[key]
    try:
        return get_st_lpips(net), None
    except Exception as exc:
        _failed[key] = f"ST-LPIPS unavailable: {_first_line(exc)} (pip install 'fedbench[stlpips]')"
        return None, _failed[key]

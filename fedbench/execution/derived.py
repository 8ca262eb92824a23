"""A run's derived columns (epsilon and the privacy metrics), stored by what they are computed from.

The runner computes a row's formal guarantee and its attack's scores from the cached run, outside the
run cache, so that a fixed metric or accountant reaches every row without re-running (design §5,
`fedbench.execution.sources`). On a fully cached re-run that was most of the work: the quickstart
re-scored its 36 cached reconstructions (1.3 s), loading the dataset for the re-identification pools
and importing torch and scipy, each time, though nothing had changed. So the derived values are stored
as well (`RunCache.derived`), under a key naming everything they are computed from:

- `run`: the run's key (its parameters and plugin versions);
- `inputs`: a digest of the cached values they read (the attack result, the training-set size of the
  utility run): a run recomputed under the same key (`--force`, a damaged entry, another thread count)
  is scored again;
- `code`: `fedbench.execution.sources.derived_digest`, the code that computes them (the run's plugins,
  every module of `fedbench.metrics`, the runner's `_derived` and what it uses): an edited metric or
  accountant re-scores every row at once, as before;
- `environment`: what else the values depend on: the versions of the packages the metrics and the
  accountants call, and which LPIPS backbone weights are present (placing them fills the LPIPS column).

A hit reads one small entry and imports nothing heavy. The key is computed without torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from functools import cache
from typing import Any

import numpy as np

#: Packages whose version can change a metric or an accountant's value.
PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "opacus", "lpips")


def derived_key(run_key: str, spec: Any, utility: dict[str, Any], result: dict[str, Any] | None) -> str:
    """The cache key of a run's derived columns (see the module docstring); canonical JSON."""
    from fedbench.execution.sources import derived_digest
    from fedbench.spec.run import canonical_json

    inputs = {
        "n_train": utility.get("n_train"),
        "result": content_digest(result) if result is not None else None,
    }
    return canonical_json(
        {
            "run": run_key,
            "inputs": inputs,
            "code": derived_digest(spec, attack=result is not None),
            "environment": environment(),
        }
    )


def content_digest(value: Any) -> str:
    """A digest of a cached value's content: the same for the value as computed and as read back from the
    cache (an array by its dtype, shape and values, whatever its memory layout; a dict by its items in
    key order; a set by its sorted items), so a run scored right after computing it and re-run later
    finds its derived columns."""
    h = hashlib.blake2b(digest_size=16)

    def feed(v: Any) -> None:
        if isinstance(v, np.ndarray):
            h.update(f"array {v.dtype.str} {v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes() if v.dtype != object else repr(v.tolist()).encode())
        elif isinstance(v, dict):
            h.update(f"dict {len(v)}".encode())
            for k in sorted(v, key=repr):
                feed(k)
                feed(v[k])
        elif isinstance(v, list | tuple):
            h.update(f"{type(v).__name__} {len(v)}".encode())
            for item in v:
                feed(item)
        elif isinstance(v, set | frozenset):
            feed(sorted(v, key=repr))
        else:  # numbers, strings, None, numpy scalars: by type and repr (floats round-trip exactly)
            h.update(f"{type(v).__name__} {v!r}".encode())

    feed(value)
    return h.hexdigest()


@cache
def environment() -> dict[str, Any]:
    """The package versions (`PACKAGES`; None when not installed) and the LPIPS backbone weight files
    present (`fedbench.metrics.lpips_metric.BACKBONE_FILES`), read once per process."""
    from fedbench.metrics.lpips_metric import BACKBONE_FILES

    versions = package_versions(PACKAGES)
    checkpoints = os.path.join(torch_hub_dir(), "checkpoints")
    present = sorted(f for f in BACKBONE_FILES.values() if os.path.isfile(os.path.join(checkpoints, f)))
    return {
        "packages": versions,
        "lpips_weights": present,
        "lpips": importlib.util.find_spec("lpips") is not None,
    }


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """{package: installed version, None when not installed}, read without importing the packages."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def torch_hub_dir() -> str:
    """`torch.hub.get_dir()` in a new process, without importing torch: `$TORCH_HOME/hub`, where
    TORCH_HOME defaults to `$XDG_CACHE_HOME/torch` and that to `~/.cache/torch` (torch.hub's documented
    resolution; `torch.hub.set_dir` acts within one process only)."""
    cache_home = os.getenv("XDG_CACHE_HOME", os.path.join("~", ".cache"))
    return os.path.join(os.path.expanduser(os.getenv("TORCH_HOME", os.path.join(cache_home, "torch"))), "hub")

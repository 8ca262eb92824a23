"""Default locations: the cache directory (private to the user) and the data root.

Read at call time, never at import time, so tests and the CLI can set the environment first.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`FEDBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/fedbench`, else `~/.cache/fedbench`."""
    env = os.environ.get("FEDBENCH_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "fedbench"


def default_data_root() -> Path | None:
    """`FEDBENCH_DATA_ROOT` when set, else None (only shipped datasets are available)."""
    env = os.environ.get("FEDBENCH_DATA_ROOT")
    return Path(env).expanduser() if env else None


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) readable only by the user: the cache holds pickles."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    return path

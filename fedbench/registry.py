"""Plugin registries: registration by decorator, lookup by name or alias, patterns, plugin loading.

There is one `Registry` per plugin kind (datasets, models, defenses, attacks). Built-in plugins are
imported explicitly by `load_builtins`; third-party plugins come from the `fedbench.plugins` entry
point group or from a file given with `--plugin path.py` (the only way fedbench loads code from a
path). A plugin module that fails to import is recorded as unavailable with its error; it never
breaks `fedbench list`.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from fedbench.errors import FedbenchError, UnknownNameError, did_you_mean

T = TypeVar("T")

_BUILTIN_MODULES = (
    "fedbench.data.shipped",
    "fedbench.data.adult",
    "fedbench.data.local",
    "fedbench.data.audio_mnist",
    "fedbench.models.mlp",
    "fedbench.models.convnets",
    "fedbench.models.resnet",
    "fedbench.models.vgg",
    "fedbench.models.imprint",
    "fedbench.defenses.basic",
    "fedbench.defenses.dp",
    "fedbench.defenses.sparsification",
    "fedbench.defenses.fed_dp",
    "fedbench.defenses.soteria",
    "fedbench.defenses.frl",
    "fedbench.defenses.dp_calibrated",
    "fedbench.defenses.loda",
    "fedbench.defenses.mixup",
    "fedbench.defenses.gradient_pruning",
    "fedbench.attacks.gradient_matching",
    "fedbench.attacks.inverting_gradients",
    "fedbench.attacks.adaptive",
    "fedbench.attacks.adaptive_heuristic",
    "fedbench.attacks.noise_aware",
    "fedbench.attacks.frl_adaptive",
    "fedbench.attacks.fc_leakage",
    "fedbench.attacks.fedavg_leakage",
    "fedbench.attacks.sdan",
    "fedbench.attacks.rtf",
    "fedbench.attacks.attribute_inference",
    "fedbench.defenses.recup",
    "fedbench.attacks.membership",
    "fedbench.attacks.lira",
    "fedbench.attacks.lira_online",
    "fedbench.attacks.rmia",
)
ENTRY_POINT_GROUP = "fedbench.plugins"


@dataclass(frozen=True)
class Unavailable:
    """A plugin source (module, entry point or file) that failed to load, with its error."""

    source: str
    error: str


class Registry(Generic[T]):
    """Name -> plugin class for one kind, with aliases, fnmatch patterns and did-you-mean errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, type[T]] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *aliases: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: `@register_defense("dp-gaussian", "dpg")`."""

        def deco(cls: type[T]) -> type[T]:
            for key in (name, *aliases):
                if key in self._items or key in self._aliases:
                    existing = self._aliases.get(key, key)
                    if self._items.get(existing) is not cls:
                        raise ValueError(f"{self.kind} name or alias '{key}' is already registered")
            cls.name = name  # type: ignore[attr-defined]
            cls.aliases = tuple(aliases)  # type: ignore[attr-defined]
            self._items[name] = cls
            for alias in aliases:
                self._aliases[alias] = name
            return cls

        return deco

    def canonical(self, name: str) -> str:
        """The canonical name for a name or alias; UnknownNameError with a suggestion otherwise."""
        load_builtins()
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        candidates = list(self._items) + list(self._aliases)
        more = did_you_mean(name, candidates, cutoff=0.5)
        listing = f"run 'fedbench list {self.kind}s' to see all"
        bad = _unavailable_for(name)
        if bad:
            listing = f"{bad.source} failed to load: {bad.error}; fix it, then run again"
        raise UnknownNameError(f"unknown {self.kind} '{name}'; {more}({listing})")

    def get(self, name: str) -> type[T]:
        return self._items[self.canonical(name)]

    def __contains__(self, name: str) -> bool:
        load_builtins()
        return name in self._items or name in self._aliases

    def names(self) -> list[str]:
        load_builtins()
        return sorted(self._items)

    def list(self, pattern: str | None = None) -> list[type[T]]:
        """Plugins whose name or an alias matches the fnmatch `pattern` (all when None)."""
        load_builtins()
        out = []
        for name in sorted(self._items):
            cls = self._items[name]
            keys = (name, *getattr(cls, "aliases", ()))
            if pattern is None or any(fnmatch.fnmatchcase(k, pattern) for k in keys):
                out.append(cls)
        return out

    def unregister(self, name: str) -> None:
        """Remove a plugin (used by tests that register temporary plugins)."""
        cls = self._items.pop(name, None)
        for alias in getattr(cls, "aliases", ()):
            self._aliases.pop(alias, None)


datasets: Registry = Registry("dataset")
models: Registry = Registry("model")
defenses: Registry = Registry("defense")
attacks: Registry = Registry("attack")
REGISTRIES: dict[str, Registry] = {
    "dataset": datasets,
    "model": models,
    "defense": defenses,
    "attack": attacks,
}

register_dataset = datasets.register
register_model = models.register
register_defense = defenses.register
register_attack = attacks.register

_unavailable: list[Unavailable] = []
_loaded = False


def registry_for(kind: str) -> Registry:
    """The registry of a kind, accepting plurals ('defenses')."""
    key = kind[:-1] if kind.endswith("s") and kind[:-1] in REGISTRIES else kind
    if key not in REGISTRIES:
        more = did_you_mean(key, list(REGISTRIES), prefix="; ", suffix="")
        raise UnknownNameError(f"unknown plugin kind '{kind}'{more} (kinds: {', '.join(REGISTRIES)})")
    return REGISTRIES[key]


def unavailable() -> list[Unavailable]:
    """Plugin sources that failed to import, with their errors."""
    load_builtins()
    return list(_unavailable)


def _unavailable_for(name: str) -> Unavailable | None:
    """The failed source that most likely held `name`: one named after it, else a `--plugin` file whose
    text mentions it in quotes (a syntax error registers nothing, but the name is still in the file)."""
    for item in _unavailable:
        if item.source.endswith(name) or name in item.source:
            return item
    for item in _unavailable:
        if item.source.startswith(_PLUGIN_FILE) and _mentions(item.source[len(_PLUGIN_FILE) :], name):
            return item
    return None


def _mentions(path: str, name: str) -> bool:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return f"'{name}'" in text or f'"{name}"' in text


def _short_error(exc: BaseException, path: str | Path | None = None) -> str:
    """The last line of the error, and for a plugin file the line of that file where it was raised."""
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    if path is not None:
        here = str(Path(path).resolve())
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == here]
        if lines and lines[-1]:
            return f"{last} (line {lines[-1]})"
    return last


def load_builtins() -> None:
    """Import the built-in plugin modules and the entry-point plugins once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a broken plugin is listed, never fatal
            _unavailable.append(Unavailable(module, _short_error(exc)))
    _load_entry_points()


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as exc:
            _unavailable.append(Unavailable(f"entry point {ep.name} ({ep.value})", _short_error(exc)))


_PLUGIN_FILE = "plugin file "


def load_plugin_file(path: str | Path) -> Unavailable | None:
    """Import a plugin file given with `--plugin`; its decorators register its plugins.

    A missing file is a usage error; a file that fails to import (a syntax error, an exception, a name
    registered twice) is recorded as unavailable and returned, so the caller can say once which file
    failed and why, and the rest of fedbench keeps working (`fedbench list` lists it). What the file
    registered before it failed is unregistered: its plugins are all unavailable, never half of them, and
    a grid that uses one fails with an unknown-name error naming the file (`_unavailable_for`).
    """
    load_builtins()
    path = Path(path)
    if not path.is_file():
        raise FedbenchError(f"--plugin {path}: no such file; pass the path of a Python file")
    mod_name = f"fedbench_plugin_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    if mod_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise FedbenchError(f"--plugin {path}: not a Python file; pass a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    before = {kind: set(reg._items) for kind, reg in REGISTRIES.items()}
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        for kind, reg in REGISTRIES.items():
            for name in set(reg._items) - before[kind]:
                reg.unregister(name)
        failed = Unavailable(f"{_PLUGIN_FILE}{path}", _short_error(exc, path))
        if failed not in _unavailable:
            _unavailable.append(failed)
        return failed
    return None

"""Source digests: what a cached result was computed with, so that edited code is never served.

A cached run is keyed by its parameters and its plugins' `version` strings (the `run_id`), so editing
code without bumping a `version` would serve the old result. Each run entry therefore stores `code`, the
digests of the code that computed it (`code_digests`), and the cache refuses an entry whose digests
differ from the code loaded now: it recomputes it and says so in one warning line naming what changed
(`fedbench.execution.cache`; `fedbench cache prune --stale` deletes such entries). The digests are not
part of the `run_id`, so run ids (and the leaderboards and READMEs that cite them) stay stable across
edits.

Plugins. A plugin's digest covers the module that defines its class and the modules of its base
classes, and, transitively, every module they import from fedbench's plugin packages (`SCOPE`: attacks,
defenses, models, data, fl, metrics), wherever in the module the import sits. A plugin loaded from a file
(`--plugin path.py`) or an entry point is covered the same way: its own module and the fedbench modules
it imports (its imports of other packages are not followed).

The engine. The numbers an entry records are also computed by code no plugin names: the FL simulation,
the observation path, per-example gradients and ghost clipping, client partitioning, the plugin base
classes' default hooks, and the runner's cached compute functions. An edit there (a server step that
applies 0 x the update) changes every result, so each entry also stores `code["engine"]`
(`engine_digests`), the digests of:
- every module of `fedbench.fl` (`ENGINE_PACKAGES`: simulation, per_example, ghost, losses, seeding),
  imported or not;
- the definitions of `fedbench.execution.runner` that run inside the cache (`ENGINE_ROOTS`: the entry's
  compute function, and `Job` and `Components`, whose methods it reaches through its argument), and,
  followed by name, the definitions of the runner or of another framework module that their code uses
  (`resolve_device`; `fedbench.spec.run.training_scenario`, what the utility run trains on): only
  these, so editing the grid scheduler, the CLI or the accountant call (`runner._accounting`) keeps the
  cache;
- the modules these import from `ENGINE_SCOPE` (the plugin packages and `fedbench.plugin`), whole and
  transitively: `fedbench.data` (dataset loading), `fedbench.data.partition` (client partitioning),
  `fedbench.plugin` (the base classes' default hooks, `DatasetBundle.denormalize`), `fedbench.fl.*`.
The utility entry and the attack entry each have their own (`compute_utility` or `compute_attack`), so
an edit of the attack path keeps the cached trainings. Left out (`NOT_ENGINE`): this module (the digests
it stores are not results) and `fedbench.errors` (a run that raises is never cached).

Outside the cache, so never a reason to recompute: privacy metrics (`fedbench.metrics.attack_metrics`,
called by the runner on the cached attack output) and epsilon (`runner._accounting`, from the defense's
parameters, the scenario and the cached training-set size). A row always shows what the metric and
accounting code loaded now give, computed from the cached result. A metric or accountant module that a
plugin imports is in that plugin's digest all the same (a DP defense that calibrates its noise with the
accountant computes inside the cache). Those derived columns are stored too, apart from the run entries
(`fedbench.execution.derived`), keyed by `derived_digest`, the digest of the code that computes them: a
fully cached re-run reads them instead of re-scoring, and an edit of a metric or accountant, whose
digest changes, re-scores every row at once as before.

Entries from before a digest was stored have none and are served: entries from before digests at all
(no `code`), and entries from before the engine digest (no `code["engine"]`): a cache filled by an
earlier fedbench stays usable (`--force` or `cache clear` recompute them).

Each module (or definition) is hashed from its compiled code without line numbers (docstrings dropped),
so comments, blank lines, formatting and docstrings do not count (a digest is specific to the Python
minor version); the digest of a module is computed once per process, from the file as it was when first
needed (the code that runs; the cache reads it before it computes a run).
"""

from __future__ import annotations

import ast
import hashlib
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCOPE = (
    "fedbench.attacks",
    "fedbench.defenses",
    "fedbench.models",
    "fedbench.data",
    "fedbench.fl",
    "fedbench.metrics",
)
# Where the engine's module closure goes: the plugin packages and the base classes of `fedbench.plugin`.
ENGINE_SCOPE = (*SCOPE, "fedbench.plugin")
ENGINE_PACKAGES = ("fedbench.fl",)  # every module of these folders is in every engine digest
RUNNER = "fedbench.execution.runner"
# The runner's definitions that run inside each cached computation. `Job` and `Components` are reached
# through the compute function's argument (`job.parts`, `job.bundle()`), which names do not show.
ENGINE_ROOTS = {
    "utility": ("compute_utility", "Job", "Components"),
    "attack": ("compute_attack", "Job", "Components"),
}
# Framework modules whose definitions are never followed: the digests this module stores are not
# results, and an exception class cannot change a cached number (a run that raises is never cached).
NOT_ENGINE = ("fedbench.execution.sources", "fedbench.errors")
# Edits that provably return what the old code returned wherever the old code returned at all, declared
# one by one with the reason: {module: {sha256 of its code now: sha256 of the code it replaces}}. The
# module then digests as the code it replaces, so cached entries of that code stay served (a fix of a
# path that raised must not recompute hours of board runs it never touched). A declaration is keyed by
# the exact code now: any further edit of the module digests anew (and `tests/test_sources.py` fails
# until the stale declaration is removed). `fedbench leaderboard verify` re-runs a board's sample with
# the code now and compares every number: the check that a declaration is true.
EQUIVALENT_EDITS: dict[str, dict[str, str]] = {
    # (the grouped L-BFGS fix of fedbench.attacks._victims was declared here until issue 29 edited the
    # module again: its entries are recomputed with the rest of the attack cache)
}
# What computes a row's derived columns outside the cache (epsilon, the privacy metrics: `runner._derived`,
# stored by `fedbench.execution.derived`): the runner's definitions it uses, and every metric module.
DERIVED_ROOTS = ("_derived",)
DERIVED_PACKAGES = ("fedbench.metrics",)

_ROOT = Path(__file__).resolve().parent.parent  # the fedbench package folder
_lock = threading.RLock()  # re-entrant: the engine digest takes module closures under it
_modules: dict[str, tuple[str, frozenset[str]] | None] = {}  # name -> (digest, fedbench imports)
_plugins: dict[Any, str] = {}  # plugin class -> digest of its code
_definitions: dict[str, _Definitions | None] = {}  # framework module -> its top-level definitions
_engine: dict[str, dict[str, str]] = {}  # "utility" | "attack" -> engine_digests
_derived: dict[str, str] = {}  # "code" -> the digest of the derived columns' framework code


def _in_scope(name: str, scope: tuple[str, ...] = SCOPE) -> bool:
    return any(name == p or name.startswith(p + ".") for p in scope)


def _source_file(name: str) -> Path | None:
    """The .py file of module `name`, found without importing anything: fedbench's own modules from its
    package folder, any other (a plugin file, an entry point's module) from the loaded module."""
    if name == "fedbench" or name.startswith("fedbench."):
        base = _ROOT.joinpath(*name.split(".")[1:])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None  # a name imported from a module, not a module
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file) if file and str(file).endswith(".py") else None


def _imports_and_strip_docstrings(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Every module `tree` imports (absolute names; `from a import b` gives `a` and `a.b`); drops the
    docstrings from `tree` on the way (one pass: this runs for every module a plugin uses)."""
    out: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _imported_module(node, package)
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.copy_location(ast.Pass(), body[0])]
    return out


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """`tree` and every statement nested in it (imports and docstrings are statements; expressions,
    most of a tree, are not visited)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                todo.extend(c for c in children if isinstance(c, ast.AST))


def _code_digest(tree: ast.Module) -> str:
    """sha256 of what the module's code does: its compiled bytecode, names and constants, without line
    numbers (comments, blank lines and formatting do not count) and with sets of constants sorted (their
    order follows the per-process string hash). Much faster than hashing `ast.dump`."""
    parts: list[bytes] = []

    def const(c: Any) -> None:
        if isinstance(c, types.CodeType):
            parts.append(c.co_code)
            meta = (c.co_name, c.co_argcount, c.co_posonlyargcount, c.co_kwonlyargcount, c.co_flags)
            parts.append(repr((meta, c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars)).encode())
            for x in c.co_consts:
                const(x)
            parts.append(b"}")
        elif isinstance(c, tuple):
            parts.append(b"(")
            for x in c:
                const(x)
            parts.append(b")")
        elif isinstance(c, frozenset):
            parts.append(repr(sorted(repr(x) for x in c)).encode())
        else:
            parts.append(f"{type(c).__name__}:{c!r};".encode())

    const(compile(tree, "<plugin>", "exec", dont_inherit=True))
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _module(name: str) -> tuple[str, frozenset[str]] | None:
    """(digest of the module's code, the fedbench modules it imports), once per process."""
    if name in _modules:
        return _modules[name]
    info = _read_module(name)
    if info is not None:
        info = (declared_digest(name, info[0]), info[1])
    _modules[name] = info
    return info


def _read_module(name: str) -> tuple[str, frozenset[str]] | None:
    """(digest of the module's code as it is on disk, before any declaration; the fedbench modules it
    imports), or None without a source file. An unparsable file digests by its bytes."""
    path = _source_file(name)
    if path is None:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        raw = path.read_bytes() if path.is_file() else b"missing"
        return hashlib.sha256(raw).hexdigest(), frozenset()
    imports = _imports_and_strip_docstrings(tree, name, path.name == "__init__.py")
    return _code_digest(tree), frozenset(m for m in imports if m.startswith("fedbench."))


def declared_digest(name: str, digest: str) -> str:
    """The digest module `name` counts under: that of the code an `EQUIVALENT_EDITS` declaration says
    its code `digest` replaces, else `digest` itself."""
    return EQUIVALENT_EDITS.get(name, {}).get(digest, digest)


def code_now(name: str) -> str | None:
    """sha256 of module `name`'s code as it is on disk, before any declaration (what a declaration is
    keyed by); None for a module without a source file."""
    info = _read_module(name)
    return None if info is None else info[0]


def module_closure(roots: list[str], scope: tuple[str, ...] = SCOPE) -> dict[str, str]:
    """{module: digest} of `roots` and, transitively, the modules they import within `scope`."""
    with _lock:
        seen: dict[str, str] = {}
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            info = _module(name)
            if info is None:
                continue
            seen[name] = info[0]
            todo.extend(m for m in info[1] if m not in seen and _in_scope(m, scope))
        return seen


def combine(files: dict[str, str]) -> str:
    """16 hex digits for a set of modules' digests. A module outside fedbench counts by its code only:
    a `--plugin` file's module name carries a per-process hash, which must not change the digest."""
    lines = sorted(f"{m if m.startswith('fedbench.') else '-'} {d}" for m, d in files.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def plugin_digest(cls: type) -> str:
    """16 hex digits identifying the code of plugin class `cls` (see the module docstring)."""
    with _lock:
        cached = _plugins.get(cls)
    if cached is not None:
        return cached
    roots = []
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module == cls.__module__ or _in_scope(module):
            roots.append(module)
    digest = combine(module_closure(roots))
    with _lock:
        _plugins[cls] = digest
    return digest


def code_digests(spec: Any, attack: bool) -> dict[str, Any]:
    """What a run's cache entry stores as `code`: {kind: digest} of the plugins it depends on (dataset,
    model, defense, and the attack when `attack`: the utility entry does not run the attack), and
    `engine`, {module or module:definition: digest} of the engine code its computation runs
    (`engine_digests`)."""
    from fedbench.registry import registry_for

    parts = [spec.dataset, spec.model, spec.defense] + ([spec.attack] if attack and spec.attack else [])
    out: dict[str, Any] = {c.kind: plugin_digest(registry_for(c.kind).get(c.name)) for c in parts}
    out["engine"] = dict(engine_digests("attack" if attack else "utility"))  # the caller's own copy
    return out


def changed_code(spec: Any, stored: Any, attack: bool) -> str | None:
    """What changed in the code of a run entry that stored `stored` as its `code`, in words ("defense
    'dp-gaussian' and the engine (fedbench.fl.simulation)"), or None when nothing did.

    Only what the entry recorded is compared: an entry from before digests (no `code`) or from before
    the engine digest (no `engine`) is served, as the module docstring says.
    """
    if not isinstance(stored, dict):
        return None
    now = code_digests(spec, attack)
    parts = [
        f"{kind} '{getattr(spec, kind).name}'"
        for kind in now
        if kind != "engine" and stored.get(kind) != now[kind]
    ]
    engine = stored.get("engine")
    if isinstance(engine, dict):
        modules = sorted(
            m for m in engine.keys() | now["engine"].keys() if engine.get(m) != now["engine"].get(m)
        )
        if modules:
            shown = ", ".join(modules[:3]) + (f" and {len(modules) - 3} more" if len(modules) > 3 else "")
            parts.append(f"the engine ({shown})")
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts) or None


# ------------------------------------------------------------------------------------------ the engine


@dataclass(frozen=True)
class _Definitions:
    """A framework module's top-level definitions: {name: statements binding it} (docstrings dropped)
    and {local name: what it imports (a module, or module.name)}."""

    statements: dict[str, list[ast.stmt]]
    imports: dict[str, str]


def engine_digests(kind: str) -> dict[str, str]:
    """{name: 16 hex digits} of the engine code that a `kind` ("utility" | "attack") entry's computation
    runs (see the module docstring): modules by name, runner and other framework definitions as
    `module:definition`. Computed once per process."""
    with _lock:
        cached = _engine.get(kind)
        if cached is not None:
            return cached
        roots = [m for package in ENGINE_PACKAGES for m in _package_modules(package)]
        digests, modules = _definition_closure(RUNNER, ENGINE_ROOTS[kind])
        roots.extend(modules)
        digests.update({m: d[:16] for m, d in module_closure(roots, ENGINE_SCOPE).items()})
        _engine[kind] = digests
        return digests


def derived_digest(spec: Any, attack: bool) -> str:
    """16 hex digits identifying the code that computes a run's derived columns from its cached values
    (`fedbench.execution.derived`): the run's plugins (`code_digests`, as its entries store them: a
    defense's `accounting`, an attack's scorer), every module of `DERIVED_PACKAGES` (the metrics, their
    catalogue and the accountants) and the runner's `DERIVED_ROOTS` with what they use, followed as the
    engine's are. Editing any of them gives another digest, so cached derived values are recomputed."""
    with _lock:
        framework = _derived.get("code")
        if framework is None:
            roots = [m for package in DERIVED_PACKAGES for m in _package_modules(package)]
            digests, modules = _definition_closure(RUNNER, DERIVED_ROOTS)
            digests.update(module_closure(roots + modules, ENGINE_SCOPE))
            framework = _derived["code"] = combine(digests)
    plugins = {k: v for k, v in code_digests(spec, attack).items() if k != "engine"}
    parts = {"fedbench.derived": framework, **{f"fedbench.plugin:{k}": d for k, d in plugins.items()}}
    return combine(parts)


def _package_modules(package: str) -> list[str]:
    """The package and every module in its folder (sorted), without importing them."""
    folder = _ROOT.joinpath(*package.split(".")[1:])
    return [package] + [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]


def _definition_closure(module: str, names: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """({module:definition: digest}, modules to follow) for definitions `names` of framework `module` and,
    transitively, the definitions their code uses by name: of that module, and of other framework
    modules it imports them from. A name imported from a module of `ENGINE_SCOPE` (or a module itself)
    gives that module instead, hashed whole. A root that does not exist (renamed) hashes its module whole.
    """
    digests: dict[str, str] = {}
    modules: list[str] = []
    todo = [(module, name) for name in names]
    seen: set[tuple[str, str]] = set()
    while todo:
        where, name = todo.pop()
        if (where, name) in seen:
            continue
        seen.add((where, name))
        defs = _module_definitions(where)
        statements = defs.statements.get(name) if defs is not None else None
        if not statements:
            if where == module and name in names:  # a root went missing: be safe, take the whole module
                modules.append(where)
            continue
        tree = ast.Module(body=statements, type_ignores=[])
        digests[f"{where}:{name}"] = _code_digest(tree)[:16]
        local = dict(defs.imports)
        for node in statements:  # imports inside the definition (a function-level import)
            local.update(_import_names(node, where, is_package=False))
        for used in _code_names(tree):
            if used in defs.statements and used not in local:
                todo.append((where, used))
            elif used in local:
                target = local[used]
                if not target.startswith("fedbench.") or _in_scope(target, NOT_ENGINE):
                    continue
                if _source_file(target) is not None or _in_scope(target, ENGINE_SCOPE):
                    owner = target if _source_file(target) is not None else target.rpartition(".")[0]
                    modules.append(owner)
                else:
                    owner, _, attr = target.rpartition(".")
                    todo.append((owner, attr))
    return digests, modules


def _module_definitions(name: str) -> _Definitions | None:
    """The top-level definitions of module `name` (once per process), or None without its source."""
    if name in _definitions:
        return _definitions[name]
    path = _source_file(name)
    out = None
    if path is not None:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            tree = None
        if tree is not None:
            is_package = path.name == "__init__.py"
            _imports_and_strip_docstrings(tree, name, is_package)
            statements: dict[str, list[ast.stmt]] = {}
            imports: dict[str, str] = {}
            for node in tree.body:
                imports.update(_import_names(node, name, is_package))
                for bound in _bound_names(node):
                    statements.setdefault(bound, []).append(node)
            out = _Definitions(statements, imports)
    _definitions[name] = out
    return out


def _bound_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines (a function, a class, an assignment to a name)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _imported_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a `from ... import` statement in `package` reads from."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)]) if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _import_names(node: ast.AST, module: str, is_package: bool) -> dict[str, str]:
    """{local name: module or module.name} of the imports in `node` (at any depth of its statements)."""
    out: dict[str, str] = {}
    package = module if is_package else module.rpartition(".")[0]
    for stmt in _statements(node):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:  # `import a.b.c` binds `a`; its code uses a.b.c: count a.b.c
                out[alias.asname or alias.name.partition(".")[0]] = alias.name
        elif isinstance(stmt, ast.ImportFrom):
            source = _imported_module(stmt, package)
            out.update({alias.asname or alias.name: f"{source}.{alias.name}" for alias in stmt.names})
    return out


def _code_names(tree: ast.AST) -> set[str]:
    """Every name the code of `tree` reads, annotations left out (they run nothing: postponed)."""
    out: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name):
            out.add(node.id)
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns"):
                continue
            if isinstance(value, ast.AST):
                todo.append(value)
            elif isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, ast.AST))
    return out


def forget() -> None:
    """Drop the per-process digests (tests that reload an edited plugin file, as a new process would)."""
    with _lock:
        _modules.clear()
        _plugins.clear()
        _definitions.clear()
        _engine.clear()
        _derived.clear()

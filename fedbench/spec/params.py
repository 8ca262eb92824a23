"""Typed plugin parameters: declaration, coercion from TOML/CLI values, range validation, description.

A plugin declares its parameters as a frozen dataclass whose fields are made with `param(...)`.
`build_params` turns a plain dict (from a preset or a `name[k=v]` pattern) into that dataclass,
coercing types and checking ranges, so a bad value fails before any work with a message that names
the plugin, the parameter, the bad value and the valid range.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal, get_args, get_origin

from fedbench.errors import ParamError, UnknownNameError, did_you_mean

#: `param(keyless=...)` left out: the parameter has no keyless value (a sentinel, as None may be one).
NOT_KEYLESS: Any = object()


def param(
    default: Any,
    help: str = "",
    *,
    min: float | None = None,
    max: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    allow_inf: bool = False,
    keyless: Any = NOT_KEYLESS,
) -> Any:
    """A dataclass field with a default, a help text and an optional numeric range.

    `min_open`/`max_open` make the bound exclusive: `param(0.5, min=0, max=1, min_open=True)` is (0, 1].
    A number is finite unless `allow_inf` (a parameter where infinity means something, e.g. no bound):
    `lr = inf` in a preset is a typo that would otherwise pass `validate` and fail only mid-run.

    `keyless` is the value a run key that does not name this parameter stands for: what every run had
    before the parameter existed, or before its default changed. The key leaves the parameter out at
    that value (so those runs keep their run ids) and names it at any other, the default included (so
    a changed default gets run ids of its own and is never served results of the old behaviour); a key
    without it resolves back to that value (`fedbench.spec.run`, `keyless_values`). A plugin's
    `key_optional` is the case where that value is the default.
    """
    meta = {"help": help, "min": min, "max": max, "min_open": min_open, "max_open": max_open}
    if allow_inf:
        meta["allow_inf"] = True
    if keyless is not NOT_KEYLESS:
        meta["keyless"] = keyless
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed; use a tuple")
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class NoParams:
    """A plugin without parameters."""


def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _range_text(meta: dict) -> str:
    lo, hi = meta.get("min"), meta.get("max")
    left = "(" if meta.get("min_open") else "["
    right = ")" if meta.get("max_open") else "]"
    if lo is not None and hi is not None:
        return f"{left}{lo:g}, {hi:g}{right}"
    if lo is not None:
        return f"{'>' if meta.get('min_open') else '>='} {lo:g}"
    if hi is not None:
        return f"{'<' if meta.get('max_open') else '<='} {hi:g}"
    return ""


def _coerce(owner: str, name: str, value: Any, tp: Any) -> Any:
    """Coerce one value to the declared type, or raise ParamError naming owner and parameter."""
    origin = get_origin(tp)
    bad = ParamError(f"{owner}: parameter '{name}' expects {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ParamError(
                f"{owner}: parameter '{name}' must be one of {', '.join(map(str, choices))}; got {value!r}"
            )
        return value
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        for a in args:
            try:
                return _coerce(owner, name, value, a)
            except ParamError:
                continue
        raise bad
    if origin is tuple:
        args = get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.replace(";", ",").split(",") if v.strip()] if value else []
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args else Any
        return tuple(_coerce(owner, name, v, inner) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad
    return value


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if origin is tuple:
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _check_range(owner: str, name: str, value: Any, meta: dict) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        values = value if isinstance(value, tuple) else ()
        for v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                _check_range(owner, name, v, meta)
        return
    lo, hi = meta.get("min"), meta.get("max")
    ok = True
    if lo is not None:
        ok &= value > lo if meta.get("min_open") else value >= lo
    if hi is not None:
        ok &= value < hi if meta.get("max_open") else value <= hi
    if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not meta.get("allow_inf"))):
        within = f" ({_range_text(meta)})" if _range_text(meta) else ""
        raise ParamError(f"{owner}: parameter '{name}' must be a finite number{within}; got {value!r}")
    if not ok:
        raise ParamError(f"{owner}: parameter '{name}' must be {_range_text(meta)}; got {value!r}")


def build_params(owner: str, params_cls: type, raw: dict[str, Any] | None) -> Any:
    """Make a validated `params_cls` instance from `raw`; unknown keys fail with a did-you-mean."""
    raw = dict(raw or {})
    fields = {f.name: f for f in dataclasses.fields(params_cls)}
    for key in raw:
        if key not in fields:
            known = ", ".join(fields) or "none"
            more = did_you_mean(key, list(fields))
            raise UnknownNameError(f"{owner}: unknown parameter '{key}'; {more}(parameters: {known})")
    hints = _type_hints(params_cls)
    values = {}
    for name, f in fields.items():
        if name in raw:
            value = _coerce(owner, name, raw[name], hints.get(name, Any))
        else:
            value = f.default
        _check_range(owner, name, value, dict(f.metadata))
        values[name] = value
    instance = params_cls(**values)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        problem = validate()
        if problem:
            raise ParamError(f"{owner}: {problem}")
    return instance


def is_sequence_param(params_cls: type, name: str) -> bool:
    """True when the parameter's own type is a tuple, so a list is one value, not a sweep."""
    tp = _type_hints(params_cls).get(name)
    if get_origin(tp) is typing.Union or str(get_origin(tp)) == "<class 'types.UnionType'>":
        return any(get_origin(a) is tuple for a in get_args(tp))
    return get_origin(tp) is tuple


def params_to_dict(params: Any) -> dict[str, Any]:
    """Plain JSON-able dict of a params instance (tuples become lists)."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    return {f.name: plain(getattr(params, f.name)) for f in dataclasses.fields(params)}


def keyless_values(params_cls: type) -> dict[str, Any]:
    """{name: value} of the parameters declared with `param(keyless=value)`: the value a run key that
    leaves the parameter out stands for."""
    return {f.name: f.metadata["keyless"] for f in dataclasses.fields(params_cls) if "keyless" in f.metadata}


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """One parameter as shown by `fedbench show`."""

    name: str
    type: str
    default: Any
    range: str
    help: str


def describe_params(params_cls: type) -> list[ParamInfo]:
    hints = _type_hints(params_cls)
    return [
        ParamInfo(
            name=f.name,
            type=_type_name(hints.get(f.name, Any)),
            default=f.default,
            range=_range_text(dict(f.metadata)),
            help=f.metadata.get("help", ""),
        )
        for f in dataclasses.fields(params_cls)
    ]

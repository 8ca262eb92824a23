"""User-facing error types.

Every error a user can cause by bad input (names, parameters, presets, paths) is a `FedbenchError`:
the CLI prints its one-line message and exits 2. Anything else is a bug or a run failure.
"""

from __future__ import annotations


class FedbenchError(Exception):
    """A usage or specification error; the message names the input and the fix."""

    exit_code = 2


class UnknownNameError(FedbenchError):
    """A dataset, model, defense, attack, preset or parameter name that does not exist."""


class ParamError(FedbenchError):
    """A parameter value of the wrong type or outside its valid range."""


class SpecError(FedbenchError):
    """A malformed preset, pattern or override."""


class DataError(FedbenchError):
    """A dataset that cannot be loaded as asked (missing root, bad files)."""


class RunFailure(Exception):
    """A run that failed while executing (NaN, divergence, ...). Recorded as a `failed` row."""

"""Scalar validators of the configuration boundary: one place, one message format.

Every check returns the value (coerced where the rule says so) or raises ``error`` (default
`ValidationError`, a ``ValueError``) with the one-line message ``<key.path>: expected <rule>, got
<excerpt of the value>``. The trial config, the study config and the search-space parser all use
these; declared hyperparameters of registry entries use `calibtune._registry.Param`, whose rules
are data (kind, range, choices) so that search spaces and contract tests can read them.

>>> check_int(3, "train.epochs", 1)
3
>>> check_float("5e-4", "optimizer.weight_decay", 0.0)
0.0005
>>> check_int("ten", "train.epochs", 1)
Traceback (most recent call last):
...
calibtune._validate.ValidationError: train.epochs: expected an integer >= 1, got 'ten'
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from calibtune._yaml import cut, excerpt

__all__ = [
    "ValidationError",
    "check_bool",
    "check_choice",
    "check_choices",
    "check_finite_number",
    "check_float",
    "check_int",
    "check_keys",
    "check_mapping",
    "check_str",
    "fail",
]


class ValidationError(ValueError):
    """A value that breaks its rule; the message is ``path: expected X, got Y``."""


def fail(
    path: str, expected: str, value: Any, error: type[ValueError] = ValidationError
) -> ValueError:
    """``path: expected <rule>, got <value>`` with the value cut to a short excerpt.

    >>> str(fail("seed", "an integer >= 0", -1))
    'seed: expected an integer >= 0, got -1'
    """
    return error(f"{cut(path, 100)}: expected {expected}, got {excerpt(value)}")


def check_int(v: Any, path: str, low: int | None = None, high: int | None = None) -> int:
    """An integer written as one (``2.0`` and ``1e30`` are floats: refused, never truncated).

    >>> check_int(2.0, "seed", 0)
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: seed: expected an integer >= 0, got 2.0
    """
    if high is not None:
        rule = f"an integer in [{'-inf' if low is None else low}, {high}]"
    else:
        rule = "an integer" + (f" >= {low}" if low is not None else "")
    if isinstance(v, bool) or not isinstance(v, int):
        raise fail(path, rule, v)
    if (low is not None and v < low) or (high is not None and v > high):
        raise fail(path, rule, v)
    return int(v)


def _yaml_number(v: Any) -> Any:
    """YAML 1.1 reads ``5e-4`` as a string: such a string is the number it spells."""
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return float(v)
    return v


def check_float(
    v: Any,
    path: str,
    low: float | None = None,
    low_open: bool = False,
    high: float | None = None,
    allow_inf: bool = False,
) -> float:
    """A finite number in the range (``±inf`` only with ``allow_inf``; NaN never).

    >>> check_float(0, "optimizer.lr", 0.0, low_open=True)
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: optimizer.lr: expected a number in (0, inf), got 0.0
    """
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    lb = "(" if low_open or low is None else "["
    rule = f"a number in {lb}{lo}, {hi}{')' if high is None else ']'}"
    v = _yaml_number(v)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise fail(path, rule, v)
    v = float(v)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise fail(path, rule, v)
    if low is not None and (v <= low if low_open else v < low):
        raise fail(path, rule, v)
    if high is not None and v > high:
        raise fail(path, rule, v)
    return v


def check_finite_number(
    v: Any, path: str, error: type[ValueError] = ValidationError
) -> int | float:
    """Any finite number, kept as written (an int stays an int; used for search-space bounds).

    >>> check_finite_number("1e-3", "space.lr.low")
    0.001
    """
    v = _yaml_number(v)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise error(f"{path}: expected a finite number, got {excerpt(v)}")
    return v


def check_bool(v: Any, path: str) -> bool:
    """``true``/``false`` only (no 0/1, no strings).

    >>> check_bool(1, "eval.figures")
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: eval.figures: expected a boolean (true/false), got 1
    """
    if not isinstance(v, bool):
        raise fail(path, "a boolean (true/false)", v)
    return v


def check_str(v: Any, path: str) -> str:
    """A non-empty string.

    >>> check_str("mlp", "model.name")
    'mlp'
    """
    if not isinstance(v, str) or not v:
        raise fail(path, "a non-empty string", v)
    return v


def check_choice(v: Any, path: str, choices: Sequence[str]) -> str:
    """One of ``choices``.

    >>> check_choice("sgdd", "optimizer.name", ("sgd", "adam"))
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: optimizer.name: expected one of 'sgd', 'adam', got 'sgdd'
    """
    if v not in choices:
        raise fail(path, "one of " + ", ".join(repr(c) for c in choices), v)
    return v


def check_choices(v: Any, path: str, choices: Sequence[str], what: str) -> tuple[str, ...]:
    """A list of ``what`` (e.g. "shift set names"), each one of ``choices``; the message names
    the first wrong element's index.

    >>> check_choices(["a", "c"], "data.shift", ("a", "b"), "shift set names")
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: data.shift[1]: expected one of 'a', 'b', got 'c'
    """
    if isinstance(v, str) or not isinstance(v, Sequence):
        raise fail(path, f"a list of {what}", v)
    if v and not choices:
        raise fail(path, f"[] (no {what})", v)
    return tuple(check_choice(x, f"{path}[{i}]", choices) for i, x in enumerate(v))


def check_mapping(v: Any, path: str) -> Mapping[str, Any]:
    """A mapping; ``None`` (an empty YAML section) is the empty mapping.

    >>> check_mapping(None, "train")
    {}
    """
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise fail(path or "config", "a mapping", v)
    return v


def check_keys(d: Mapping[str, Any], known: type | Sequence[str], path: str) -> None:
    """Every key of ``d`` is one of ``known`` (a dataclass's field names, or a sequence).

    >>> check_keys({"epochs": 1, "epoch": 2}, ("epochs", "seed"), "train")
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: train.epoch: unknown key; expected one of epochs, seed
    """
    names = [f.name for f in fields(known)] if isinstance(known, type) else list(known)
    for k in d:
        if k not in names:
            where = cut(f"{path}.{k}" if path else str(k))
            raise ValidationError(f"{where}: unknown key; expected one of {', '.join(names)}")

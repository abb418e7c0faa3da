"""Search spaces as data, in Optuna's vocabulary, validated against the registries.

A space maps names to either a constant or a distribution spec::

    gamma: {type: float, low: 0.5, high: 5.0, log: false}     # optuna FloatDistribution
    n_bins: {type: int, low: 5, high: 30, step: 5}             # optuna IntDistribution
    update_every: {type: categorical, choices: [epoch, 50]}    # optuna CategoricalDistribution
    lam: 1.0                                                   # fixed value

Distributions are built by Optuna's own constructors (so their messages reach the user) and checked
against the declared `Param` ranges of the loss registry (loss spaces) or against the trial-config
validator (spaces over trial-config keys such as ``optimizer.lr`` or ``eval.n_bins``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from calibtune._registry import Param, resolve_params
from calibtune._validate import check_finite_number
from calibtune._yaml import YamlError, YamlSyntaxError, cut, excerpt, load_file


def _losses() -> Any:
    """The loss registry (`calibtune.losses`), for checking a loss search space against its loss."""
    # deferred: torch; reading a study's head (compare/report/export) never checks its spaces
    from calibtune import losses

    return losses


SPEC_KEYS = {
    "float": {"type", "low", "high", "step", "log"},
    "int": {"type", "low", "high", "step", "log"},
    "categorical": {"type", "choices"},
}


class SpaceError(ValueError):
    """A search-space problem; the message names the file/key path and the broken rule."""


@dataclass(frozen=True)
class Space:
    """A validated space: ``dists`` are sampled, ``fixed`` are constants (both keyed by name)."""

    dists: Mapping[str, BaseDistribution]
    fixed: Mapping[str, Any]


def _number(v: Any, where: str, what: str) -> float:
    return check_finite_number(v, f"{where}.{what}", error=SpaceError)


def _check_step(low: float, high: float, step: float | None, where: str) -> None:
    """Optuna only warns when ``step`` does not divide ``high - low`` (and then never samples
    ``high``); a study file saying so is a mistake."""
    if step is None or step <= 0 or high < low:
        return  # Optuna's own constructor explains these
    n = (high - low) / step
    if abs(n - round(n)) > 1e-9 * max(1.0, abs(n)):
        raise SpaceError(
            f"{where}.step: expected a step that divides high - low ({high - low:g}), got {step:g}"
        )


def build_distribution(spec: Mapping[str, Any], where: str) -> BaseDistribution:
    """Turn ``{type: float|int|categorical, ...}`` into an Optuna distribution."""
    kind = spec.get("type")
    if kind not in SPEC_KEYS:
        raise SpaceError(
            f"{where}.type: expected one of float, int, categorical, got {excerpt(kind)}"
        )
    unknown = sorted(set(spec) - SPEC_KEYS[kind])
    if unknown:
        raise SpaceError(
            f"{where}.{unknown[0]}: unknown key for a {kind} distribution; expected one of "
            + ", ".join(sorted(SPEC_KEYS[kind]))
        )
    try:
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list):
                raise SpaceError(f"{where}.choices: expected a list, got {excerpt(choices)}")
            return CategoricalDistribution([encode(c) for c in choices])
        for key in ("low", "high"):
            if key not in spec:
                raise SpaceError(f"{where}.{key}: expected a number, got nothing")
        low, high = _number(spec["low"], where, "low"), _number(spec["high"], where, "high")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise SpaceError(f"{where}.log: expected true or false, got {excerpt(log)}")
        step = spec.get("step")
        if step is not None:
            step = _number(step, where, "step")
        _check_step(low, high, step, where)
        if kind == "float":
            return FloatDistribution(float(low), float(high), log=log, step=step)
        for key, v in (("low", low), ("high", high), ("step", step)):
            if v is not None and float(v) != int(v):
                raise SpaceError(f"{where}.{key}: expected an integer, got {excerpt(v)}")
        return IntDistribution(int(low), int(high), log=log, step=1 if step is None else int(step))
    except SpaceError:
        raise
    except (ValueError, TypeError) as exc:  # Optuna's own constructor messages
        raise SpaceError(f"{where}: {cut(str(exc), 200)}") from None


def _check_against_param(dist: BaseDistribution, param: Param, where: str) -> None:
    if isinstance(dist, CategoricalDistribution):
        values = [decode(c) for c in dist.choices]
    elif isinstance(dist, (FloatDistribution, IntDistribution)):
        if not param.searchable:
            raise SpaceError(
                f"{where}: {param.name} cannot be searched (fix it to a value instead)"
            )
        if param.kind not in ("float", "int"):
            raise SpaceError(
                f"{where}: expected a categorical distribution for {param.describe()}, "
                f"got a {type(dist).__name__}"
            )
        if param.kind == "int" and isinstance(dist, FloatDistribution):
            raise SpaceError(f"{where}: expected type int for {param.name}, got type float")
        values = [dist.low, dist.high]
    else:  # pragma: no cover - only the three kinds above are built
        raise SpaceError(f"{where}: unsupported distribution {excerpt(dist)}")
    for v in values:
        try:
            param.validate(v)
        except ValueError:
            raise SpaceError(
                f"{where}: expected values that are {param.describe()}, got {excerpt(v)}"
            ) from None


_JSON = "json:"


def encode(value: Any) -> Any:
    """Optuna's categorical choices must be scalars: lists (e.g. an FLSD γ schedule) travel as
    ``json:[5.0, 3.0]`` strings and are decoded when the trial config is built."""
    return _JSON + json.dumps(value) if isinstance(value, (list, tuple)) else value


def decode(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_JSON):
        return json.loads(value[len(_JSON) :])
    return value


def extremes(dist: BaseDistribution) -> tuple[Any, ...]:
    """A distribution's edges: every choice of a categorical (decoded), else ``low`` and
    ``high``. A space's checks at its edges hold inside it wherever the rule is monotone."""
    if isinstance(dist, CategoricalDistribution):
        return tuple(decode(c) for c in dist.choices)
    return (dist.low, dist.high)  # type: ignore[attr-defined]


def parse_param_space(raw: Any, params: Mapping[str, Param], where: str, owner: str) -> Space:
    """Validate a mapping ``name -> constant | spec`` against declared ``params``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpaceError(f"{where}: expected a mapping of parameter names, got {excerpt(raw)}")
    dists: dict[str, BaseDistribution] = {}
    fixed: dict[str, Any] = {}
    for name, spec in raw.items():
        key = f"{where}.{name}"
        if name not in params:
            raise SpaceError(
                f"{key}: unknown parameter of {owner}; expected one of "
                + (", ".join(sorted(params)) or "(none: this loss has no hyperparameters)")
            )
        if isinstance(spec, Mapping):
            dist = build_distribution(spec, key)
            _check_against_param(dist, params[name], key)
            dists[name] = dist
        else:
            try:
                fixed[name] = params[name].validate(spec)
            except ValueError:
                raise SpaceError(
                    f"{key}: expected {params[name].describe()}, got {excerpt(spec)}"
                ) from None
    return Space(dists, fixed)


@dataclass(frozen=True)
class LossSpace:
    """A search space over one registered loss's hyperparameters (a ``search_spaces/*.yaml``),
    with the loss's declared hyperparameters (``params``, its registry entry's): a trial resolves
    its values with them (`resolve`) without importing the losses, so a process that only
    coordinates a trial's seeds never loads torch."""

    loss: str
    space: Space
    params: tuple[Param, ...]
    path: str | None = None
    description: str = ""

    def resolve(self, **values: Any) -> dict[str, Any]:
        """The loss's hyperparameters: ``values`` validated, defaults filled (`Entry.resolve`)."""
        return resolve_params(self.loss, self.params, values)


LOSS_SPACE_KEYS = ("loss", "description", "params")


def parse_loss_space(raw: Any, where: str, path: str | None = None) -> LossSpace:
    """Validate ``{loss: NAME, description: ..., params: {...}}`` against the loss registry."""
    LOSSES = _losses().LOSSES

    if not isinstance(raw, Mapping):
        raise SpaceError(
            f"{where}: not a search-space file (expected a mapping with keys loss, params, got "
            f"{'nothing' if raw is None else type(raw).__name__})"
        )
    for k in raw:
        if k not in LOSS_SPACE_KEYS:
            raise SpaceError(
                f"{where}.{k}: unknown key; expected one of {', '.join(LOSS_SPACE_KEYS)}"
            )
    name = raw.get("loss")
    if name not in LOSSES:
        raise SpaceError(
            f"{where}.loss: expected one of {', '.join(LOSSES.names())}, got {excerpt(name)}"
        )
    entry = LOSSES.get(name)
    params = {p.name: p for p in entry.params}
    space = parse_param_space(raw.get("params"), params, f"{where}.params", f"loss {excerpt(name)}")
    desc = raw.get("description", "")
    if not isinstance(desc, str):
        raise SpaceError(f"{where}.description: expected a string, got {excerpt(desc)}")
    _build_each(name, space, f"{where}.params")
    return LossSpace(name, space, entry.params, path, desc)


def _build_each(loss: str, space: Space, where: str) -> None:
    """Construct the loss at each end of every range and each categorical choice (the others
    fixed at their first value), so cross-parameter rules (e.g. FLSD thresholds vs γs, AdaFocal
    update_every) fail here rather than in a running trial."""
    build_loss = _losses().build_loss

    first = {
        n: decode(d.choices[0]) if isinstance(d, CategoricalDistribution) else d.low
        for n, d in space.dists.items()
    }
    for name, dist in space.dists.items():
        ends = (
            [decode(c) for c in dist.choices]
            if isinstance(dist, CategoricalDistribution)
            else [dist.low, dist.high]
        )
        for v in ends:
            try:
                build_loss(loss, **{**space.fixed, **first, name: v})
            except ValueError as exc:
                raise SpaceError(
                    f"{where}.{name}: {excerpt(v)} is not valid here ({cut(str(exc), 200)})"
                ) from None
    if not space.dists:
        try:
            build_loss(loss, **space.fixed)
        except ValueError as exc:
            raise SpaceError(f"{where}: {cut(str(exc), 200)}") from None


def load_yaml(path: str | Path, what: str = "search-space file") -> Any:
    """Read a YAML file through `calibtune._yaml.load_file` (size, encoding, aliases, duplicate
    keys); a file that is not YAML at all is "not a <what>" (its content is never quoted)."""
    try:
        return load_file(path, what)
    except YamlSyntaxError as exc:
        raise SpaceError(f"{path}: not a {what} ({exc.detail})") from None
    except YamlError as exc:
        raise SpaceError(str(exc)) from None


def load_loss_space(path: str | Path) -> LossSpace:
    """Read and validate one ``search_spaces/*.yaml`` file."""
    return parse_loss_space(load_yaml(path), str(path), str(path))

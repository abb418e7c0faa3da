"""The registry core every concept (loss, post-hoc method, dataset, model) is built on."""

from __future__ import annotations

import pytest

from calibtune._registry import Param, Registry


def _registry() -> Registry[tuple]:
    reg: Registry[tuple] = Registry("widget")

    @reg.register(
        "focalish",
        params=[
            Param("gamma", 1.0, "float", low=0.0),
            Param("n_bins", 15, "int", low=1),
            Param("mode", "a", "categorical", choices=("a", "b")),
            Param("gammas", (5.0, 3.0), "float_list", low=0.0, searchable=False),
        ],
    )
    def make(gamma: float, n_bins: int, mode: str, gammas: tuple) -> tuple:
        return (gamma, n_bins, mode, gammas)

    reg.add("plain", lambda: ("plain",))
    return reg


def test_build_fills_defaults_and_coerces():
    reg = _registry()
    assert reg.build("focalish") == (1.0, 15, "a", (5.0, 3.0))
    assert reg.build("focalish", gamma=2, n_bins=4.0, gammas=[1, 2]) == (2.0, 4, "a", (1.0, 2.0))
    assert reg.names() == ["focalish", "plain"]
    assert "plain" in reg and "nope" not in reg


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gamma": -1}, r"focalish: gamma: expected a number in \[0, inf\), got -1"),
        ({"gamma": "x"}, r"gamma: expected a number in \[0, inf\), got 'x'"),
        ({"gamma": float("nan")}, r"gamma: expected a number"),
        ({"gamma": True}, r"gamma: expected a number"),
        ({"n_bins": 0}, r"n_bins: expected an integer in \[1, inf\), got 0"),
        ({"n_bins": 2.5}, r"n_bins: expected an integer in \[1, inf\), got 2.5"),
        ({"mode": "c"}, r"mode: expected one of 'a', 'b', got 'c'"),
        ({"gammas": "53"}, r"gammas: expected a float list in \[0, inf\), got '53'"),
        ({"gammas": [1, -2]}, r"gammas: expected a float list"),
        ({"lam": 1}, r"focalish: unknown parameter 'lam'; expected one of gamma, gammas, mode"),
    ],
)
def test_bad_params_name_rule_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _registry().build("focalish", **kwargs)


def test_unknown_name_lists_registered_names():
    with pytest.raises(ValueError, match="unknown widget 'nope'; expected one of: focalish, plain"):
        _registry().get("nope")
    with pytest.raises(ValueError, match="already registered"):
        _registry().add("plain", lambda: ())


def test_open_bounds_and_describe():
    p = Param("s_th", 0.2, "float", low=0.0, low_open=True)
    assert p.describe() == "a number in (0, inf)"
    with pytest.raises(ValueError, match=r"s_th: expected a number in \(0, inf\), got 0"):
        p.validate(0)
    assert p.validate(1e-9) == 1e-9

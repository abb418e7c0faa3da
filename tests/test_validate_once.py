"""One validation dialect, each value validated once at its boundary, hot paths unchecked.

Counts go through the real validators (wrapped to count, never replaced): a value checked by
the registry is not checked again by the constructor it feeds, a trial config round trip checks
each value once, loss modules do not re-check their hyperparameters on forward, and metrics
skip their value checks when told the arrays were checked.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest
import torch

import calibtune
import calibtune.trial._config as trial_config
from calibtune import metrics as M
from calibtune._registry import FROM_SIGNATURE, Param, Registry, defaults_from_signature
from calibtune.losses import build_loss
from calibtune.losses import functional as F_cal
from calibtune.posthoc import POSTHOC, TemperatureScaling, build_posthoc
from calibtune.studyfile._config import parse_study
from calibtune.trial import config_from_dict, config_to_dict

PACKAGE = Path(calibtune.__file__).parent


@pytest.fixture
def param_calls(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    """Counts `Param.validate` calls by parameter name (the real method still runs)."""
    calls: collections.Counter = collections.Counter()
    real = Param.validate

    def counting(self: Param, value, owner: str = ""):
        calls[self.name] += 1
        return real(self, value, owner)

    monkeypatch.setattr(Param, "validate", counting)
    return calls


# -- no private imports across packages -------------------------------------------------------


def _private_imports_across_packages() -> list[str]:
    bad = []
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE.parent).with_suffix("").parts
        if len(rel) < 3:  # top-level modules (cli.py, ...) are adapters over every package
            continue
        own = ".".join(rel[:2])
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for m in names:
                parts = m.split(".")
                other = parts[0] == "calibtune" and len(parts) > 2 and ".".join(parts[:2]) != own
                if other and any(p.startswith("_") for p in parts[2:]):
                    bad.append(f"{'/'.join(rel)}.py:{node.lineno} imports {m}")
    return bad


def test_no_package_imports_another_packages_private_module() -> None:
    assert _private_imports_across_packages() == []


# -- post-hoc: declared once, validated once ----------------------------------------------------


def test_posthoc_defaults_come_from_the_constructor_signature() -> None:
    declared = {p.name: p.default for p in TemperatureScaling.PARAMS}
    assert declared == {
        "criterion": "ece",
        "n_bins": 15,
        "t_grid": None,
        "temperatures": None,
        "t_min": 0.01,
        "t_max": 100.0,
    }
    assert POSTHOC.get("ts").params == TemperatureScaling.PARAMS
    assert POSTHOC.get("ts_nll").defaults() == {
        "t_grid": None,
        "temperatures": None,
        "t_min": 0.01,
        "t_max": 100.0,
    }


def test_registry_build_validates_each_given_value_once(param_calls) -> None:
    method = build_posthoc("ts", n_bins=10, t_max=50.0)
    assert (method.n_bins, method.t_max) == (10, 50.0)
    assert param_calls == {"n_bins": 1, "t_max": 1}


def test_direct_constructor_still_validates_with_the_class_name(param_calls) -> None:
    TemperatureScaling(n_bins=10)
    # every non-None argument once: criterion, n_bins, t_min, t_max
    assert param_calls == {"criterion": 1, "n_bins": 1, "t_min": 1, "t_max": 1}
    with pytest.raises(ValueError, match=r"TemperatureScaling: n_bins: expected an integer in"):
        TemperatureScaling(n_bins=0)
    with pytest.raises(ValueError, match=r"^ts: n_bins: expected an integer in \[1, inf\)"):
        build_posthoc("ts", n_bins=0)


def test_cross_parameter_rules_run_on_the_registry_path_too() -> None:
    with pytest.raises(ValueError, match=r"TemperatureScaling: expected t_min < t_max"):
        build_posthoc("ts", t_min=5.0, t_max=1.0)


def test_a_default_is_written_once_or_registration_fails() -> None:
    def fit(n_bins: int = 15, loss: str = "mse", knots=None):
        return n_bins

    ps = defaults_from_signature(fit, [Param("n_bins", kind="int"), Param("loss", "nll")])
    assert [p.default for p in ps] == [15, "nll"]  # an explicit default is kept
    with pytest.raises(TypeError, match=r"fit: no default for 'lam'"):
        defaults_from_signature(fit, [Param("lam")])
    reg: Registry[int] = Registry("widget")
    with pytest.raises(TypeError, match=r"widget 'w': no default declared for 'n_bins'"):
        reg.add("w", fit, params=[Param("n_bins", FROM_SIGNATURE, kind="int")])


# -- trial config round trip and study parsing -------------------------------------------------


def test_round_trip_validates_each_value_once(param_calls, monkeypatch) -> None:
    cfg = config_from_dict({"eval": {"posthoc": {"ts": {"n_bins": 10}}}, "loss": {"name": "focal"}})
    ints: collections.Counter = collections.Counter()
    real = trial_config.check_int

    def counting(v, path, *a, **k):
        ints[path] += 1
        return real(v, path, *a, **k)

    monkeypatch.setattr(trial_config, "check_int", counting)
    param_calls.clear()
    assert config_from_dict(config_to_dict(cfg)) == cfg
    # the loss's resolved gamma and the post-hoc n_bins, each once (before: n_bins 2x and
    # TemperatureScaling's criterion/t_min/t_max once more in its constructor)
    assert param_calls == {"gamma": 1, "n_bins": 1}
    assert ints["train.epochs"] == 1 and max(ints.values()) == 1


def test_study_validates_its_base_trial_config_once(monkeypatch) -> None:
    import calibtune.trial as T

    calls = []
    real = T.config_from_dict

    def counting(d):
        calls.append(d)
        return real(d)

    monkeypatch.setattr(T, "config_from_dict", counting)
    parse_study(
        {
            "name": "s",
            "trial": {"train": {"epochs": 2}},
            "losses": ["cross_entropy"],
            "search": {"num_samples": 1, "objectives": ["val/ece"]},
        }
    )
    assert len(calls) == 1


# -- hot paths ----------------------------------------------------------------------------------


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 5, generator=g), torch.randint(0, 5, (16,), generator=g)


@pytest.mark.parametrize("name", ["focal", "fcl", "mmce", "label_smoothing", "flsd", "adafocal"])
def test_loss_forward_does_not_recheck_hyperparameters(name: str, param_calls) -> None:
    loss = build_loss(name)
    param_calls.clear()
    z, y = _batch()
    for _ in range(3):
        loss(z, y)
    assert param_calls == {}


def test_functional_losses_check_by_default_and_skip_on_request(param_calls) -> None:
    z, y = _batch()
    checked = F_cal.fcl_loss(z, y, 2.0, 0.5)
    assert param_calls == {"gamma": 1, "lam": 1}
    param_calls.clear()
    assert torch.equal(F_cal.fcl_loss(z, y, 2.0, 0.5, validate_args=False), checked)
    assert param_calls == {}
    with pytest.raises(ValueError, match=r"fcl_loss: lam: expected a number in \[0, inf\)"):
        F_cal.fcl_loss(z, y, 2.0, -0.5)
    # the shape checks of the inputs always run
    with pytest.raises(ValueError, match=r"focal_loss: logits: expected a 2-D"):
        F_cal.focal_loss(z[0], y, 2.0, validate_args=False)


def test_metrics_skip_value_checks_only_when_asked() -> None:
    z, y = _batch()
    p = torch.softmax(z.double(), 1)
    full = M.calibration_report(probs=p, labels=y)
    assert M.calibration_report(probs=p, labels=y, validate_args=False) == full
    assert M.ece(p, y, validate_args=False) == M.ece(p, y) == full["ece"]
    assert M.ood_auroc(p, p.flip(0), validate_args=False) == M.ood_auroc(p, p.flip(0))
    unnormalised = p * 2  # rows sum to 2: refused when checked, taken as given when not
    with pytest.raises(ValueError, match=r"probs: expected values in \[0, 1\]"):
        M.ece(unnormalised, y)
    assert M.ece(unnormalised, y, validate_args=False) > 0


def test_a_validated_loss_config_builds_its_loss_without_checking_again(param_calls) -> None:
    cfg = config_from_dict({"loss": {"name": "adafocal", "params": {"lam": 2.0}}})
    param_calls.clear()
    loss = cfg.loss.build()
    assert param_calls == {}
    reference = build_loss("adafocal", lam=2.0)
    assert loss.hparams == reference.hparams and loss.update_every == "epoch"
    assert torch.equal(loss.gammas, reference.gammas) and torch.equal(loss.edges, reference.edges)
    z, y = _batch()
    assert torch.equal(loss(z, y), reference(z, y))
    # cross-parameter rules are not per-value checks: they still run
    with pytest.raises(ValueError, match=r"flsd: gammas: expected len\(thresholds\) \+ 1 = 2"):
        type(build_loss("flsd")).from_params(gammas=(5.0,))

"""``loss.compile`` (`calibtune.losses.compile_loss`): the compiled forward+backward of every loss
equals the eager path and the float64 references; ``auto`` leaves CPU eager; a failing compiler
falls back to the eager result with one warning; the trial-config key is validated once.

Inductor compiles on CPU here (a C++ compiler is enough); each compile costs seconds, so the
default run covers a representative subset and the `slow` test every registered loss.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import calibtune.losses._compile as C
from calibtune.losses import build_loss, compile_loss, list_losses
from calibtune.trial import config_from_dict, run
from calibtune.trial._config import config_to_dict
from tests.test_losses import (
    _logits,
    _ref_brier,
    _ref_dual,
    _ref_focal,
    _ref_inverse,
    _with_state,
)

COMPILED = [n for n in list_losses() if n != "mmce"]  # mmce: an O(B²) batch term, kept eager


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # each loss instance is one more guard set on the shared ``CalibrationLoss.forward`` code
    # object; a fresh cache keeps a test away from dynamo's recompile limit
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _inputs(loss, z: torch.Tensor, y: torch.Tensor):
    """The logits and targets a training step hands the loss (mixup: the transformed batch)."""
    if hasattr(loss, "batch_transform"):
        torch.manual_seed(5)
        return loss.batch_transform(z, y)
    return z, y


def _value_grad(loss, z: torch.Tensor, y) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.detach().clone().requires_grad_(True)
    out = loss(z, y)
    (g,) = torch.autograd.grad(out.sum(), z)
    return out.detach(), g


def _pair(name: str, **params):
    """An eager loss and a compiled one with identical (adaptive: updated) state."""
    eager = _with_state(build_loss(name, reduction="none", **params))
    compiled = _with_state(build_loss(name, reduction="none", **params))
    return eager, compile_loss(compiled, "on", "cpu")


def _check_parity(name: str, dtype: torch.dtype, ref=None, **params) -> None:
    """Compiled = eager at ``dtype`` (tight), and = ``ref`` in float64 (default: the eager loss on
    float64 logits, itself checked against the formulas in tests/test_losses.py)."""
    eager, compiled = _pair(name, **params)
    z, y = _inputs(eager, *_logits(24, 7, scale=1.5, seed=3, dtype=dtype))
    before = _graphs()
    v, g = _value_grad(compiled, z, y)
    assert isinstance(compiled.forward, C.CompiledForward) and compiled.forward.compiled
    assert _graphs() > before, f"{name}: dynamo compiled nothing (silently eager)"
    ev, eg = _value_grad(eager, z, y)
    f64 = dtype == torch.float64
    tol = {"rtol": 1e-10, "atol": 1e-12} if f64 else {}
    torch.testing.assert_close(v, ev, **tol)
    torch.testing.assert_close(g, eg, **tol)
    rv, rg = _value_grad(eager if ref is None else ref, z.double(), y)
    tol = {"rtol": 1e-9, "atol": 1e-10} if f64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(v.double(), rv, **tol)
    torch.testing.assert_close(g.double(), rg, **{**tol, "rtol": 1e-7 if f64 else 1e-4})


def _adafocal_ref(loss):
    gammas, edges = loss.gammas.clone(), loss.edges.clone()

    def ref(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p_y = torch.softmax(t, 1).gather(1, y[:, None]).squeeze(1)
        g = gammas[torch.bucketize(p_y.detach(), edges, right=True)]
        return torch.where(g >= 0, _ref_focal(t, y, g.abs()), _ref_inverse(t, y, g.abs()))

    return ref


def test_focal_matches_eager_and_the_float64_formula() -> None:
    _check_parity("focal", torch.float64, ref=lambda t, y: _ref_focal(t, y, 2.5), gamma=2.5)


def test_adafocal_both_signs_after_updates_without_recompiling() -> None:
    eager, compiled = _pair("adafocal")
    assert (eager.gammas < 0).any() and (eager.gammas > 0).any()
    z, y = _logits(32, 6, scale=1.5, seed=4, dtype=torch.float64)
    _value_grad(compiled, z, y)
    graphs = _graphs()
    g = torch.Generator().manual_seed(9)
    for step in range(2):  # the γ update between steps is eager and reuses the compiled kernel
        probs = torch.softmax(3 * torch.randn(200, 6, generator=g), dim=1)
        labels = torch.randint(0, 6, (200,), generator=g)
        for loss in (eager, compiled):
            loss.update(probs, labels)
            loss.gammas[:: 2 + step].mul_(-1.0)
        v, gr = _value_grad(compiled, z, y)
        torch.testing.assert_close(v, _value_grad(eager, z, y)[0], rtol=1e-10, atol=1e-12)
        rv, rg = _value_grad(_adafocal_ref(eager), z, y)
        torch.testing.assert_close(v, rv, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(gr, rg, rtol=1e-7, atol=1e-10)
    assert _graphs() == graphs, "a γ update recompiled the loss"


def test_auto_on_cpu_stays_eager_and_off_never_compiles(monkeypatch) -> None:
    def boom(fn):
        raise AssertionError("compiled")

    monkeypatch.setattr(C, "compile_hook", boom)
    for mode, device in [("auto", "cpu"), ("off", "cpu"), ("off", "cuda")]:
        loss = compile_loss(build_loss("focal"), mode, device)
        assert "forward" not in vars(loss)
    assert "forward" not in vars(compile_loss(build_loss("mmce"), "on", "cpu"))
    assert C.wants_compile("auto", torch.device("cuda", 0))
    with pytest.raises(ValueError, match="compile: expected one of 'auto', 'on', 'off', got 'yes'"):
        compile_loss(build_loss("focal"), "yes")


@pytest.mark.parametrize("where", ["hook", "call"])
def test_a_failing_compile_falls_back_to_eager_with_one_warning(monkeypatch, where) -> None:
    def broken(fn):
        if where == "hook":
            raise RuntimeError("no C++ compiler\nsecond line")

        def call(*args):
            raise RuntimeError("inductor cannot lower it")

        return call

    monkeypatch.setattr(C, "compile_hook", broken)
    z, y = _logits(16, 5, seed=6)
    expected = _value_grad(build_loss("dual_focal"), z, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = compile_loss(build_loss("dual_focal"), "on", "cpu")
        got = [_value_grad(loss, z, y) for _ in range(3)]
    assert [str(w.message) for w in caught] == [
        "loss dual_focal: torch.compile failed (RuntimeError: "
        + ("no C++ compiler" if where == "hook" else "inductor cannot lower it")
        + "); using the eager path"
    ]
    for v, g in got:
        torch.testing.assert_close(v, expected[0], rtol=0, atol=0)
        torch.testing.assert_close(g, expected[1], rtol=0, atol=0)


def test_bad_inputs_raise_the_eager_error_and_keep_compiling(monkeypatch) -> None:
    calls = []

    def fake(fn):
        calls.append(fn)
        return fn  # "compiled" = eager: the input error comes from the loss itself

    monkeypatch.setattr(C, "compile_hook", fake)
    loss = compile_loss(build_loss("focal"), "on", "cpu")
    with pytest.raises(ValueError, match="targets: expected shape"):
        loss(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long))
    assert loss.forward.compiled is not None and loss.forward.reason is None


@pytest.mark.parametrize(
    ("value", "mode"), [(None, "auto"), ("on", "on"), (True, "on"), (False, "off"), ("off", "off")]
)
def test_trial_config_key(value, mode) -> None:
    loss = {"name": "focal"} if value is None else {"name": "focal", "compile": value}
    cfg = config_from_dict({"name": "t", "loss": loss})
    assert cfg.loss.compile == mode
    assert config_from_dict(config_to_dict(cfg)).loss == cfg.loss


@pytest.mark.slow
def test_mixup_steps_reuse_one_compiled_graph() -> None:
    eager, compiled = _pair("regmixup")
    z, y = _logits(16, 5, seed=12)
    graphs = None
    for step in range(3):  # a fresh batch transform (λ, partners) every step
        torch.manual_seed(step)
        x, t = compiled.batch_transform(z, y)
        v, g = _value_grad(compiled, x, t)
        ev, eg = _value_grad(eager, x, t)
        torch.testing.assert_close(v, ev)
        torch.testing.assert_close(g, eg)
        graphs = _graphs() if graphs is None else graphs
    assert _graphs() == graphs, "a new mixed batch recompiled the loss"


def test_trial_config_rejects_a_bad_value_in_one_line() -> None:
    with pytest.raises(ValueError) as err:
        config_from_dict({"name": "t", "loss": {"name": "focal", "compile": "always"}})
    assert str(err.value) == "loss.compile: expected one of 'auto', 'on', 'off', got 'always'"


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED)
def test_every_loss_compiled_matches_eager_and_float64(name: str) -> None:
    _check_parity(name, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "params", "ref"),
    [
        ("dual_focal", {"gamma": 2.0}, lambda t, y: _ref_dual(t, y, 2.0)),
        ("inverse_focal", {"gamma": 1.5}, lambda t, y: _ref_inverse(t, y, 1.5)),
        ("focal", {"gamma": 0.5}, lambda t, y: _ref_focal(t, y, 0.5)),
        (
            "fcl",
            {"gamma": 3.0, "lam": 0.7},
            lambda t, y: _ref_focal(t, y, 3.0) + 0.7 * _ref_brier(t, y),
        ),
        ("flsd", {"gammas": (6.0, 2.0), "thresholds": (0.3,)}, None),
    ],
)
def test_hyperparameters_match_the_float64_reference(name, params, ref) -> None:
    if name == "flsd":

        def ref(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            p_y = torch.softmax(t, 1).gather(1, y[:, None]).squeeze(1).detach()
            return _ref_focal(t, y, torch.where(p_y >= 0.3, 2.0, 6.0).to(t.dtype))

    _check_parity(name, torch.float64, ref=ref, **params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", COMPILED)
def test_cuda_compiled_gradient_matches_the_float64_reference(name: str) -> None:
    ref = _with_state(build_loss(name, reduction="none"))
    z, y = _inputs(ref, *_logits(128, 100, scale=1.5, seed=8, dtype=torch.float64))
    rv, rg = _value_grad(ref, z, y)
    loss = compile_loss(_with_state(build_loss(name, reduction="none")).cuda(), "auto", "cuda")
    assert isinstance(loss.forward, C.CompiledForward)
    yc = y.cuda() if isinstance(y, torch.Tensor) else type(y)(*(t.cuda() for t in vars(y).values()))
    v, g = _value_grad(loss, z.float().cuda(), yc)
    assert loss.forward.compiled is not None, loss.forward.reason
    torch.testing.assert_close(v.double().cpu(), rv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g.double().cpu(), rg, rtol=1e-3, atol=1e-6)


def test_each_loss_instance_compiles_past_the_recompile_limit() -> None:
    z, y = _logits(8, 4, seed=2)
    expected = build_loss("focal", gamma=1.0)(z, y)
    limit = getattr(torch._dynamo.config, "recompile_limit", None)  # torch < 2.6: cache_size_limit
    for _ in range((limit or torch._dynamo.config.cache_size_limit) + 2):  # one reused worker
        before = _graphs()
        loss = compile_loss(build_loss("focal", gamma=1.0), "on", "cpu")
        with torch.no_grad():
            torch.testing.assert_close(loss(z, y), expected)
        assert _graphs() > before


@pytest.mark.slow
def test_a_trial_with_loss_compile_on_trains_like_eager(tmp_path) -> None:
    """Through the trial (Ray Train local mode): AdaFocal's epoch updates and the epoch's last,
    smaller batch (digits: 1617 training rows, batches of 64) with the loss compiled."""
    from tests.test_trial_run import _cfg

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback would warn
        results = {
            mode: run(_cfg(tmp_path, "adafocal", name=f"t_{mode}", loss__compile=mode))
            for mode in ("on", "off")
        }
    on, off = results["on"], results["off"]
    assert on.history[-1]["adaptive/gammas"] == pytest.approx(off.history[-1]["adaptive/gammas"])
    for key in ("val/nll", "val/ece", "train/loss"):
        assert [h[key] for h in on.history] == pytest.approx(
            [h[key] for h in off.history], rel=1e-3
        )

"""``model.params`` (issue 31 item 6: the results page's larger MNIST-1D setting trains a 2×512
``mlp``): a network's own parameters from the trial config, validated against the model registry
at the boundary, passed to the network the worker builds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from calibtune.trial import config_from_dict, config_to_dict
from calibtune.trial._config import ValidationError


def _cfg(model):
    return config_from_dict({"data": {"name": "mnist1d"}, "model": model})


def test_given_params_are_validated_kept_and_round_trip():
    cfg = _cfg({"name": "mlp", "params": {"hidden": 512}})
    assert dict(cfg.model.params) == {"hidden": 512}  # as given: depth keeps its default
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert _cfg({"name": "cnn1d"}).model.params == {}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"width": 3}, "model.params: mlp: unknown parameter 'width'; expected one of"),
        ({"hidden": 0}, "hidden"),
        (
            {"num_classes": 3},
            "model.params.num_classes: expected no value (it comes from the dataset)",
        ),
        ("big", "model.params"),
    ],
)
def test_bad_params_are_refused_in_one_line(params, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg({"name": "mlp", "params": params})


def test_the_trial_builds_the_network_with_them(tmp_path):
    """`calibtune train` (the trial worker's build) on a 2×64 mlp: its parameter count is the
    2×64 network's, not the default 2×100's."""
    from calibtune.models import build_model, count_parameters

    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        "data: {name: digits}\nmodel: {name: mlp, params: {hidden: 64}}\n"
        "train: {epochs: 1}\nscaling: {num_workers: 0}\n"
    )
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "calibtune", "train", str(cfg), "--storage-path", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    import torch

    state = torch.load(next(out.rglob("state.pt")), weights_only=True)["model"]
    want = count_parameters(build_model("mlp", 10, (1, 8, 8), hidden=64))
    assert (
        sum(v.numel() for v in state.values())
        == want
        != count_parameters(build_model("mlp", 10, (1, 8, 8)))
    )

"""Model zoo: registry, forward shapes, gradients, hand-derived parameter counts, and a small
model actually learning the embedded default dataset."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calibtune.data import load_splits
from calibtune.models import MODELS, build_model, count_parameters, list_models

SHAPES = {
    "resnet50_tiny": (3, 64, 64),
    "resnet50_imagenet": (3, 224, 224),
    "cnn1d": (1, 40),
    "mlp": (1, 8, 8),
    "small_cnn": (1, 8, 8),
    "treelstm": (4, 127),
    "global_pool_cnn": (100, 1000),
}
# Gradients do not depend on the image size, so backward runs on small inputs (the 32×32 nets
# cost 1–5 GFLOPs per image, seconds each on a shared 2-core CPU); shapes on the real input are
# checked on the meta device (no compute), and the full-size run is marked slow.
SMALL_SHAPES = {"resnet50_tiny": (3, 16, 16), "cnn1d": (1, 40), "mlp": (1, 8, 8)}
SMALL_SHAPES["small_cnn"] = (1, 8, 8)
SMALL_SHAPES["global_pool_cnn"] = (8, 40)
BIG = {"resnet50", "resnet50_tiny", "resnet110", "resnet110_bottleneck"}
BIG |= {"wide_resnet26_10", "densenet121"}


def shape_of(name: str) -> tuple[int, ...]:
    return SHAPES.get(name, (3, 32, 32))


def test_registry_lists_every_model() -> None:
    required = {"resnet50", "resnet110", "wide_resnet26_10", "densenet121", "resnet50_tiny"}
    required |= {"mlp", "small_cnn", "cnn1d"}
    assert required <= set(list_models())
    assert list_models() == MODELS.names() == sorted(list_models())
    with pytest.raises(ValueError, match=r"unknown model 'vgg16'; expected one of: cnn1d, "):
        build_model("vgg16", 10, (3, 32, 32))


# Parameter counts, derived by hand (BN layers count 2·C: weight and bias):
# resnet110 (He et al., option-A shortcuts, 10 classes):
#   stem 3·16·9 + 32 = 464
#   stage 1: 18 × (2·16·16·9 + 2·32) = 18 × 4,672 = 84,096
#   stage 2: (16·32·9 + 32·32·9 + 128) + 17 × (2·32·32·9 + 128) = 13,952 + 315,520 = 329,472
#   stage 3: (32·64·9 + 64·64·9 + 256) + 17 × (2·64·64·9 + 256) = 55,552 + 1,257,728
#            = 1,313,280
#   fc 64·10 + 10 = 650                                          total 1,727,962
# wide_resnet26_10 (4 blocks per stage, 160/320/640, 1×1 conv + BN projections, 10 classes):
#   stem 464; stage 1: (16·160·9 + 160·160·9 + 640 + 16·160 + 320) + 3 × (2·160·160·9 + 640)
#            = 256,960 + 1,384,320 = 1,641,280
#   stage 2: (160·320·9 + 320·320·9 + 1,280 + 160·320 + 640) + 3 × (2·320·320·9 + 1,280)
#            = 1,435,520 + 5,533,440 = 6,968,960
#   stage 3: (320·640·9 + 640·640·9 + 2,560 + 320·640 + 1,280) + 3 × (2·640·640·9 + 2,560)
#            = 5,738,240 + 22,126,080 = 27,864,320
#   fc 640·10 + 10 = 6,410                                       total 36,481,434
# resnet50 = torchvision resnet50 (25,557,032 for 1000 classes) − 7×7 stem 3·64·49 = 9,408
#   + 3×3 stem 3·64·9 = 1,728 − fc 2048·1000 + 1000 = 2,049,000 + fc 2048·10 + 10 = 20,490
#   = 23,520,842
# resnet50_tiny (200 classes) = 23,520,842 − 20,490 + (4·2048·200 + 200 = 1,638,600)
#   = 25,138,952
# densenet121 = torchvision densenet121 (7,978,856) − 9,408 + 1,728 − norm0 2·64 = 128
#   − classifier 1024·1000 + 1000 = 1,025,000 + 1024·10 + 10 = 10,250 = 6,956,298
# resnet110_bottleneck = torchvision resnet101 (3-4-23-3; 44,549,160) + 3 layer-3 bottlenecks
#   3 × (1024·256 + 256·256·9 + 256·1024 + 2·(256 + 256 + 1024)) = 3 × 1,117,184 = 3,351,552
#   − 9,408 + 1,728 − 2,049,000 + 20,490 = 45,864,522
# treelstm (defaults: vocab 100, 300-d vectors, hidden 150): embedding 100·300 = 30,000
#   + leaf (W_c; W_o) 300·300 + 300 = 90,300 + U^l, U^r 2 × (150·600 + 600) = 181,200
#   + fc 150·10 + 10 = 1,510                                     total 303,010
# mlp on digits (64 → 100 → 100 → 10): 6,500 + 10,100 + 1,010 = 17,610
# small_cnn on digits (1 channel, width 32): 288 + 64 + 18,432 + 128 + 36,864 + 128 + 650
#   = 56,554
# cnn1d on MNIST-1D: (1·25·5 + 25) + 2 × (25·25·3 + 25) + (25·5·10 + 10) = 150 + 3,800 + 1,260
#   = 5,210
COUNTS = [
    ("resnet110", 10, 1_727_962),
    ("wide_resnet26_10", 10, 36_481_434),
    ("resnet50", 10, 23_520_842),
    ("resnet50_tiny", 200, 25_138_952),
    ("resnet50_imagenet", 1000, 25_557_032),  # torchvision resnet50, as it documents
    ("densenet121", 10, 6_956_298),
    ("resnet110_bottleneck", 10, 45_864_522),
    ("mlp", 10, 17_610),
    ("small_cnn", 10, 56_554),
    ("cnn1d", 10, 5_210),
    ("treelstm", 10, 303_010),
    # 3 convs 100→128→128→128 (k 5, bias), 128→128→K: 64,128 + 2·82,048 + 16,512 + 1,290
    ("global_pool_cnn", 10, 246_026),
]


def test_every_registered_model_has_a_hand_derived_count() -> None:
    assert sorted(name for name, _, _ in COUNTS) == list_models()


@pytest.mark.parametrize(("name", "num_classes", "expected"), COUNTS)
def test_parameter_counts(name: str, num_classes: int, expected: int) -> None:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = build_model(name, num_classes, shape_of(name))
    assert count_parameters(model) == expected


#: networks over integer-encoded parse trees: a random float input means nothing to them (their
#: forward, backward and batch independence: tests/test_sst_treelstm.py)
DENSE = [n for n in MODELS.names() if "trees" not in MODELS.get(n).tags]


@pytest.mark.parametrize("name", DENSE)
def test_forward_shape_on_its_input(name: str) -> None:
    with torch.device("meta"):
        model = build_model(name, 7, shape_of(name))
        logits = model(torch.empty(2, *shape_of(name)))
    assert logits.shape == (2, 7)


def _forward_backward(name: str, shape: tuple[int, ...], num_classes: int = 7) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes, shape)
    x = torch.randn(2, *shape)
    logits = model(x)
    assert logits.shape == (2, num_classes) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits, torch.tensor([0, num_classes - 1])).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"parameters without gradient: {missing[:3]}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())
    model.eval()
    with torch.no_grad():
        # eval mode: no dropout, BatchNorm on running statistics, so a sample's logits do not
        # depend on the batch it sits in (train-mode BatchNorm would make them depend)
        both = model(x)
        torch.testing.assert_close(model(x[1:]), both[1:], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(x), both, rtol=0, atol=0)


@pytest.mark.parametrize("name", DENSE)
def test_forward_backward_small_input(name: str) -> None:
    _forward_backward(name, SMALL_SHAPES.get(name, (3, 8, 8)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BIG))
def test_forward_backward_full_input(name: str) -> None:
    _forward_backward(name, shape_of(name))


def test_models_return_logits_not_probabilities() -> None:
    # a logit head can output any real vector: scaling the last layer scales the output, which a
    # softmax/temperature inside the module would prevent
    torch.manual_seed(0)
    model = build_model("mlp", 5, (1, 8, 8))
    x = torch.randn(4, 1, 8, 8)
    a = model(x)
    with torch.no_grad():
        last = model.net[-1]
        last.weight.mul_(3)
        last.bias.mul_(3)
    torch.testing.assert_close(model(x), 3 * a)
    assert not any("temp" in n for n, _ in model.named_parameters())


def test_input_channels_follow_input_shape() -> None:
    with torch.device("meta"):
        model = build_model("resnet50", 10, (1, 32, 32))
        assert model(torch.empty(2, 1, 32, 32)).shape == (2, 10)
        assert model.conv1.weight.shape == (64, 1, 3, 3)
    assert build_model("resnet110", 3, (1, 8, 8))(torch.randn(2, 1, 8, 8)).shape == (2, 3)
    assert build_model("mlp", 4, (1, 40))(torch.randn(3, 1, 40)).shape == (3, 4)


@pytest.mark.parametrize(
    ("name", "shape", "match"),
    [
        (
            "resnet50",
            (1, 40),
            r"resnet50: input_shape: expected \(C, H, W\) with positive sizes, got \(1, 40\)",
        ),
        ("cnn1d", (1, 8, 8), r"cnn1d: input_shape: expected \(C, L\) with positive sizes"),
        ("small_cnn", (0, 8, 8), r"small_cnn: input_shape: expected \(C, H, W\)"),
        ("mlp", "1x8x8", r"mlp: input_shape: expected a tuple of positive sizes, got '1x8x8'"),
        ("cnn1d", (1, 2), r"cnn1d: input_shape: expected a length L >= 3, got L = 2"),
    ],
)
def test_bad_input_shapes(name: str, shape: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_model(name, 10, shape)


def test_declared_params_are_validated() -> None:
    assert count_parameters(build_model("mlp", 10, (1, 8, 8), hidden=8, depth=1)) == (
        64 * 8 + 8 + 8 * 10 + 10
    )
    with pytest.raises(ValueError, match=r"mlp: hidden: expected an integer in \[1, inf\), got 0"):
        build_model("mlp", 10, (1, 8, 8), hidden=0)
    with pytest.raises(ValueError, match=r"resnet50: unknown parameter 'width'"):
        build_model("resnet50", 10, (3, 32, 32), width=4)
    with pytest.raises(
        ValueError, match=r"small_cnn: num_classes: expected an integer in \[2, inf\)"
    ):
        build_model("small_cnn", 1, (1, 8, 8))


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_small_models_learn_digits_in_seconds(name: str) -> None:
    # the quickstart path: embedded data + small model + batch augmentation, on a CPU
    torch.manual_seed(0)
    s = load_splits("digits", seed=1)
    model = build_model(name, s.num_classes, s.input_shape)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = s.train.tensors
    for _ in range(8):
        for idx in torch.randperm(len(y)).split(64):
            loss = nn.functional.cross_entropy(model(s.augment(x[idx])), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    xt, yt = s.test.tensors
    with torch.no_grad():
        error = (model(xt).argmax(1) != yt).float().mean().item()
    assert error < 0.1


# ----------------------------------------------------------------------------- initialisation
# The authors' code's init per network (issue 31.1): focal_calibration's Net/resnet.py (ResNet-50
# and its "resnet110", the 3-4-26-3 bottleneck), AdaFocal's models/resnet.py and Net/densenet.py
# have no init code, so PyTorch's per-layer default applies; Net/wide_resnet.py and
# Net/resnet_tiny_imagenet.py draw convolutions from N(0, 2/(k·k·C_out)).
AUTHORS_INIT = {
    "resnet50": "torch_default",
    "resnet110_bottleneck": "torch_default",
    "densenet121": "torch_default",
    "wide_resnet26_10": "kaiming_normal_fan_out",
    "resnet50_tiny": "kaiming_normal_fan_out",
    "resnet50_imagenet": "kaiming_normal_fan_out",  # torchvision's own init loop
    "resnet110": "kaiming_normal_fan_out",  # He et al.'s network, not in the seeds' code
    "mlp": "torch_default",
    "small_cnn": "torch_default",
    "treelstm": "torch_default",
    "global_pool_cnn": "torch_default",  # PyTorch port of MMCE: per-layer defaults
    "cnn1d": "torch_default",
}


def _expected_std(m: nn.Module, scheme: str) -> float:
    """Analytic weight std: kaiming_uniform(a=√5) is U(±1/√fan_in), std 1/√(3·fan_in);
    kaiming_normal(fan_out) is N(0, 2/fan_out) with fan_out = C_out·(kernel elements)."""
    w = m.weight
    receptive = w[0, 0].numel()
    if isinstance(m, nn.modules.conv._ConvNd) and scheme == "kaiming_normal_fan_out":
        return (2 / (w.shape[0] * receptive)) ** 0.5
    return (1 / (3 * w.shape[1] * receptive)) ** 0.5  # conv (default) and every Linear


def _check_init(model: nn.Module, scheme: str) -> dict[str, int]:
    """Each conv/linear layer's weight std against `_expected_std` (tolerance: 2 % plus four
    standard errors of a sample std, ≤ 0.71/√n for normal, 0.45/√n for uniform draws), the
    pooled ratio per layer type within 2 %, BatchNorm at weight 1 / bias 0. Returns layers
    checked per type."""
    ratios: dict[str, list[float]] = {"conv": [], "linear": []}
    for name, m in model.named_modules():
        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)):
            kind = "linear" if isinstance(m, nn.Linear) else "conv"
            n = m.weight.numel()
            ratio = m.weight.detach().std().item() / _expected_std(m, scheme)
            assert abs(ratio - 1) < 0.02 + 4 * 0.71 / n**0.5, (name, kind, scheme, ratio)
            assert abs(m.weight.detach().mean().item()) < 4 * _expected_std(m, scheme) / n**0.5
            ratios[kind].append(ratio)
        elif isinstance(m, nn.modules.batchnorm._NormBase) and m.affine:
            assert bool((m.weight == 1).all() and (m.bias == 0).all()), name
    for kind, r in ratios.items():
        if len(r) > 4:
            assert abs(sum(r) / len(r) - 1) < 0.02, (kind, scheme, sum(r) / len(r))
    return {k: len(v) for k, v in ratios.items()}


def test_every_network_records_its_authors_init() -> None:
    from calibtune.models import INIT_SCHEMES, model_init

    assert set(AUTHORS_INIT) == set(list_models())
    for name, scheme in AUTHORS_INIT.items():
        rec = model_init(name)
        assert rec.scheme == scheme and rec.scheme in INIT_SCHEMES, name
        assert rec.source, name
    assert "wide_resnet.py" in model_init("wide_resnet26_10").source
    with pytest.raises(ValueError, match="unknown model 'vgg16'"):
        model_init("vgg16")


@pytest.mark.parametrize("name", sorted(AUTHORS_INIT))
def test_initial_weight_statistics_match_the_authors_scheme(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, 10, shape_of(name))
    counts = _check_init(model, AUTHORS_INIT[name])
    assert counts["linear"] >= 1 and (name in ("mlp", "treelstm") or counts["conv"] >= 3), counts


def test_model_init_overrides_the_authors_scheme() -> None:
    torch.manual_seed(0)
    default = build_model("resnet50", 10, (3, 32, 32))
    torch.manual_seed(0)
    he = build_model("resnet50", 10, (3, 32, 32), init="kaiming_normal_fan_out")
    _check_init(he, "kaiming_normal_fan_out")
    # the audit's "about 2.4× smaller": √(2/(9·C)) / √(1/(27·C)) = √6 for a 3×3 C→C conv
    conv = "layer1.0.conv2.weight"
    ratio = dict(he.named_parameters())[conv].std() / dict(default.named_parameters())[conv].std()
    assert ratio.item() == pytest.approx(6**0.5, rel=0.05)
    torch.manual_seed(0)
    _check_init(
        build_model("wide_resnet26_10", 10, (3, 32, 32), init="torch_default"), "torch_default"
    )
    with pytest.raises(ValueError, match=r"init: expected auto or one of torch_default, kaiming"):
        build_model("mlp", 10, (1, 8, 8), init="xavier")


def test_a_small_model_s_weights_are_its_builder_s_bit_for_bit() -> None:
    """The small models already get PyTorch's defaults from their builders: `build_model` draws
    nothing more, so the results studies (cnn1d, small_cnn) train from the same weights."""
    from calibtune.models import CNN1d

    torch.manual_seed(3)
    built = build_model("cnn1d", 10, (1, 40))
    torch.manual_seed(3)
    direct = CNN1d(1, 40, 10, 25)
    for (n, a), (_, b) in zip(built.state_dict().items(), direct.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


def test_model_init_is_a_trial_config_key_checked_at_the_boundary() -> None:
    from calibtune.trial import config_from_dict

    assert config_from_dict({}).model.init == "auto"
    cfg = config_from_dict({"model": {"name": "resnet50", "init": "kaiming_normal_fan_out"}})
    assert cfg.model.init == "kaiming_normal_fan_out"
    with pytest.raises(ValueError, match=r"^model\.init: expected one of 'auto', 'torch_default'"):
        config_from_dict({"model": {"init": "xavier"}})

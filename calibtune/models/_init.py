"""Weight initialisation schemes (``model.init``) and the scheme each network's authors used.

Two schemes, both leaving BatchNorm at weight 1, bias 0 (and fresh running statistics):

- ``torch_default``: every layer's own ``reset_parameters`` — for ``Conv*d`` and ``Linear``
  ``kaiming_uniform_(a=√5)``, i.e. U(−b, b) with b = 1/√fan_in (std b/√3), bias
  U(−1/√fan_in, 1/√fan_in). What a network with no init code of its own gets: the ResNets of
  focal_calibration (``Net/resnet.py``) and AdaFocal (``models/resnet.py``), and
  ``Net/densenet.py``.
- ``kaiming_normal_fan_out``: ``torch_default``, then every convolution's weight redrawn from
  N(0, 2/fan_out), fan_out = C_out·k (k: kernel elements) — He et al. (ICCV 2015) with
  the fan-out mode; the init loop of focal_calibration's ``Net/wide_resnet.py`` and
  ``Net/resnet_tiny_imagenet.py`` (``normal_(0, sqrt(2/n))``, n = k·k·C_out); linear layers
  keep the default, as there.

``model.init: auto`` (the trial default) picks the scheme recorded for the network in the zoo
(`ModelInit`, ``calibtune.models.model_init``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["INIT_SCHEMES", "ModelInit", "init_weights"]

#: ``model.init`` values besides ``auto``
INIT_SCHEMES = ("torch_default", "kaiming_normal_fan_out")


@dataclass(frozen=True)
class ModelInit:
    """A network's initialisation: ``scheme`` (one of `INIT_SCHEMES`) is what ``model.init:
    auto`` uses — the authors' code's choice for the seed networks; ``source`` says where that
    choice is read from; ``built_with`` is the scheme the builder itself already leaves (then
    nothing is redrawn, so the weights, and every result trained from them, stay bit-identical
    to the builder's), ``None`` when the builder's init matches neither scheme."""

    scheme: str
    source: str
    built_with: str | None = None


def init_weights(model: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise ``model`` in place with ``scheme`` (module docstring); returns it.

    Draws from torch's global generator, so a fixed ``torch.manual_seed`` fixes the weights.

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> conv = init_weights(nn.Sequential(nn.Conv2d(16, 64, 3)), "kaiming_normal_fan_out")[0]
    >>> round(conv.weight.std().item() / (2 / (64 * 9)) ** 0.5, 1)
    1.0
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init: expected one of {', '.join(INIT_SCHEMES)}, got {scheme!r}")
    for m in model.modules():
        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear, nn.modules.batchnorm._NormBase)):
            m.reset_parameters()
    if scheme == "kaiming_normal_fan_out":
        for m in model.modules():
            if isinstance(m, nn.modules.conv._ConvNd):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model

"""The trial path on a device that is not the CPU, checked without a GPU.

* PyTorch's ``meta`` device stands for a GPU: a tensor created on the CPU meets the meta tensors
  in the first op that combines them (``Tensor on device cpu is not on the expected device
  meta!``), exactly where CUDA raises ``Expected all tensors to be on the same device``; and a
  host read of a meta tensor (``.item()``) fails, so a training epoch that runs on meta reads
  nothing from the device per step.
* A `TorchDispatchMode` counts the host reads (``aten._local_scalar_dense``) of a CPU epoch: O(1)
  per epoch, not per step.
* An AST check over ``calibtune/``: every tensor factory call passes ``device=`` unless its place
  is in `ALLOWED`, with the reason it is host-side by design.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import TensorDataset

from calibtune.data._common import BatchAugment, NormalizedImages
from calibtune.losses import LOSSES
from calibtune.models import build_model
from calibtune.training import DeviceBatches, LoopSpec, Precision, Progress, train_epochs
from calibtune.training import _loop as loop
from calibtune.trial._checkpoint import load_state, save_state
from calibtune.trial._config import LossConfig

ROOT = Path(__file__).resolve().parents[1]
META = torch.device("meta")

# ------------------------------------------------------------------ (a) an epoch on `meta`


def _digits_like(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def _cifar_like(n: int, seed: int) -> NormalizedImages:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (n,), generator=g)
    return NormalizedImages(
        images,
        labels,
        (0.49, 0.48, 0.45),
        (0.25, 0.24, 0.26),
        batch_transform=BatchAugment(padding=4, flip=True, fill=(0.0,)),
    )


def _loss(name: str) -> nn.Module:
    return LossConfig(name, LOSSES.get(name).defaults()).build()


def _spec(device: torch.device, loss: str, data: str, n: int = 96) -> LoopSpec:
    if data == "cifar":
        train, val = _cifar_like(n, 1), _cifar_like(64, 2)
        model, augment = build_model("small_cnn", 10, (3, 32, 32)), None
    else:
        train, val = _digits_like(n, 1), _digits_like(64, 2)
        model = build_model("small_cnn", 10, (1, 8, 8))
        augment = BatchAugment(padding=1, flip=False, fill=(-1.0,))
    model = model.to(device)
    return LoopSpec(
        model=model,
        loss_fn=_loss(loss).to(device),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
        lr_at=lambda e: 0.05,
        train_set=train,
        val_set=val,
        test_set=None,
        epochs=1,
        batch_size=32,
        grad_clip=2.0,
        device=device,
        augment=augment,
    )


class _HostCopies(TorchDispatchMode):
    """Serves the host copies of meta tensors — the one thing a device with no data cannot do —
    with zeros (``fill`` by shape where zeros would not do) and counts them; every other op,
    `_Totals.check`'s reduction included, runs on the device. ``.tolist()`` of a meta tensor
    becomes ``.cpu().tolist()`` (the same one device-to-host copy on CUDA)."""

    def __init__(self, fill: dict[tuple[int, ...], list[float]] | None = None) -> None:
        super().__init__()
        self.fill, self.copies = fill or {}, 0

    def _served(self, t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        self.copies += 1
        values = self.fill.get(tuple(t.shape))
        out = torch.zeros(t.shape, dtype=dtype or t.dtype)
        return out if values is None else torch.tensor(values, dtype=out.dtype).view(t.shape)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if src is not None and src.device == META:
            if func is torch.ops.aten._local_scalar_dense.default:
                return self._served(src, None).item()
            to = kwargs.get("device")
            if func is torch.ops.aten._to_copy.default and to is not None and to.type == "cpu":
                return self._served(src, kwargs.get("dtype"))
        return func(*args, **kwargs)


@pytest.fixture
def host_copies(monkeypatch: pytest.MonkeyPatch):
    """`_HostCopies` active for the test, with ``Tensor.tolist`` routed through it for meta."""
    mode = _HostCopies()
    tolist = torch.Tensor.tolist

    def meta_tolist(self: torch.Tensor) -> Any:
        return tolist(self.cpu() if self.device == META else self)

    monkeypatch.setattr(torch.Tensor, "tolist", meta_tolist)
    with mode:
        yield mode


def _train_pass(spec: LoopSpec, mode: _HostCopies) -> torch.Tensor:
    """The training pass of epoch 1 on the device, `_Totals.check` and its one host copy
    included (the copy is all `_HostCopies` serves)."""
    before = mode.copies
    totals, _ = loop._train_epoch(spec, loop._Sources.of(spec), 1, 0.05, lambda ds: None)
    assert mode.copies - before == 1  # one read, at the end
    return totals


@pytest.mark.parametrize("loss", LOSSES.names())
def test_every_loss_trains_an_epoch_with_the_trial_on_a_non_cpu_device(loss, host_copies):
    spec = _spec(META, loss, "digits")
    totals = _train_pass(spec, host_copies)
    assert totals.device == META and totals.dtype == torch.float64
    assert all(p.device == META for p in spec.model.parameters())
    state = spec.optimizer.state_dict()["state"]
    assert state and all(s["momentum_buffer"].device == META for s in state.values())
    assert all(b.device == META for b in spec.loss_fn.buffers())


@pytest.mark.parametrize("loss", ["cross_entropy", "adafocal", "adadual_focal", "flsd"])
def test_the_end_of_an_epoch_runs_on_the_device_too(loss, host_copies):
    """`train_epochs` whole on meta: `_Totals.check`, the validation pass up to its one copy
    home, the epoch-end adaptive update (AdaFocal's γ/edges buffers stay on the device), the
    metrics. Only host copies are served (`(3,)`: Σ loss, #wrong, #seen of 96 samples)."""
    spec = _spec(META, loss, "digits")
    host_copies.fill[(3,)] = [230.0, 80.0, 96.0]
    seen: list[dict[str, Any]] = []
    cache = train_epochs(spec, on_epoch_end=lambda e, m, c: seen.append(m))
    assert cache is not None and cache.val_logits.shape == (64, 10)
    assert seen[0]["train/loss"] == pytest.approx(230.0 / 96) and "val/ece" in seen[0]
    assert all(b.device == META for b in spec.loss_fn.buffers())
    if getattr(spec.loss_fn, "adaptive", False):
        assert len(spec.loss_fn.history) == 1 and "adaptive/gamma_mean" in seen[0]


@pytest.mark.parametrize("precision", ["fp32", "channels_last"])
def test_resident_uint8_images_augmented_and_normalised_on_the_device(precision, host_copies):
    spec = _spec(META, "focal", "cifar")
    if precision == "channels_last":
        spec.precision = Precision("fp32", META, channels_last=True)
        spec.precision.prepare(spec.model)
    sources = loop._Sources.of(spec)
    assert sources.train.resident and sources.val.resident
    x, y = next(sources.train.batches([torch.arange(8)], train=True))
    assert (x.device, x.dtype, tuple(x.shape)) == (META, torch.float32, (8, 3, 32, 32))
    assert (y.device, y.dtype) == (META, torch.int64)
    if precision == "channels_last":
        assert x.is_contiguous(memory_format=torch.channels_last)
    _train_pass(spec, host_copies)


def test_inference_forwards_run_on_the_device_until_the_one_copy_home():
    spec = _spec(META, "cross_entropy", "digits")
    source = DeviceBatches(spec.val_set, META)
    with pytest.raises(NotImplementedError, match="meta"):  # the final .cpu(): nothing to copy
        loop.infer_logits(spec.model, source, batch_size=16, device=META)
    assert source._x is not None and source._x.device == META  # uploaded once, on the device


# ------------------------------------------------------------------ host reads per epoch


class _CountReads(TorchDispatchMode):
    """Counts host reads of tensor values (``.item()``, ``bool(t)``, ``float(t)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _reads_of_an_epoch(loss: str, n: int) -> int:
    torch.manual_seed(0)
    spec = _spec(torch.device("cpu"), loss, "digits", n=n)
    sources = loop._Sources.of(spec)
    with _CountReads() as mode:
        loop._train_epoch(spec, sources, 1, 0.05, lambda ds: None)
    return mode.reads


@pytest.mark.parametrize("loss", ["cross_entropy", "focal", "flsd", "adafocal", "dual_focal"])
def test_host_reads_of_a_training_epoch_do_not_grow_with_its_steps(loss):
    few, many = _reads_of_an_epoch(loss, 64), _reads_of_an_epoch(loss, 256)  # 2 vs 8 steps
    assert few == many <= 2


def test_a_non_finite_loss_still_names_the_epoch_and_the_first_bad_step():
    spec = _spec(torch.device("cpu"), "cross_entropy", "digits", n=160)
    calls = {"n": 0}
    ce = spec.loss_fn

    class NanAtThird(nn.Module):
        def forward(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            calls["n"] += 1
            out = ce(logits, y)
            return out * float("nan") if calls["n"] == 3 else out

    spec.loss_fn = NanAtThird()
    with pytest.raises(loop.NonFiniteLossError, match=r"^non-finite loss at epoch 1, step 3 "):
        train_epochs(spec)


# ------------------------------------------------------------------ checkpoints across devices


@pytest.mark.filterwarnings("ignore:.*copying from a non-meta parameter")
def test_a_checkpoint_resumes_on_another_device(tmp_path):
    """Written on one device (here the CPU), loaded where the trial now runs (here meta): every
    tensor lands on its module's or parameter's device; `load_state` maps to the CPU first, so a
    GPU-written checkpoint loads on a machine without one."""
    cpu = _spec(torch.device("cpu"), "adafocal", "digits")
    loop._train_epoch(cpu, loop._Sources.of(cpu), 1, 0.05, lambda ds: None)
    save_state(
        tmp_path, model=cpu.model, optimizer=cpu.optimizer, loss_fn=cpu.loss_fn, epoch=1, history=[]
    )
    state = load_state(tmp_path)
    assert all(t.device.type == "cpu" for t in state["model"].values())
    other = _spec(META, "adafocal", "digits")
    other.model.load_state_dict(state["model"])
    other.optimizer.load_state_dict(state["optimizer"])
    other.loss_fn.load_state_dict(state["loss"])
    moms = [s["momentum_buffer"] for s in other.optimizer.state_dict()["state"].values()]
    assert moms and all(m.device == META for m in moms)
    assert all(b.device == META for b in other.loss_fn.buffers())


# ------------------------------------------------------------------ (b) the AST check

FACTORIES = {
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "logspace",
    "eye", "rand", "randn", "randint", "randperm", "Generator", "from_numpy", "empty_strided",
    "scalar_tensor",
}  # fmt: skip

#: ``path::qualified function`` -> why its tensors are created on the CPU by design
ALLOWED = {
    "calibtune/data/_cifar.py::read_cifar": "reads files into host memory; DeviceBatches uploads",
    "calibtune/data/_cifar.py::load_cifar_splits": "split indices of host arrays",
    "calibtune/data/_common.py::NormalizedImages.__init__": "normalisation constants of a host "
    "dataset; DeviceBatches moves them with the images",
    "calibtune/data/_common.py::NormalizedImages.__getitems__": "DataLoader fetch (host side)",
    "calibtune/data/_embedded.py::_tensor_split": "embedded data built in host memory",
    "calibtune/data/_digest.py::array_digest": "hashes host copies of the data (lineage)",
    "calibtune/data/_glove.py::load_glove": "reads word vectors into host memory",
    "calibtune/data/_text.py::encode_documents": "token ids built in host memory",
    "calibtune/data/_imagenet.py::ImageFiles.__init__": "labels and normalisation constants of "
    "a streamed host dataset; its DataLoader's batches are copied to the device",
    "calibtune/data/_sst.py::_embedding_table": "the host word-vector table the network copies",
    "calibtune/data/_sst.py::load_sst_splits.split": "encoded trees in host memory; "
    "DeviceBatches uploads",
    "calibtune/data/_text.py::load_newsgroups_splits": "host embedding table",
    "calibtune/data/_text.py::load_newsgroups_splits.split": "split rows of host tensors",
    "calibtune/data/_digest.py::dataset_digest": "hashes host copies of the data (lineage)",
    "calibtune/data/_ood.py::_svhn": "reads files into host memory",
    "calibtune/data/_ood.py::_corrupted": "CIFAR-10-C rows (read or generated) in host memory",
    "calibtune/data/_ood.py::_normalised": "host dataset constants",
    "calibtune/data/_ood.py::_digits_noise": "OOD set generated in host memory",
    "calibtune/data/_ood.py::_far_set": "host dataset labels",
    "calibtune/data/_shift.py::dataset_labels": "labels of a host dataset",
    "calibtune/data/_shift.py::load_shift": "reads files into host memory",
    "calibtune/data/_shift.py::_noisy_val_floats": "shift set generated in host memory",
    "calibtune/data/_tiny_imagenet.py::load_tiny_imagenet_splits.split": "decoded images in "
    "host memory; DeviceBatches uploads",
    "calibtune/demo.py::synthetic_overconfident": "the demo's synthetic logits, CPU only",
    "calibtune/losses/_adafocal.py::initial_edges": "module construction: the buffer moves "
    "with the module (`.to(device)`)",
    "calibtune/losses/_adafocal.py::_BinnedGammaLoss._configure": "module construction (buffer)",
    "calibtune/losses/_modules.py::FLSDLoss._configure": "module construction (buffer)",
    "calibtune/metrics/_bootstrap.py::bootstrap_indices": "a seeded CPU generator gives the same "
    "resamples on every device; `_weights` moves them to the data's device",
    "calibtune/metrics/_bootstrap.py::_smece": "relplot is NumPy: host values by design",
    "calibtune/metrics/_bootstrap.py::percentile_ci": "quantiles of host values (a summary)",
    "calibtune/metrics/validation.py::as_tensor": "array-likes are host data; tensors pass "
    "through on their own device",
    "calibtune/posthoc/_affine.py::_AffineCalibrator._configure": "module construction (buffer)",
    "calibtune/posthoc/_binning.py::HistogramBinning._configure": "module construction (buffer)",
    "calibtune/posthoc/_binning.py::IsotonicCalibration._configure": "module construction",
    "calibtune/posthoc/_focal.py::flush_level": "γ values as Python floats (hyper-parameters)",
    "calibtune/posthoc/_focal.py::FocalTemperatureScaling._configure": "module construction",
    "calibtune/posthoc/_grid.py::_equal_mass_rows": "the NumPy fast path runs for CPU inputs only",
    "calibtune/posthoc/_temperature.py::_beta": "a Python T becomes a 0-dim scalar, which "
    "PyTorch combines with tensors on any device; a tensor T keeps its device",
    "calibtune/posthoc/_temperature.py::TemperatureScaling._configure": "module construction",
    "calibtune/readers/_paired.py::_resampled": "driver-side report on host tables",
    "calibtune/readers/_paired.py::_paired_rows": "driver-side report on host tables",
    "calibtune/training/_batches.py::epoch_index_batches": "a seeded CPU permutation gives the "
    "same batches on every device and world size; DeviceBatches uploads it once per epoch",
    "calibtune/training/_batches.py::infer_logits": "row indices; uploaded once per pass",
    "calibtune/trial/_metrics.py::_param_names": "probes parameter names on a tiny CPU fit",
}


class _Factories(ast.NodeVisitor):
    """``path::function`` of every tensor factory call without ``device=`` in one file."""

    def __init__(self, rel: str, found: dict[str, list[int]]) -> None:
        self.rel, self.found, self.stack = rel, found, []

    def visit_FunctionDef(self, node: Any) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "torch"
            and f.attr in FACTORIES
            and not any(k.arg == "device" for k in node.keywords)
        ):
            where = f"{self.rel}::{'.'.join(self.stack) or '<module>'}"
            self.found.setdefault(where, []).append(node.lineno)
        self.generic_visit(node)


def _findings() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in sorted((ROOT / "calibtune").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        _Factories(rel, found).visit(ast.parse(path.read_text()))
    return found


def test_tensors_created_in_calibtune_take_their_device_from_an_input_or_the_trial():
    found = _findings()
    new = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not new, (
        "tensor factories without device= (pass device=<input>.device or the trial's device, "
        f"or add the place to ALLOWED with its reason): {new}"
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that no longer create a CPU tensor: {stale}"


def test_the_ast_check_finds_the_line_that_broke_the_gpu_trial(tmp_path, monkeypatch):
    """The line of issue 20 (`torch.tensor(float(seen), dtype=torch.float64)` in the loop)."""
    bad = "import torch\ndef f(seen):\n    return torch.tensor(float(seen), dtype=torch.float64)\n"
    pkg = tmp_path / "calibtune" / "training"
    pkg.mkdir(parents=True)
    (pkg / "_loop.py").write_text(bad)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _findings() == {"calibtune/training/_loop.py::f": [3]}


def test_progress_names_the_step_while_training():
    p = Progress(epoch=2, step=17, phase="training")
    assert p.where() == "epoch 2, step 17"
    assert Progress(epoch=2, phase="evaluation").where() == "epoch 2, evaluation"


# ------------------------------------------------------------------ resident = loader batches


def test_resident_cifar_batches_equal_the_loaders_for_the_same_generator_draws():
    """On the CPU the resident path draws the same numbers from the global RNG, in the same
    order, as the dataset's batched fetch that the DataLoader calls (``__getitems__``; the
    loader itself first draws a base seed): the augmented, normalised batches agree."""
    ds = _cifar_like(64, 3)
    idx = [torch.arange(0, 32), torch.arange(32, 64)]
    resident = DeviceBatches(ds, torch.device("cpu"))
    assert resident.resident
    torch.manual_seed(5)
    a = list(resident.batches(idx, train=True))
    torch.manual_seed(5)
    for (xa, ya), i in zip(a, idx, strict=True):
        xs, ys = zip(*ds.__getitems__(i.tolist()), strict=True)
        torch.testing.assert_close(xa, torch.stack(xs), rtol=1e-6, atol=1e-6)
        assert ya.tolist() == list(ys)
    torch.manual_seed(6)
    c = next(resident.batches(idx[:1], train=True))[0]
    assert not torch.allclose(c, a[0][0])  # augmentation draws anew
    plain = next(resident.batches(idx[:1]))[0]  # evaluation: no augmentation
    torch.testing.assert_close(plain, ds.normalized()[:32])
    streamed = DeviceBatches(ds, torch.device("cpu"), num_workers=2)  # a CPU with loader workers
    assert not streamed.resident


def test_train_loss_is_the_mean_per_sample_loss_whatever_the_reduction():
    out = {}
    for reduction in ("mean", "sum"):
        torch.manual_seed(0)
        spec = _spec(torch.device("cpu"), "focal", "digits", n=100)  # batches of 32, 32, 32, 4
        spec.loss_fn = LossConfig("focal", {"gamma": 2.0}, reduction=reduction).build()
        spec.lr_at = lambda e: 0.0  # no update: both reductions see the same logits
        spec.augment = None
        loss_sum, _, seen = loop._train_epoch(
            spec, loop._Sources.of(spec), 1, 0.0, lambda ds: None
        )[0].tolist()
        out[reduction] = loss_sum / seen
    assert out["sum"] == pytest.approx(out["mean"], rel=1e-6)  # float32 sum vs mean·B


def test_samples_per_second_is_reported_every_epoch():
    spec = _spec(torch.device("cpu"), "cross_entropy", "digits", n=96)
    seen: list[dict] = []
    train_epochs(spec, on_epoch_end=lambda e, m, c: seen.append(m))
    assert seen[0]["samples_per_s"] == pytest.approx(96 / seen[0]["train_time"])
    assert "gpu_util" not in seen[0] and "gpu_mem_gib" not in seen[0]  # never guessed on a CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_utilisation_and_peak_memory_are_measured_on_cuda():
    from calibtune.training._utilisation import DeviceMonitor

    dev = torch.device("cuda")
    monitor = DeviceMonitor(dev, period_s=0.05).start()
    a = torch.randn(4096, 4096, device=dev)
    for _ in range(200):
        a = torch.tanh(a @ a)
    torch.cuda.synchronize()
    out = monitor.stop()
    assert out["gpu_mem_gib"] > 0.06  # two 64 MiB matrices at least
    assert 0.0 < out["gpu_util"] <= 100.0  # NVML (the gpu extra) is installed: the key arrives

"""ImageNet from a prepared folder (issue 44, item 4): layout checks, streamed splits, loader
workers counted in the trial's Ray CPUs, the paper study.

On a tiny ImageNet-layout tree written in ``tmp_path`` (3 classes of small JPEGs): nothing is
stubbed; the loader, Pillow and the ``DataLoader`` workers run for real.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from calibtune.cli import main
from calibtune.data import dataset_digest, load_splits, stratified_holdout, verify_set
from calibtune.data._common import validation_count
from calibtune.models import build_model
from calibtune.training import DeviceBatches, LoopSpec, train_epochs
from calibtune.trial import config_from_dict
from tests.test_data import write_jpeg

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("n01440764", "n01443537", "n01484850")
PER_CLASS = 4  # train and val images per class


def write_layout(root: Path, per_class: int = PER_CLASS) -> Path:
    """``<root>/imagenet/{train,val}/<wnid>/*.JPEG``: JPEGs of different sizes, one greyscale
    file per split (ImageNet has greyscale and CMYK files among its JPEGs), each image one flat
    colour of its class so that a decoded, centre-cropped pixel is known."""
    folder = root / "imagenet"
    for split in ("train", "val"):
        for k, wnid in enumerate(CLASSES):
            (folder / split / wnid).mkdir(parents=True)
            for i in range(per_class):
                channels = 1 if (k, i) == (0, 0) else 3
                size = (channels, 20 + 3 * i, 28 + 2 * k)
                image = torch.full(size, 60 * (k + 1), dtype=torch.uint8)
                name = f"{wnid}_{i}.JPEG" if split == "train" else f"ILSVRC2012_val_{k}{i}.JPEG"
                write_jpeg(folder / split / wnid / name, image)
    return folder


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_layout(tmp_path)
    return tmp_path


def test_verify_passes_a_consistent_layout_and_reports_its_counts(root: Path) -> None:
    check = verify_set("imagenet", root)
    assert check.status == "ok", check.line()
    assert check.detail == (
        "3 classes, 12 train / 12 val images, every header read; "
        "not ILSVRC-2012's 1,000 / 1,281,167 / 50,000"
    )
    quick = verify_set("imagenet", root, full=False)
    assert (quick.status, quick.detail.split(";")[0]) == (
        "ok",
        "3 classes, 12 train / 12 val images (layout only)",
    )


def _loose_val(folder: Path) -> None:  # val/ as the archive unpacks it, before valprep.sh
    for f in (folder / "val" / CLASSES[0]).iterdir():
        f.rename(folder / "val" / f.name)
    (folder / "val" / CLASSES[0]).rmdir()


def _extra_train_class(folder: Path) -> None:
    (folder / "train" / "n09999999").mkdir()
    write_jpeg(folder / "train" / "n09999999" / "a.JPEG", torch.zeros(3, 8, 8, dtype=torch.uint8))


def _empty_class(folder: Path) -> None:
    for f in (folder / "val" / CLASSES[1]).iterdir():
        f.unlink()


def _bad_file(folder: Path) -> None:
    (folder / "val" / CLASSES[2] / "ILSVRC2012_val_21.JPEG").write_bytes(b"not a jpeg")


@pytest.mark.parametrize(
    ("breakage", "status", "message"),
    [
        (lambda f: None, "missing", r"imagenet/ with train/<wnid>/\*\.JPEG .*\(missing: val/\)"),
        (_loose_val, "failed", r"got 4 images directly in val/; sort them .* valprep\.sh"),
        (
            _extra_train_class,
            "failed",
            r"expected the same class folders in train/ and val/, got 1 only in train/ "
            r"\['n09999999'\] and 0 only in val/ \[\]",
        ),
        (_empty_class, "failed", r"val/n01443537/: expected at least one \.JPEG image, got none"),
        (_bad_file, "failed", r"ILSVRC2012_val_21\.JPEG: cannot identify image file"),
    ],
)
def test_verify_refuses_a_broken_layout_in_one_line(
    tmp_path: Path, breakage, status: str, message: str
) -> None:
    folder = write_layout(tmp_path)
    if status == "missing":
        for f in (folder / "val").rglob("*"):
            if f.is_file():
                f.unlink()
        for d in sorted((folder / "val").iterdir()):
            d.rmdir()
        (folder / "val").rmdir()
    breakage(folder)
    check = verify_set("imagenet", tmp_path)
    assert check.status == status, check.line()
    assert "\n" not in check.line()
    assert __import__("re").search(message, check.detail), check.detail


def test_cli_verifies_by_name_and_refuses_to_fetch(root: Path, capsys) -> None:
    assert main(["data", "verify", "imagenet", "--root", str(root)]) == 0
    assert capsys.readouterr().out.startswith("imagenet: ok: 3 classes, 12 train / 12 val")
    _bad_file(root / "imagenet")
    assert main(["data", "verify", "imagenet", "--root", str(root)]) == 2
    assert "imagenet: failed: " in capsys.readouterr().out
    assert main(["data", "fetch", "imagenet", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "imagenet cannot be downloaded by calibtune" in err and "\n" not in err
    assert "calibtune data verify imagenet --root DIR" in err


def test_splits_stream_decoded_crops_and_split_the_val_images_by_class(root: Path) -> None:
    s = load_splits("imagenet", root=root, seed=1, val_fraction=0.5)
    assert (len(s.train), len(s.val), len(s.test)) == (12, 6, 6)
    assert (s.num_classes, s.input_shape) == (3, (3, 224, 224))
    # half of every class's val images on each side, disjoint, together the whole val folder
    assert np.bincount(s.val.labels.numpy()).tolist() == [2, 2, 2]
    assert np.bincount(s.test.labels.numpy()).tolist() == [2, 2, 2]
    files = {bytes(f) for f in s.val.files} | {bytes(f) for f in s.test.files}
    assert len(files) == 12 and not {bytes(f) for f in s.val.files} & {
        bytes(f) for f in s.test.files
    }
    # evaluation: resize 256 + centre crop 224 of a flat colour, normalised with ImageNet's
    # statistics ((v/255 − mean)/std per channel; JPEG may move a flat colour by a level or two)
    x, y = s.test[0]
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32
    value = 60.0 * (y + 1)
    for c, (m, sd) in enumerate(zip(s.mean, s.std, strict=True)):
        assert x[c].mean().item() == pytest.approx((value / 255 - m) / sd, abs=3 / 255 / sd)
    # no resident tensor: the trial streams these splits through its loader
    assert not DeviceBatches(s.train, torch.device("cpu")).resident
    # the digest hashes paths, sizes and labels, and follows a changed file
    before = dataset_digest(s.test)
    assert before == dataset_digest(load_splits("imagenet", root=root, val_fraction=0.5).test)
    write_jpeg(s.test.path(0), torch.zeros(3, 50, 50, dtype=torch.uint8))
    assert dataset_digest(s.test) != before


def test_one_epoch_streams_through_two_loader_workers(root: Path) -> None:
    s = load_splits("imagenet", root=root, seed=1, val_fraction=0.5)
    torch.manual_seed(0)
    model = build_model("small_cnn", s.num_classes, s.input_shape)
    reports: list[dict] = []
    spec = LoopSpec(
        model=model,
        loss_fn=torch.nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        lr_at=lambda e: 0.01,
        train_set=s.train,
        val_set=s.val,
        test_set=s.test,
        epochs=1,
        batch_size=4,
        eval_batch_size=6,
        loader_workers=2,
    )
    train_epochs(spec, on_epoch_end=lambda e, m, c: reports.append(m))
    assert len(reports) == 1
    assert math.isfinite(reports[0]["train/loss"]) and 0.0 <= reports[0]["val/error"] <= 1.0


def _trial(loader_workers: int, **scaling) -> dict:
    return {
        "data": {"name": "imagenet", "val_fraction": 0.5},
        "model": {"name": "resnet50_imagenet"},
        "train": {"loader_workers": loader_workers},
        "scaling": scaling,
    }


def test_loader_workers_must_fit_in_the_trials_ray_cpus() -> None:
    with pytest.raises(
        ValueError,
        match=r"^train\.loader_workers: expected at most 0 \(imagenet decodes in the loader "
        r"workers beside the trial's own process, all counted in its Ray bundle of CPU 1; set "
        r"scaling\.resources_per_worker\.CPU to 5 or lower train\.loader_workers\), got 4$",
    ):
        config_from_dict(_trial(4))
    with pytest.raises(ValueError, match=r"expected at most 3 .* CPU 4; .* got 4$"):
        config_from_dict(_trial(4, resources_per_worker={"CPU": 4}))
    assert config_from_dict(_trial(4, resources_per_worker={"CPU": 5})).train.loader_workers == 4
    assert config_from_dict(_trial(0)).train.loader_workers == 0
    # in-memory sets: loader workers are not the trial's decoding processes, nothing refused
    cifar = {"data": {"name": "cifar10"}, "train": {"loader_workers": 4}}
    assert config_from_dict(cifar).train.loader_workers == 4


def test_the_paper_study_validates_with_ghoshs_imagenet_protocol() -> None:
    from calibtune.study import load_study

    study = load_study(ROOT / "studies" / "ghosh2022_adafocal_imagenet.yaml")
    b = study.base_config()
    assert (b.data.name, b.model.name) == ("imagenet", "resnet50_imagenet")
    assert (b.train.epochs, b.milestones(), b.train.batch_size) == (90, (30, 60), 128)
    assert (b.optimizer.name, b.optimizer.lr, b.optimizer.momentum) == ("sgd", 0.01, 0.9)
    assert (b.optimizer.weight_decay, b.schedule.gamma) == (1e-4, 0.1)
    assert b.train.loader_workers + 1 <= b.scaling.resources_per_worker["CPU"]
    thresholds = [
        study.loss(c.label).loss.space.fixed.get("switch_threshold") for c in study.losses
    ]
    assert thresholds[-2:] == [0.2, 0.5]  # AdaFocal as Table 1, and Fig. 4(d)'s S_th = 0.5
    # the 50,000 validation images (50 per class) split 25,000 / 25,000, 25 of each class
    labels = np.repeat(np.arange(1000), 50)
    n_val = validation_count(b.data.val_fraction, labels.size, "imagenet")
    test, val = stratified_holdout(labels, n_val, b.data.split_seed)
    assert (val.size, test.size) == (25_000, 25_000)
    assert np.array_equal(np.bincount(labels[val], minlength=1000), np.full(1000, 25))

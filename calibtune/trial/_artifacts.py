"""What a finished trial leaves in ``<trial>/artifacts/``: its config, metrics, history, tables
for the figures, cached logits and the figures themselves (rendered from these files).

The folder belongs to the storage owner (`calibtune.storage`): on a disk the files are written
in place; for a bucket they are written to a local cache folder (matplotlib and MLflow's
``log_artifacts`` take local files) and then uploaded, each file one complete object."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calibtune._io import cache_home
from calibtune.storage import Storage, open_storage
from calibtune.trial._checkpoint import save_tensors
from calibtune.trial._config import TrialConfig, save_config

# Lazy: `calibtune.plots` (matplotlib: about a quarter of importing `calibtune.trial` again, by
# `python -X importtime`) only when `eval.figures` asks for figures, not in every Ray worker.

__all__ = ["drop_stage", "jsonable", "local_stage", "scalars", "staged_copy", "write_artifacts"]


def jsonable(x: Any) -> Any:
    """``x`` with tensors/arrays as lists and non-finite floats as None (JSON has neither)."""
    if isinstance(x, torch.Tensor):
        return jsonable(x.detach().cpu().tolist())
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a report (what Tune takes; lists stay in MLflow and artifacts)."""
    return {k: v for k, v in metrics.items() if isinstance(v, int | float)}


@contextlib.contextmanager
def local_stage(where: str | os.PathLike[str] | Storage) -> Iterator[Path]:
    """A local folder standing for ``where``: the folder itself on a disk; for a bucket, a cache
    folder (``$XDG_CACHE_HOME/calibtune/stage/…``) whose files are uploaded to ``where`` when the
    block ends without an error (each one a complete object: `Storage.write_bytes`)."""
    target = open_storage(where)
    if target.is_local:
        local = target.local_path()
        local.mkdir(parents=True, exist_ok=True)
        yield local
        return
    local = _stage_of(target)
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    yield local
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        target.join(f.relative_to(local).as_posix()).write_bytes(f.read_bytes())


def _stage_of(target: Storage) -> Path:
    return cache_home() / "stage" / target.scheme / target.path


def staged_copy(where: str | os.PathLike[str] | Storage) -> Path:
    """A local folder holding the files of ``where``: the folder itself on a disk; for a bucket,
    its stage folder (`local_stage`), downloaded again when this machine has none (a trial
    reused on another node than the one that trained it)."""
    target = open_storage(where)
    if target.is_local:
        return target.local_path()
    local = _stage_of(target)
    if local.is_dir():
        return local
    tmp = local.with_name(f".{local.name}.{os.getpid()}.part")
    shutil.rmtree(tmp, ignore_errors=True)
    _download(target, tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # another process made it meanwhile: that one stays
        tmp.rename(local)
    shutil.rmtree(tmp, ignore_errors=True)
    return local


def _download(folder: Storage, local: Path) -> None:
    for name in folder.listdir():
        item = folder / name
        if item.is_dir():
            _download(item, local / name)
        else:
            local.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(item.read_bytes())


def drop_stage(where: str | os.PathLike[str] | Storage) -> None:
    """Remove a bucket folder's local stage (its files are in the bucket; `staged_copy` brings
    them back when needed); a disk's folder is the files themselves and stays."""
    target = open_storage(where)
    if not target.is_local:
        shutil.rmtree(_stage_of(target), ignore_errors=True)


def write_artifacts(
    art: str | os.PathLike[str] | Storage,
    *,
    cfg: TrialConfig,
    final: Any,
    history: list[dict[str, Any]],
    gamma_history: list[Any],
    logits: dict[str, torch.Tensor],
    figures: bool = True,
) -> Path:
    """Write every artifact file, then (``eval.figures`` and ``figures``) the figures made from
    them; ``figures=False`` when a callback has them rendered elsewhere (a study's driver:
    `calibtune.record._tracking.render_deferred_figures`). Returns the local folder holding
    them (`local_stage`: the folder itself, or the cache copy of a bucket's) for callbacks
    that read local files (MLflow)."""
    with local_stage(art) as local:
        _write(local, cfg, final, history, gamma_history, logits, figures)
    return local


def _write(
    art: Path,
    cfg: TrialConfig,
    final: Any,
    history: list[dict[str, Any]],
    gamma_history: list[Any],
    logits: dict[str, torch.Tensor],
    figures: bool,
) -> None:
    shutil.rmtree(art / "figures", ignore_errors=True)  # a resumed run re-renders them
    art.mkdir(parents=True, exist_ok=True)
    save_config(cfg, art / "config.yaml")
    files = {
        "metrics.json": final.metrics,
        "reliability.json": final.reliability,
        "posthoc_params.json": final.posthoc_params,
        "gamma_history.json": gamma_history,
        "roc.json": final.roc,
        "shift.json": final.shift,
        "risk_coverage.json": final.risk_coverage,
        "environment.json": {"torch_threads": torch.get_num_threads(), "torch": torch.__version__},
    }
    for name, data in files.items():
        (art / name).write_text(
            json.dumps(jsonable(data), indent=1 if name == "metrics.json" else None)
        )
    (art / "history.jsonl").write_text("".join(json.dumps(jsonable(h)) + "\n" for h in history))
    save_tensors({k: v.contiguous() for k, v in logits.items()}, art / "logits.pt")
    # per-sample test confidence/correctness per method: what `report --baseline` resamples
    np.savez_compressed(art / "test_predictions.npz", **final.predictions)
    if cfg.eval.figures and figures:
        # matplotlib: a study's trial defers its figures to the driver (test_deferred_figures)
        from calibtune.plots import save_trial_figures

        save_trial_figures(art)

"""The pure training loop (no Ray): epochs, cached-logit evaluation, adaptive-loss updates.

`calibtune.trial` runs it inside Ray Train; tests and benchmarks can run it in a bare process.
"""

from calibtune.training._batches import (
    DeviceBatches,
    dataset_tensors,
    epoch_index_batches,
    gather_rows,
    infer_logits,
    iterate_batches,
    world_info,
)
from calibtune.training._final import FinalEvaluation, OODLogits, evaluate_final
from calibtune.training._loop import (
    EpochCache,
    LoopSpec,
    NonFiniteLossError,
    Progress,
    epoch_metrics,
    lr_schedule,
    train_epochs,
)
from calibtune.training._precision import PRECISIONS, Precision, float32_head, tf32_enabled
from calibtune.training._shift import ShiftLogits, epoch_val_shift, shift_logits, shift_metrics
from calibtune.training._uncertainty import prediction_name
from calibtune.training._utilisation import cuda_unavailable_reason

__all__ = [
    "PRECISIONS",
    "DeviceBatches",
    "EpochCache",
    "FinalEvaluation",
    "LoopSpec",
    "NonFiniteLossError",
    "OODLogits",
    "Precision",
    "Progress",
    "ShiftLogits",
    "cuda_unavailable_reason",
    "dataset_tensors",
    "epoch_index_batches",
    "epoch_metrics",
    "epoch_val_shift",
    "evaluate_final",
    "float32_head",
    "gather_rows",
    "infer_logits",
    "iterate_batches",
    "lr_schedule",
    "prediction_name",
    "shift_logits",
    "shift_metrics",
    "tf32_enabled",
    "train_epochs",
    "world_info",
]

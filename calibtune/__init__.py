"""calibtune: calibration-aware training and Ray-based hyperparameter studies.

Subpackages: `calibtune.metrics`, `calibtune.posthoc`, `calibtune.losses`, `calibtune.data`,
`calibtune.models`, `calibtune.trial`, `calibtune.study`. Import them directly; this module stays
light so that ``import calibtune`` does not pull in Ray or MLflow.
"""

__version__ = "0.1.0"

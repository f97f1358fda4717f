"""The run directory's file names and its outputs, written atomically (:mod:`kerasdist._files`):
a crash never leaves a truncated file in place.

Keras's ``model.save`` truncates its target before writing, so a crash mid-save would lose the
previous good model; :func:`save_model_atomic` saves to a temporary name and moves it over.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerasdist._files import read_json, write_atomic, write_json_atomic

if TYPE_CHECKING:
    from kerasdist.config import Recipe


# The run directory's layout: every name kerasdist writes there (``RunDir`` in
# :mod:`kerasdist.training.rundir` gives their paths; no other module spells them) but the
# tracker's (``TRACKING_ENTRIES``, :mod:`kerasdist.tracking.mlflow_store`).
RUN_INFO = "run.json"
METRICS = "metrics.json"
MODEL = "model.keras"
INFERENCE_MODEL = "inference_model.keras"  # a csv run: the model behind its preprocessing
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
LOG_DIR = "logs"
RAY_DIR = "ray"
EVAL_FILE = "eval.json"
LOCK_NAME = ".kerasdist.lock"
TASK_RECIPE = "recipe.json"


def save_model_atomic(model, path: str | Path) -> Path:
    """Save ``model`` in the Keras ``.keras`` format without ever truncating an existing file.

    Called by the chief alone (the recipe path), so the every-worker save of
    :mod:`kerasdist._compat.keras_chief_saves`, whose barrier needs every worker, is bypassed."""
    from kerasdist._compat._worker_saves import passthrough

    with passthrough():
        return write_atomic(path, model.save, suffix=".keras")  # Keras requires the suffix


def model_fingerprint(recipe: Recipe, checkpoint_schema: str) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed: the recipe's model section and the
    checkpoint schema the strategy reads (``StrategyTraits.checkpoint_schema``). The model
    fields added in kerasdist 0.3 (``from``, ``trainable_layers``) are left out while unset, so
    run directories written before them still resume."""
    model = recipe.model.model_dump(mode="json")
    for key in ("from", "trainable_layers"):
        if model.get(key) is None:
            model.pop(key, None)
    return {"model": model, "checkpoint_schema": checkpoint_schema}


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's ``run.json``, or None if missing or unreadable."""
    data = read_json(Path(run_dir) / RUN_INFO)
    return data if isinstance(data, dict) else None


def write_run_info(run_dir: Path, recipe: Recipe, checkpoint_schema: str) -> Path:
    """Write ``run.json`` (atomically): fingerprint, the strategy kind that wrote it, the recipe."""
    from kerasdist._version import __version__

    run_dir.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(run_dir / RUN_INFO, {
        "fingerprint": model_fingerprint(recipe, checkpoint_schema),
        "strategy": recipe.strategy.kind, "kerasdist": __version__,
        "recipe": recipe.model_dump(mode="json")})

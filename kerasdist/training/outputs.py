"""Run-directory outputs written atomically: a crash never leaves a truncated file in place.

Keras's ``model.save`` truncates its target before writing, so a crash mid-save would lose the
previous good model. Here every file is written to a temporary name in the same folder and moved
over the old one with ``os.replace`` (atomic on POSIX and Windows within one filesystem).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kerasdist.errors import RunDirError

RUN_INFO = "run.json"
CHECKPOINT_DIR = "checkpoints"


def _temp_path(target: Path, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    return Path(name)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file + ``os.replace``."""
    path = Path(path)
    tmp = _temp_path(path, ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def save_model_atomic(model, path: str | Path) -> Path:
    """Save ``model`` in the Keras ``.keras`` format without ever truncating an existing file."""
    path = Path(path)
    tmp = _temp_path(path, ".keras")  # Keras requires the .keras suffix
    try:
        model.save(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def model_fingerprint(recipe) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed: the model section of the recipe."""
    return {"model": recipe.model.model_dump(mode="json")}


def check_run_dir(run_dir: Path, recipe, *, overwrite: bool) -> bool:
    """Refuse a run directory holding checkpoints of a different model.

    Returns:
        True when the directory holds checkpoints of this model (the run will resume).

    Raises:
        RunDirError: checkpoints of another model (or of unknown origin) are present and
            ``overwrite`` is False.
    """
    ckpt_dir = run_dir / CHECKPOINT_DIR
    has_ckpt = ckpt_dir.is_dir() and any(ckpt_dir.iterdir())
    if not has_ckpt or overwrite:
        return False
    info_path = run_dir / RUN_INFO
    try:
        previous = json.loads(info_path.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError):
        previous = None
    wanted = model_fingerprint(recipe)
    if previous != wanted:
        raise RunDirError(
            f"output.run_dir '{run_dir}' holds a checkpoint of a different model "
            f"(found: {previous}; this recipe: {wanted}). Use another output.run_dir, or pass "
            "--overwrite to discard that checkpoint."
        )
    return True

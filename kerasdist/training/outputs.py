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
from typing import TYPE_CHECKING, Any

from kerasdist.errors import RunDirError

if TYPE_CHECKING:
    from kerasdist.config import Recipe


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


def model_fingerprint(recipe: Recipe, checkpoint_schema: str) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed: the recipe's model section and the
    checkpoint schema the strategy reads (``StrategyTraits.checkpoint_schema``)."""
    return {"model": recipe.model.model_dump(mode="json"), "checkpoint_schema": checkpoint_schema}


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's ``run.json``, or None if missing or unreadable."""
    try:
        data = json.loads((Path(run_dir) / RUN_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_run_info(run_dir: Path, recipe: Recipe, checkpoint_schema: str) -> Path:
    """Write ``run.json`` (atomically): fingerprint, the strategy kind that wrote it, the recipe."""
    from kerasdist._version import __version__

    run_dir.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(run_dir / RUN_INFO, {
        "fingerprint": model_fingerprint(recipe, checkpoint_schema),
        "strategy": recipe.strategy.kind, "kerasdist": __version__,
        "recipe": recipe.model_dump(mode="json")})


def check_run_dir(run_dir: Path, recipe: Recipe, *, checkpoint_schema: str, overwrite: bool) -> bool:
    """Refuse a run directory whose checkpoints this recipe cannot restore.

    A checkpoint can be continued by any strategy that reads the same checkpoint schema
    (default -> mirrored -> multi_worker at the exact step), but not by another model or
    schema. Reads only; writes nothing.

    Returns:
        True when the directory holds checkpoints this run will resume from.

    Raises:
        RunDirError: checkpoints of another model, another checkpoint schema (e.g. written by an
            older kerasdist) or of unknown origin are present and ``overwrite`` is False; the
            message names what was found (model, schema, strategy) and what was requested.
    """
    ckpt_dir = run_dir / CHECKPOINT_DIR
    has_ckpt = ckpt_dir.is_dir() and any(ckpt_dir.iterdir())
    if not has_ckpt or overwrite:
        return False
    info = read_run_info(run_dir) or {}
    previous = info.get("fingerprint")
    wanted = model_fingerprint(recipe, checkpoint_schema)
    if previous == wanted:
        return True
    found_schema = (previous or {}).get("checkpoint_schema", "kerasdist-0.1 (no schema version)")
    found_kind = info.get("strategy") or (info.get("recipe") or {}).get("strategy", {}).get("kind")
    if previous and previous.get("model") == wanted["model"]:
        what = (f"checkpoints in schema '{found_schema}' (strategy '{found_kind}'), which strategy "
                f"'{recipe.strategy.kind}' (schema '{checkpoint_schema}') cannot restore")
    else:
        what = (f"a checkpoint of a different model (found: model {(previous or {}).get('model')}, "
                f"schema '{found_schema}', strategy '{found_kind}'; this recipe: model "
                f"{wanted['model']}, schema '{checkpoint_schema}', strategy "
                f"'{recipe.strategy.kind}')")
    raise RunDirError(f"output.run_dir '{run_dir}' holds {what}. Use another output.run_dir, or "
                      "pass --overwrite to discard those checkpoints.")

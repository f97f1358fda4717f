"""Saving cases: ``model.save`` (.keras) + ``load_model``, and ``model.export`` (SavedModel).

Under a multi-worker strategy every task runs the save (as users' scripts do); the chief writes
the shared path and the other tasks a private temporary folder, which is removed. The own-path
cases (:func:`save_own_path`, :func:`check_checkpoint_own`) have every task save, checkpoint and
export to its own folder ``own/<task>`` instead, as onto a worker's local disk.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from kerasdist.conformance.callback_cases import _weights_match
from kerasdist.conformance.case import task_name


def _save_on_chief(workdir: Path, name: str, is_chief: bool, save) -> None:
    """``save(path)`` to ``workdir/name`` on the chief, else to a private temporary folder,
    removed afterwards."""
    if is_chief:
        save(workdir / name)
        return
    temp = tempfile.mkdtemp(prefix="kerasdist-conformance-")
    save(Path(temp) / name)
    shutil.rmtree(temp, ignore_errors=True)


def save_keras(model, workdir: Path, is_chief: bool) -> None:
    _save_on_chief(workdir, "model.keras", is_chief, model.save)


def export(model, workdir: Path, is_chief: bool) -> None:
    _save_on_chief(workdir, "export", is_chief, lambda path: model.export(str(path), verbose=False))


def _same_as_predict(model_or_outputs, result: dict, what: str) -> list[str]:
    """Problems when a model's (or its outputs') predictions of the ``dense`` set differ from
    the trained model's ``predict``."""
    from kerasdist.conformance.data import make

    outputs = model_or_outputs
    if hasattr(model_or_outputs, "predict"):
        outputs = model_or_outputs.predict(make("dense")["x"], verbose=0)
    expected = result["predict"][0]
    got = np.asarray(outputs)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
        diff = np.max(np.abs(got - expected)) if got.shape == expected.shape else "shape"
        return [f"{what} outputs differ from the trained model's predict (max abs diff {diff})"]
    return []


def check_keras(workdir: Path, result: dict, build) -> list[str]:
    import keras

    path = workdir / "model.keras"
    if not path.is_file():
        return ["model.save wrote no model.keras"]
    return _same_as_predict(keras.saving.load_model(path), result, "load_model")


def check_export(workdir: Path, result: dict, build) -> list[str]:
    import tensorflow as tf

    from kerasdist.conformance.data import make

    path = workdir / "export"
    if not path.is_dir():
        return ["model.export wrote no SavedModel"]
    restored = tf.saved_model.load(str(path))
    return _same_as_predict(restored.serve(tf.constant(make("dense")["x"])), result,
                            "the exported SavedModel's serve")


def save_every_worker(model, workdir: Path, is_chief: bool) -> None:
    """Every task saves to the same shared path, as an unchanged one-process script does."""
    model.save(workdir / "every.keras")
    model.save_weights(workdir / "every.weights.h5")


def check_every_worker(workdir: Path, result: dict, build) -> list[str]:
    import keras

    names = sorted(p.name for p in workdir.iterdir() if p.name.startswith(("every", ".kerasdist")))
    if names != ["every.keras", "every.weights.h5"]:
        return [f"the shared folder holds {names}, not one every.keras and one every.weights.h5"]
    problems = _same_as_predict(keras.saving.load_model(workdir / "every.keras"), result,
                                "load_model")
    rebuilt = build()
    rebuilt.load_weights(workdir / "every.weights.h5")
    return problems + _same_as_predict(rebuilt, result, "load_weights")


def _own(workdir: Path) -> Path:
    """This task's own folder (as a worker's local disk would be): ``own/<task>``."""
    folder = workdir / "own" / task_name()[0]
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _owned(workdir: Path) -> list[Path]:
    root = workdir / "own"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def save_own_path(model, workdir: Path, is_chief: bool) -> None:
    """Every task saves, saves weights and exports to its own folder (not a shared one)."""
    folder = _own(workdir)
    model.save(folder / "model.keras")
    model.save_weights(folder / "model.weights.h5")
    model.export(str(folder / "export"), verbose=False)


def check_own_path(workdir: Path, result: dict, build) -> list[str]:
    """Problems with what :func:`save_own_path` wrote: each task's folder must hold the three
    saves, and each must predict as the trained model did."""
    import keras
    import tensorflow as tf

    from kerasdist.conformance.data import make

    folders = _owned(workdir)
    if not folders:
        return ["no task wrote its own folder under own/"]
    problems = []
    for folder in folders:
        names = sorted(p.name for p in folder.iterdir())
        if names != ["export", "model.keras", "model.weights.h5"]:
            problems.append(f"own/{folder.name} holds {names}, not export, model.keras and "
                            "model.weights.h5")
            continue
        problems += _same_as_predict(keras.saving.load_model(folder / "model.keras"), result,
                                     f"own/{folder.name}/model.keras")
        rebuilt = build()
        rebuilt.load_weights(folder / "model.weights.h5")
        problems += _same_as_predict(rebuilt, result, f"own/{folder.name}/model.weights.h5")
        restored = tf.saved_model.load(str(folder / "export"))  # held: serve reads its variables
        problems += _same_as_predict(restored.serve(tf.constant(make("dense")["x"])), result,
                                     f"own/{folder.name}/export")
    return problems


def checkpoint_own(workdir: Path, record: dict):
    """Callbacks that checkpoint to this task's own folder: ``ModelCheckpoint`` (.keras and
    weights only) and ``BackupAndRestore(save_freq=2)``."""
    import keras

    folder = _own(workdir)
    return [keras.callbacks.ModelCheckpoint(str(folder / "last.keras")),
            keras.callbacks.ModelCheckpoint(str(folder / "last.weights.h5"),
                                            save_weights_only=True),
            keras.callbacks.BackupAndRestore(str(folder / "backup"), save_freq=2,
                                             delete_checkpoint=False)]


def check_checkpoint_own(workdir: Path, result: dict, build) -> list[str]:
    """Problems with what :func:`checkpoint_own` wrote: each task's checkpoints and first backup
    must hold the trained weights (the backups are removed afterwards)."""
    import keras

    folders = _owned(workdir)
    if not folders:
        return ["no task wrote its own folder under own/"]
    problems = []
    for folder in folders:
        where = f"own/{folder.name}"
        if not (folder / "last.keras").is_file() or not (folder / "last.weights.h5").is_file():
            problems.append(f"{where}: ModelCheckpoint wrote {sorted(p.name for p in folder.iterdir())}")
            continue
        loaded = keras.saving.load_model(folder / "last.keras", compile=False)
        problems += _weights_match(loaded.get_weights(), result, f"{where}/last.keras")
        rebuilt = build()
        rebuilt.load_weights(folder / "last.weights.h5")
        problems += _weights_match(rebuilt.get_weights(), result, f"{where}/last.weights.h5")
        backups = sorted((folder / "backup").glob("*.weights.h5"))
        if not backups:
            problems.append(f"{where}: BackupAndRestore(save_freq=2) left no weights file")
            continue
        rebuilt = build()
        rebuilt.load_weights(backups[0])
        problems += _weights_match(rebuilt.get_weights(), result, f"{where}/backup")
    for folder in folders:
        shutil.rmtree(folder / "backup", ignore_errors=True)
    return problems

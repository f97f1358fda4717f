"""Saving cases: ``model.save`` (.keras) + ``load_model``, and ``model.export`` (SavedModel).

Under a multi-worker strategy every task runs the save (as users' scripts do); the chief writes
the shared path and the other tasks a private temporary folder, which is removed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np


def _target(workdir: Path, name: str, is_chief: bool) -> tuple[Path, str | None]:
    if is_chief:
        return workdir / name, None
    temp = tempfile.mkdtemp(prefix="kerasdist-conformance-")
    return Path(temp) / name, temp


def save_keras(model, workdir: Path, is_chief: bool) -> None:
    path, temp = _target(workdir, "model.keras", is_chief)
    model.save(path)
    if temp:
        shutil.rmtree(temp, ignore_errors=True)


def export(model, workdir: Path, is_chief: bool) -> None:
    path, temp = _target(workdir, "export", is_chief)
    model.export(str(path), verbose=False)
    if temp:
        shutil.rmtree(temp, ignore_errors=True)


def _same_as_predict(outputs, result: dict, what: str) -> list[str]:
    expected = result["predict"][0]
    got = np.asarray(outputs)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
        diff = np.max(np.abs(got - expected)) if got.shape == expected.shape else "shape"
        return [f"{what} outputs differ from the trained model's predict (max abs diff {diff})"]
    return []


def check_keras(workdir: Path, result: dict, build) -> list[str]:
    import keras

    from kerasdist.conformance.data import make

    path = workdir / "model.keras"
    if not path.is_file():
        return ["model.save wrote no model.keras"]
    loaded = keras.saving.load_model(path)
    return _same_as_predict(loaded.predict(make("dense")["x"], verbose=0), result, "load_model")


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

    from kerasdist.conformance.data import make

    problems = []
    names = sorted(p.name for p in workdir.iterdir() if p.name.startswith(("every", ".kerasdist")))
    if names != ["every.keras", "every.weights.h5"]:
        return [f"the shared folder holds {names}, not one every.keras and one every.weights.h5"]
    loaded = keras.saving.load_model(workdir / "every.keras")
    problems += _same_as_predict(loaded.predict(make("dense")["x"], verbose=0), result, "load_model")
    rebuilt = build()
    rebuilt.load_weights(workdir / "every.weights.h5")
    problems += _same_as_predict(rebuilt.predict(make("dense")["x"], verbose=0), result,
                                 "load_weights")
    return problems

"""Issue 40's widening of the matrix: sparse gradients under every Keras optimizer that takes
them, saving to each task's own (unshared) path, ``jit_compile=True``, and Keras 3 features the
earlier rows did not touch (convolution and pooling, Bidirectional, GroupNormalization,
EinsumDense, Huber and focal losses, the Lamb optimizer, the SwapEMAWeights callback).

Sparse rows train ``Embedding(200, 8)`` on token ids drawn from 200 (``wide_tokens``): a global
batch of 16 x 6 ids touches at most 96 of the 200 rows, so the ``IndexedSlices`` gradient path
(rows a batch did not touch, duplicate ids, the mean over replicas) is what decides the weights.
Each row compares the trained weights and optimizer state with the strategy-free run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from kerasdist.conformance import models
from kerasdist.conformance.case import Case, sgd_compile, task_name
from kerasdist.conformance.data import CLASSES, FEATURES, SEQ_LEN, WIDE_VOCAB

# (case suffix, shown name, keras.optimizers class name, keyword arguments)
SPARSE_OPTIMIZERS = (
    ("adam", "Adam", "Adam", {}),
    ("adamw", "AdamW", "AdamW", {"weight_decay": 0.05}),
    ("adamax", "Adamax", "Adamax", {}),
    ("nadam", "Nadam", "Nadam", {}),
    ("rmsprop", "RMSprop", "RMSprop", {}),
    ("adagrad", "Adagrad", "Adagrad", {}),
    ("adadelta", "Adadelta", "Adadelta", {"learning_rate": 1.0}),
    ("ftrl", "Ftrl", "Ftrl", {}),
    ("lion", "Lion", "Lion", {"learning_rate": 0.001}),
    ("adafactor", "Adafactor", "Adafactor", {}),
    ("sgd_momentum", "SGD(momentum=0.9)", "SGD", {"momentum": 0.9}),
)


def _optimizer(class_name: str, **kwargs):
    import keras

    kwargs.setdefault("learning_rate", 0.01)
    return getattr(keras.optimizers, class_name)(**kwargs)


def _sparse_case(suffix: str, shown: str, class_name: str, kwargs: dict) -> Case:
    return Case(f"sparse_{suffix}", f"sparse gradients: Embedding(200, 8) + {shown}",
                data="wide_tokens",
                model=lambda data: models.sequence(data, vocab=WIDE_VOCAB),
                compile=lambda: sgd_compile(optimizer=_optimizer(class_name, **kwargs)))


def _task() -> str:
    return task_name()[0]


def _own(workdir: Path) -> Path:
    """This task's own folder (as a worker's local disk would be): ``own/<task>``."""
    folder = workdir / "own" / _task()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _owned(workdir: Path) -> list[Path]:
    root = workdir / "own"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _predicts_like(model_or_outputs, result: dict, what: str) -> list[str]:
    from kerasdist.conformance.data import make

    outputs = model_or_outputs
    if hasattr(model_or_outputs, "predict"):
        outputs = model_or_outputs.predict(make("dense")["x"], verbose=0)
    got, expected = np.asarray(outputs), result["predict"][0]
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
        return [f"{what}: outputs differ from the trained model's predict"]
    return []


def save_own_path(model, workdir: Path, is_chief: bool) -> None:
    """Every task saves, saves weights and exports to its own folder (not a shared one)."""
    folder = _own(workdir)
    model.save(folder / "model.keras")
    model.save_weights(folder / "model.weights.h5")
    model.export(str(folder / "export"), verbose=False)


def check_own_path(workdir: Path, result: dict, build) -> list[str]:
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
        problems += _predicts_like(keras.saving.load_model(folder / "model.keras"), result,
                                   f"own/{folder.name}/model.keras")
        rebuilt = build()
        rebuilt.load_weights(folder / "model.weights.h5")
        problems += _predicts_like(rebuilt, result, f"own/{folder.name}/model.weights.h5")
        restored = tf.saved_model.load(str(folder / "export"))  # held: serve reads its variables
        problems += _predicts_like(restored.serve(tf.constant(make("dense")["x"])), result,
                                   f"own/{folder.name}/export")
    return problems


def _checkpoint_own(workdir: Path, record: dict):
    import keras

    folder = _own(workdir)
    return [keras.callbacks.ModelCheckpoint(str(folder / "last.keras")),
            keras.callbacks.ModelCheckpoint(str(folder / "last.weights.h5"),
                                            save_weights_only=True),
            keras.callbacks.BackupAndRestore(str(folder / "backup"), save_freq=2,
                                             delete_checkpoint=False)]


def _weights_equal(weights: list, result: dict, what: str) -> list[str]:
    final = result["weights"]
    if len(weights) != len(final) or not all(
            np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(weights, final, strict=True)):
        return [f"{what}: weights differ from the trained model's"]
    return []


def check_checkpoint_own(workdir: Path, result: dict, build) -> list[str]:
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
        problems += _weights_equal(loaded.get_weights(), result, f"{where}/last.keras")
        rebuilt = build()
        rebuilt.load_weights(folder / "last.weights.h5")
        problems += _weights_equal(rebuilt.get_weights(), result, f"{where}/last.weights.h5")
        backups = sorted((folder / "backup").glob("*.weights.h5"))
        if not backups:
            problems.append(f"{where}: BackupAndRestore(save_freq=2) left no weights file")
            continue
        rebuilt = build()
        rebuilt.load_weights(backups[0])
        problems += _weights_equal(rebuilt.get_weights(), result, f"{where}/backup")
    for folder in folders:
        shutil.rmtree(folder / "backup", ignore_errors=True)
    return problems


def _conv(data=None):
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.MaxPooling2D(2), keras.layers.Conv2D(4, 2),
                             keras.layers.GlobalMaxPooling2D(), keras.layers.Dense(CLASSES)])


def _bidirectional(data=None):
    import keras

    return keras.Sequential([keras.Input((SEQ_LEN,), dtype="int64"),
                             keras.layers.Embedding(WIDE_VOCAB, 8),
                             keras.layers.Bidirectional(keras.layers.LSTM(4)),
                             keras.layers.Dense(CLASSES)])


def _group_norm(data=None):
    import keras

    return models.dense(extra=(keras.layers.Dense(16), keras.layers.GroupNormalization(groups=4)))


def _einsum(data=None):
    import keras

    return keras.Sequential([keras.Input((FEATURES,)),
                             keras.layers.EinsumDense("ab,bc->ac", output_shape=16,
                                                      bias_axes="c", activation="relu"),
                             keras.layers.Dense(CLASSES)])


def _loss_compile(loss_name: str, **kwargs):
    import keras

    return sgd_compile(loss=getattr(keras.losses, loss_name)(**kwargs), metrics=())


def _swap_ema(workdir: Path, record: dict):
    import keras

    return [keras.callbacks.SwapEMAWeights(swap_on_epoch=True)]


def round3_cases() -> list[Case]:
    """The rows of issue 40 (module docs), in matrix order."""
    cases = [_sparse_case(*spec) for spec in SPARSE_OPTIMIZERS]
    cases += [
        Case("save_own_path", "model.save + save_weights + export, each task to its own folder",
             after=save_own_path, check=check_own_path),
        Case("cb_checkpoint_own_path", "ModelCheckpoint + BackupAndRestore, each task to its "
             "own folder", callbacks=_checkpoint_own, check=check_checkpoint_own),
        Case("jit_compile", "compile(jit_compile=True) (XLA)",
             compile=lambda: sgd_compile(jit_compile=True)),
        Case("conv_pooling", "Conv2D + MaxPooling2D + GlobalMaxPooling2D", data="images",
             model=_conv),
        Case("bidirectional_adam", "Bidirectional(LSTM) over Embedding(200, 8) + Adam",
             data="wide_tokens", model=_bidirectional,
             compile=lambda: sgd_compile(optimizer=_optimizer("Adam"))),
        Case("group_normalization", "GroupNormalization", model=_group_norm),
        Case("einsum_dense", "EinsumDense", model=_einsum),
        Case("huber_loss", "Huber loss (regression)", data="regression",
             model=lambda data: models.dense(out=1),
             compile=lambda: _loss_compile("Huber", delta=0.5)),
        Case("binary_focal_loss", "BinaryFocalCrossentropy", data="binary",
             model=lambda data: models.dense(out=1, activation="sigmoid"),
             compile=lambda: _loss_compile("BinaryFocalCrossentropy", gamma=2.0)),
        Case("lamb", "Lamb optimizer", compile=lambda: sgd_compile(optimizer=_optimizer("Lamb"))),
        Case("cb_swap_ema_weights", "SwapEMAWeights callback (Adam use_ema)",
             callbacks=_swap_ema,
             compile=lambda: sgd_compile(optimizer=_optimizer("Adam", use_ema=True))),
    ]
    return cases

"""Conformance cases for Keras's built-in callbacks, each pointed at one path shared by every task
(as TensorFlow's multi-worker tutorial does), with a driver-side check of what they wrote."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from kerasdist.conformance.case import Case, _optimizer, sgd_compile
from kerasdist.conformance.data import EPOCHS


def one_callback(name: str, *args, path: str | None = None, **kwargs):
    """A ``Case.callbacks`` factory of the one callback ``keras.callbacks.<name>(*args,
    **kwargs)``, given ``workdir / path`` (as a string) first when ``path`` is set."""

    def callbacks(workdir: Path, record: dict):
        import keras

        where = (str(workdir / path),) if path else ()
        return [getattr(keras.callbacks, name)(*where, *args, **kwargs)]

    return callbacks


def _checkpoint(workdir: Path, record: dict):
    import keras

    return [keras.callbacks.ModelCheckpoint(str(workdir / "best.keras"), monitor="loss",
                                            save_best_only=True),
            keras.callbacks.ModelCheckpoint(str(workdir / "last.weights.h5"),
                                            save_weights_only=True)]


def _weights_match(model_weights: list, result: dict, what: str) -> list[str]:
    final = result["weights"]
    if len(model_weights) != len(final):
        return [f"{what}: {len(model_weights)} weights, the trained model has {len(final)}"]
    bad = [i for i, (a, b) in enumerate(zip(model_weights, final, strict=True))
           if not np.allclose(a, b, rtol=1e-6, atol=1e-7)]
    return [f"{what}: weights {bad} differ from the trained model's"] if bad else []


def _check_checkpoint(workdir: Path, result: dict, build) -> list[str]:
    import keras

    problems = []
    best = workdir / "best.keras"
    if not best.is_file():
        problems.append(f"ModelCheckpoint(save_best_only=True) wrote no {best.name}")
    else:
        keras.saving.load_model(best, compile=False)
    weights = workdir / "last.weights.h5"
    if not weights.is_file():
        return problems + [f"ModelCheckpoint(save_weights_only=True) wrote no {weights.name}"]
    model = build()
    model.load_weights(weights)
    return problems + _weights_match(model.get_weights(), result, weights.name)


def _check_backup(workdir: Path, result: dict, build) -> list[str]:
    files = sorted(p.name for p in (workdir / "backup").glob("*")) if (
        workdir / "backup").is_dir() else []
    weights = [f for f in files if f.endswith(".weights.h5")]
    if not weights:
        return [f"BackupAndRestore(save_freq=2) left no weights file in backup/ (found {files})"]
    model = build()
    model.load_weights(workdir / "backup" / weights[0])
    return _weights_match(model.get_weights(), result, f"backup/{weights[0]}")


def _reduce_lr(workdir: Path, record: dict):
    import keras

    def remember(epoch, logs):
        record.setdefault("learning_rate", []).append(float(logs.get("learning_rate", np.nan)))

    return [keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                              min_delta=10.0),
            keras.callbacks.LambdaCallback(on_epoch_end=remember)]


def _check_csv(workdir: Path, result: dict, build) -> list[str]:
    path = workdir / "log.csv"
    if not path.is_file():
        return ["CSVLogger wrote no log.csv"]
    rows = list(csv.DictReader(path.read_text().splitlines()))
    if len(rows) != EPOCHS:
        return [f"log.csv has {len(rows)} rows, expected {EPOCHS} (one per epoch, one writer)"]
    logged = [float(r["loss"]) for r in rows]
    if not np.allclose(logged, result["history"]["loss"], rtol=1e-5):
        return [f"log.csv losses {logged} != History {result['history']['loss']}"]
    return []


def _check_tensorboard(workdir: Path, result: dict, build) -> list[str]:
    files = list((workdir / "tb").rglob("events.out.tfevents.*"))
    train = [f for f in files if f.parent.name == "train"]
    if not train:
        return [f"TensorBoard wrote no train/ event file (found {[str(f) for f in files]})"]
    if len(train) > 1:
        return [f"TensorBoard: {len(train)} writers of train/ (one per task): "
                f"{sorted(f.name for f in train)}"]
    return []


def _lambda(workdir: Path, record: dict):
    import keras

    def on_epoch_end(epoch, logs):
        record.setdefault("epochs_seen", []).append(int(epoch))

    def on_train_batch_end(batch, logs):
        record["batches_seen"] = record.get("batches_seen", 0) + 1

    return [keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end,
                                           on_train_batch_end=on_train_batch_end)]


def _check_lambda(workdir: Path, result: dict, build) -> list[str]:
    seen = result["record"].get("epochs_seen")
    return [] if seen == list(range(EPOCHS)) else [f"LambdaCallback saw epochs {seen}"]


def callback_cases() -> list[Case]:
    """One case per built-in callback (ModelCheckpoint and BackupAndRestore with their options)."""
    return [
        Case("cb_model_checkpoint", "ModelCheckpoint (save_best_only; save_weights_only)",
             callbacks=_checkpoint, check=_check_checkpoint),
        Case("cb_backup_and_restore", "BackupAndRestore (save_freq=2 steps)",
             callbacks=one_callback("BackupAndRestore", path="backup", save_freq=2,
                            delete_checkpoint=False), check=_check_backup),
        Case("cb_early_stopping", "EarlyStopping(restore_best_weights=True)",
             callbacks=one_callback("EarlyStopping", monitor="val_loss", patience=0,
                            min_delta=10.0, restore_best_weights=True), validation=True),
        Case("cb_reduce_lr_on_plateau", "ReduceLROnPlateau", callbacks=_reduce_lr),
        Case("cb_learning_rate_scheduler", "LearningRateScheduler",
             callbacks=one_callback("LearningRateScheduler", lambda epoch, lr: 0.05 / (epoch + 1))),
        Case("cb_csv_logger", "CSVLogger", callbacks=one_callback("CSVLogger", path="log.csv"),
             check=_check_csv),
        Case("cb_tensorboard", "TensorBoard",
             callbacks=one_callback("TensorBoard", path="tb", write_graph=False),
             check=_check_tensorboard),
        Case("cb_terminate_on_nan", "TerminateOnNaN", callbacks=one_callback("TerminateOnNaN"),
             compile=lambda: sgd_compile(optimizer=_optimizer(learning_rate=1e18))),
        Case("cb_lambda", "LambdaCallback", callbacks=_lambda, check=_check_lambda),
    ]

"""What a conformance case is (:class:`Case`) and the compile arguments most cases share; the
case lists are in :mod:`kerasdist.conformance.cases` and :mod:`kerasdist.conformance.callback_cases`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

from kerasdist.conformance import models
from kerasdist.conformance.data import NUM_EXAMPLES, SHUFFLE_SEED, STEPS_PER_EPOCH

SCCE = "scce_logits"  # SparseCategoricalCrossentropy(from_logits=True)


@dataclass(frozen=True)
class Case:
    """One row of the matrix.

    Attributes:
        name: unique id (``[a-z0-9_]``).
        feature: what the row exercises, as shown in the matrix.
        data: data kind (:func:`kerasdist.conformance.data.make`).
        model: builder ``fn(data) -> keras.Model`` (uncompiled).
        compile: ``fn() -> dict`` of ``model.compile`` keyword arguments (fresh objects each call);
            ``loss="scce_logits"`` stands for sparse categorical cross-entropy on logits.
        input: ``dataset``, ``numpy``, ``dataset_fn`` or ``pydataset`` (fit from a
            ``keras.utils.PyDataset``; evaluate from the dataset) (:mod:`kerasdist.conformance.data`).
        weighted: feed ``sample_weight`` with the data.
        pipeline: ``fn(data) -> fn(x) -> x`` adapted preprocessing mapped over ``x`` in the
            ``tf.data`` pipeline (``dataset``/``dataset_fn`` inputs; predict gets a dataset too).
        fit_kwargs: extra ``model.fit`` keyword arguments (e.g. ``class_weight``).
        callbacks: ``fn(workdir: Path) -> list`` of Keras callbacks; ``workdir`` is one directory
            shared by every task of a run (as users point callbacks at one shared path).
        validation: pass the data as ``validation_data`` too.
        eval_examples: evaluate on the first N examples only (None: all), e.g. a number that
            leaves a partial last batch and shards of different sizes.
        per_replica: why the trained weights of a multi-replica run are not comparable with the
            strategy-free run (Keras's documented per-replica semantics); empty: they are.
        precision: Keras dtype policy while the model is built and trained.
        tolerance: ``(rtol, atol)`` for weights, optimizer state, history, evaluate and predict.
        after: ``fn(model, workdir: Path, is_chief: bool) -> None`` run after predict (saving).
        check: ``fn(workdir: Path, result: dict) -> list[str]`` run by the driver: problems found.
        examples: examples in the data set (:func:`kerasdist.conformance.data.make`).
        shuffle_seed: ``dataset``/``dataset_fn`` inputs: the seed of a ``shuffle`` of the whole
            set (reshuffled every epoch, TF's default) before batching; None: unshuffled.
        drop_remainder: ``dataset`` input: batch (for fit and evaluate) with ``drop_remainder``;
            None: :func:`kerasdist.conformance.cases.all_cases` sets it, every other case True.
        steps_per_epoch: ``dataset`` input: train on ``repeat()`` with this many steps an epoch
            (None: one full pass over the set an epoch).
        metrics_outside_scope: build the compile metrics before entering ``strategy.scope()``
            (as scripts that list their metrics at the top do).
    """

    name: str
    feature: str
    data: str = "dense"
    model: Callable = models.dense
    compile: Callable[[], dict] = field(default=lambda: sgd_compile())
    input: str = "dataset"
    weighted: bool = False
    pipeline: Callable | None = None
    fit_kwargs: dict = field(default_factory=dict)
    callbacks: Callable | None = None
    validation: bool = False
    eval_examples: int | None = None
    per_replica: str = ""
    precision: str = "float32"
    tolerance: tuple[float, float] = (2e-4, 2e-5)
    after: Callable | None = None
    check: Callable | None = None
    examples: int = NUM_EXAMPLES
    shuffle_seed: int | None = SHUFFLE_SEED
    drop_remainder: bool | None = None
    steps_per_epoch: int | None = STEPS_PER_EPOCH
    metrics_outside_scope: bool = False


def _optimizer(name="sgd", **kwargs):
    """``sgd``, ``adam``, ``adamw`` or a ``keras.optimizers`` class name (``"Lamb"``); the
    learning rate defaults to 0.05 for ``sgd``, else 0.01."""
    import keras

    cls = getattr(keras.optimizers, {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}.get(name, name))
    kwargs.setdefault("learning_rate", 0.05 if name == "sgd" else 0.01)
    return cls(**kwargs)


def sgd_compile(*, optimizer=None, metrics=("accuracy",), loss=SCCE, **extra) -> dict:
    """``compile`` arguments: SGD(0.05) unless given, the case's loss and metrics."""
    metrics = metrics if isinstance(metrics, dict) else list(metrics)
    return {"optimizer": optimizer or _optimizer(), "loss": loss, "metrics": metrics, **extra}


def task_name() -> tuple[str, bool]:
    """``(name, is_chief)`` of this process from ``TF_CONFIG`` (``main`` without one)."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return "main", True
    task = json.loads(raw).get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief":
        return "main", True
    return f"{kind}-{index}", kind == "worker" and index == 0

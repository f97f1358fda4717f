"""What the run lifecycle hands a strategy's training loop (:class:`RunContext`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerasdist.data.inputs import StreamInput


@dataclass
class RunContext:
    """What a training loop gets from the lifecycle (one per run and process).

    Attributes:
        recipe: the validated recipe.
        model: the compiled Keras model, built under ``tf_strategy.scope()``.
        tf_strategy: the ``tf.distribute.Strategy``.
        data: the recipe's input (:meth:`Strategy.make_input`): the resumable streams of
            :class:`kerasdist.data.inputs.StreamInput`, for every strategy.
        store: the checkpoint store (:class:`kerasdist.keras.backup.BackupStore`) or None.
        start_step: global step (``optimizer.iterations``) restored from the checkpoint.
        callbacks: Keras callbacks: kerasdist's own (throughput, TensorBoard) then the user's.
        state_callbacks: the recipe's ``callbacks``, which a loop runs before its checkpoint
            saves, so that an epoch's checkpoint holds what they changed at its end (the
            learning rate ``ReduceLROnPlateau`` lowered, ``stop_training``).
        verbose: Keras progress verbosity.
        task: this task's name (``worker:1``), or None for a one-process run.
        is_chief: whether this process writes the run's outputs.
        extra: figures a loop adds to ``metrics.json`` (e.g. ``parameter_server``).
        logs: the run directory's log folder (``<run_dir>/logs``), where a local cluster's tasks
            write theirs.
    """

    recipe: Any
    model: Any
    tf_strategy: Any
    data: StreamInput
    store: Any
    start_step: int
    callbacks: list
    verbose: Any
    task: str | None = None
    is_chief: bool = True
    extra: dict = field(default_factory=dict)
    state_callbacks: list = field(default_factory=list)
    logs: Path | None = None

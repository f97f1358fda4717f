"""Train a recipe with Keras ``model.fit`` under a synchronous strategy, with resumable outputs.

Order of work in :func:`fit`, so that bad input never writes anything or starts training:
  1. load the data splits, build the strategy, check the global batch against the replica count,
     check the run directory (all may raise, nothing is written yet);
  2. build and compile the model inside ``strategy.scope()``, restore the latest checkpoint;
  3. ``model.fit`` with Keras's progress bar, TensorBoard, checkpoint and throughput callbacks;
  4. evaluate on the held-out split, save ``model.keras`` and ``metrics.json`` atomically.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kerasdist import __version__
from kerasdist.errors import RecipeError
from kerasdist.training import outputs
from kerasdist.training.callbacks import EpochCheckpoint, ThroughputMeter


@dataclass
class RunResult:
    """What a finished run produced. Times in seconds, throughput in examples/s."""

    history: dict[str, list[float]]
    evaluation: dict[str, float]
    throughput: dict[str, float]
    wall_time_s: float
    run_dir: Path
    model_path: Path | None
    metrics_path: Path
    initial_epoch: int
    epochs: int
    num_replicas: int
    strategy: str
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, path: Path) -> RunResult:
        """Rebuild a result from a ``metrics.json`` written by :func:`write_metrics`."""
        import json

        data = json.loads(Path(path).read_text(encoding="utf-8"))
        known = {"history", "evaluation", "throughput", "wall_time_s", "initial_epoch", "epochs",
                 "num_replicas", "strategy", "model_path", "versions"}
        model_path = Path(data["model_path"]) if data.get("model_path") else None
        return cls(history=data["history"], evaluation=data["evaluation"],
                   throughput=data["throughput"], wall_time_s=data["wall_time_s"],
                   run_dir=Path(path).parent, model_path=model_path, metrics_path=Path(path),
                   initial_epoch=data["initial_epoch"], epochs=data["epochs"],
                   num_replicas=data["num_replicas"], strategy=data["strategy"],
                   extra={k: v for k, v in data.items() if k not in known})


def say(message: str) -> None:
    """Print a kerasdist status line (stdout, flushed)."""
    print(f"kerasdist: {message}", flush=True)


def make_optimizer(config, num_replicas: int = 1):
    """A Keras 3 optimizer from an ``OptimizerConfig``; applies linear LR scaling if asked."""
    import keras

    lr = config.learning_rate * (num_replicas if config.scale_lr_by_replicas else 1)
    if config.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=config.momentum, nesterov=config.nesterov)
    if config.name == "rmsprop":
        return keras.optimizers.RMSprop(lr, momentum=config.momentum)
    if config.name == "adamw":
        return keras.optimizers.AdamW(lr)
    return keras.optimizers.Adam(lr)


def make_loss(name: str):
    """Keras loss from an identifier; ``sparse_categorical_crossentropy_from_logits`` is the seed
    CNN's (softmax cross-entropy on logits)."""
    import keras

    if name == "sparse_categorical_crossentropy_from_logits":
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    try:
        return keras.losses.get(name)
    except ValueError as err:
        raise RecipeError(f"model.loss: {err}. Received: loss='{name}'") from None


def build_compiled_model(recipe, num_replicas: int = 1, **compile_kwargs):
    """Build and compile the recipe's model. Call inside ``strategy.scope()``."""
    from kerasdist.models import registry

    spec = registry.check(recipe.model)
    model = spec.build(**recipe.model.params)
    model.compile(optimizer=make_optimizer(recipe.optimizer, num_replicas),
                  loss=make_loss(spec.loss), metrics=list(spec.metrics), **compile_kwargs)
    return model


def check_batch_divisible(global_batch: int, num_replicas: int) -> None:
    """Raises RecipeError unless ``global_batch`` splits evenly over ``num_replicas``."""
    if global_batch % num_replicas:
        raise RecipeError(
            f"data.batch_size (the global batch) must be divisible by the number of replicas "
            f"({num_replicas}). Received: batch_size={global_batch}; use e.g. "
            f"{max(num_replicas, global_batch - global_batch % num_replicas)}."
        )


def _prepare(recipe, overwrite: bool):
    import keras

    from kerasdist.data import build_datasets
    from kerasdist.strategies import registry as strategies

    keras.utils.set_random_seed(recipe.trainer.seed)
    datasets = build_datasets(recipe.data, repeat_train=recipe.trainer.steps_per_epoch is not None)
    strategy = strategies.build(recipe.strategy)
    check_batch_divisible(recipe.data.batch_size, strategy.num_replicas_in_sync)
    run_dir = Path(recipe.output.run_dir)
    resumable = outputs.check_run_dir(run_dir, recipe, overwrite=overwrite)
    return datasets, strategy, run_dir, resumable


def restore_checkpoint(recipe, model, run_dir: Path, resumable: bool, overwrite: bool):
    """Create the checkpoint manager over model + optimizer + epoch counter and restore the latest
    checkpoint when resuming. Returns ``(manager, epoch_var, initial_epoch)``."""
    import tensorflow as tf

    ckpt_dir = run_dir / outputs.CHECKPOINT_DIR
    if overwrite and ckpt_dir.exists():
        say(f"--overwrite: discarding the checkpoints in {ckpt_dir}")
        shutil.rmtree(ckpt_dir)
    epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_completed")
    model.optimizer.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=epoch_var)
    manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir),
                                         max_to_keep=recipe.trainer.checkpoint.max_to_keep)
    initial_epoch = 0
    if resumable and manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        initial_epoch = int(epoch_var.numpy())
        say(f"resuming from checkpoint {manager.latest_checkpoint} "
            f"({initial_epoch} of {recipe.trainer.epochs} epochs done)")
    return manager, epoch_var, initial_epoch


def _callbacks(recipe, run_dir: Path, manager, epoch_var, meter, extra: Sequence):
    import keras

    cbs = [meter]
    if recipe.trainer.checkpoint.enabled:
        cbs.append(EpochCheckpoint(manager, epoch_var))
    if recipe.output.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(log_dir=str(run_dir / "tensorboard")))
    return cbs + list(extra)


def fit(recipe, *, overwrite: bool = False, callbacks: Sequence = (), verbose=None) -> RunResult:
    """Train, evaluate and save the model a recipe describes (strategies ``default``, ``mirrored``).

    Args:
        recipe: a validated :class:`kerasdist.config.Recipe`.
        overwrite: discard checkpoints of a different model in ``output.run_dir``.
        callbacks: extra Keras callbacks appended to kerasdist's own.
        verbose: Keras ``fit`` verbosity; default ``recipe.trainer.verbose``.

    Returns:
        :class:`RunResult`; the same figures are written to ``<run_dir>/metrics.json``.

    Raises:
        RecipeError, DataError, RunDirError: bad input, raised before anything is written.
    """
    start = time.perf_counter()
    datasets, strategy, run_dir, resumable = _prepare(recipe, overwrite)
    replicas = strategy.num_replicas_in_sync
    if recipe.trainer.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    with strategy.scope():
        model = build_compiled_model(recipe, replicas)
        manager, epoch_var, initial_epoch = restore_checkpoint(recipe, model, run_dir, resumable, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_json_atomic(run_dir / outputs.RUN_INFO, {
        "fingerprint": outputs.model_fingerprint(recipe), "kerasdist": __version__,
        "recipe": recipe.model_dump(mode="json")})
    meter = ThroughputMeter(recipe.data.batch_size)
    eval_ds = datasets.eval_fn() if (datasets.eval_fn and recipe.trainer.validation) else None
    verbose = recipe.trainer.verbose if verbose is None else verbose
    say(f"training {recipe.model.name} with strategy '{recipe.strategy.kind}' on {replicas} "
        f"replica(s); global batch {recipe.data.batch_size} "
        f"({recipe.data.batch_size // replicas} per replica); run dir {run_dir}")
    history = {}
    if initial_epoch < recipe.trainer.epochs:
        hist = model.fit(datasets.train_fn(), epochs=recipe.trainer.epochs,
                         initial_epoch=initial_epoch, shuffle=False,
                         steps_per_epoch=recipe.trainer.steps_per_epoch,
                         validation_data=eval_ds, validation_steps=recipe.trainer.validation_steps,
                         callbacks=_callbacks(recipe, run_dir, manager, epoch_var, meter, callbacks),
                         verbose=verbose)
        history = {k: [float(v) for v in vals] for k, vals in hist.history.items()}
    else:
        say("all epochs already completed by the checkpoint; evaluating only")
    evaluation = {}
    if datasets.eval_fn is not None:
        evaluation = {k: float(v) for k, v in model.evaluate(
            datasets.eval_fn(), steps=recipe.trainer.validation_steps, verbose=0,
            return_dict=True).items()}
    model_path = (outputs.save_model_atomic(model, run_dir / "model.keras")
                  if recipe.output.save_model else None)
    wall = time.perf_counter() - start
    result = RunResult(history=history, evaluation=evaluation, throughput=meter.summary(),
                       wall_time_s=wall, run_dir=run_dir, model_path=model_path,
                       metrics_path=run_dir / "metrics.json", initial_epoch=initial_epoch,
                       epochs=recipe.trainer.epochs, num_replicas=replicas,
                       strategy=recipe.strategy.kind)
    write_metrics(result, recipe)
    return result


def write_metrics(result: RunResult, recipe) -> Path:
    """Write ``metrics.json`` (atomically) from a :class:`RunResult`."""
    import keras
    import tensorflow as tf

    data = {
        "history": result.history,
        "evaluation": result.evaluation,
        "throughput": result.throughput,
        "wall_time_s": result.wall_time_s,
        "initial_epoch": result.initial_epoch,
        "epochs": result.epochs,
        "num_replicas": result.num_replicas,
        "strategy": result.strategy,
        "model_path": str(result.model_path) if result.model_path else None,
        "versions": {"kerasdist": __version__, "tensorflow": tf.__version__,
                     "keras": keras.__version__, "python": sys.version.split()[0]},
        **result.extra,
    }
    return outputs.write_json_atomic(result.metrics_path, data)


def summary_text(result: RunResult) -> str:
    """The one-screen summary printed at the end of ``kerasdist fit``."""
    ev = result.evaluation
    lines = ["", "=" * 64, "kerasdist run summary", "-" * 64,
             f"strategy           {result.strategy} ({result.num_replicas} replica(s))",
             f"epochs             {result.initial_epoch} -> {result.epochs}"]
    for key in sorted(ev):
        lines.append(f"held-out {key:<10}{ev[key]:.4f}")
    tp = result.throughput
    lines += [f"throughput         {tp['examples_per_sec']:.1f} examples/s "
              f"({tp['timed_steps']} timed steps, compile/trace excluded)",
              f"wall time          {result.wall_time_s:.1f} s",
              f"model              {result.model_path or '(not saved)'}",
              f"metrics            {result.metrics_path}",
              f"checkpoints        {result.run_dir / outputs.CHECKPOINT_DIR}",
              f"tensorboard        tensorboard --logdir {result.run_dir / 'tensorboard'}",
              "=" * 64]
    return "\n".join(lines)

"""Train a ``parameter_server`` recipe from the coordinator, with the same outputs as ``fit``.

Order of work in :func:`fit_recipe` (as :func:`kerasdist.training.fit.fit`):
  1. load the data splits, build the strategy (connects to the cluster), check the global batch
     and the run directory (may raise; nothing is written yet);
  2. build and compile the model inside ``strategy.scope()`` (variables on the ps tasks) and
     restore the latest checkpoint, so the global step (``optimizer.iterations``) never goes back;
  3. the parameter-server loop (:func:`kerasdist.training.ps.fit`) with Keras's progress bar,
     TensorBoard and epoch-end checkpoints written by the coordinator only
     (``tf.train.CheckpointManager``: crc-checked, atomic pointer file);
  4. evaluate on the held-out split (scheduled on the workers), save ``model.keras`` and
     ``metrics.json`` atomically; ``metrics.json``'s ``parameter_server`` section holds the global
     step, steps per worker, examples/s and staleness (:class:`~kerasdist.training.ps_loop.PSStats`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from kerasdist import __version__
from kerasdist.errors import RecipeError
from kerasdist.training import outputs
from kerasdist.training.callbacks import ThroughputMeter
from kerasdist.training.fit import (
    RunResult,
    build_compiled_model,
    check_batch_divisible,
    restore_checkpoint,
    say,
    write_metrics,
)


def _prepare(recipe, cluster_resolver, overwrite: bool):
    import keras

    from kerasdist.data import build_datasets
    from kerasdist.strategies import registry as strategies

    if recipe.strategy.kind != "parameter_server":
        raise RecipeError("fit_recipe trains strategy 'parameter_server' only; use "
                          f"kerasdist.fit for the others. Received: kind='{recipe.strategy.kind}'")
    keras.utils.set_random_seed(recipe.trainer.seed)
    datasets = build_datasets(recipe.data, repeat_train=True)
    run_dir = Path(recipe.output.run_dir)
    resumable = outputs.check_run_dir(run_dir, recipe, overwrite=overwrite)
    strategy = strategies.build(recipe.strategy, cluster_resolver=cluster_resolver)
    check_batch_divisible(recipe.data.batch_size, strategy.num_replicas_in_sync)
    return datasets, strategy, run_dir, resumable


def _callbacks(recipe, run_dir: Path, manager, epoch_var, extra: Sequence) -> list:
    import keras

    from kerasdist.training.callbacks import EpochCheckpoint

    cbs = []
    if recipe.trainer.checkpoint.enabled:
        cbs.append(EpochCheckpoint(manager, epoch_var))
    if recipe.output.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(log_dir=str(run_dir / "tensorboard")))
    return cbs + list(extra)


def _train(recipe, model, datasets, *, initial_epoch: int, callbacks: list, verbose):
    from kerasdist.training import ps

    trainer = recipe.trainer
    if initial_epoch >= trainer.epochs:
        say("all epochs already completed by the checkpoint; evaluating only")
        return {}, None
    eval_fn = datasets.eval_fn if trainer.validation else None
    hist = ps.fit(model, datasets.train_fn, epochs=trainer.epochs, initial_epoch=initial_epoch,
                  steps_per_epoch=trainer.steps_per_epoch or datasets.steps_per_epoch,
                  validation_data=eval_fn, validation_steps=trainer.validation_steps,
                  callbacks=callbacks, verbose=verbose)
    return {k: [float(v) for v in vals] for k, vals in hist.history.items()}, hist.ps_stats


def fit_recipe(recipe, *, cluster_resolver=None, overwrite: bool = False, verbose=None,
               callbacks: Sequence = ()) -> RunResult:
    """Train, evaluate and save a ``parameter_server`` recipe; this process is the coordinator.

    Args:
        recipe: a validated :class:`kerasdist.config.Recipe` with ``strategy.kind:
            parameter_server``. ``data.batch_size`` is the batch of one scheduled step (one
            optimizer update); ``trainer.steps_per_epoch`` counts steps summed over workers,
            default one pass over the training split (``num_train // batch_size``).
        cluster_resolver: resolver of a running cluster with ``worker`` and ``ps`` tasks, this
            process being ``chief``; default ``TFConfigClusterResolver()``.
        overwrite: discard checkpoints of a different model in ``output.run_dir``.
        verbose: Keras progress-bar verbosity; default ``recipe.trainer.verbose``.
        callbacks: extra Keras callbacks, after kerasdist's own.

    Returns:
        :class:`kerasdist.training.fit.RunResult`; ``extra["parameter_server"]`` holds the
        parameter-server figures. The same is written to ``<run_dir>/metrics.json``.

    Raises:
        RecipeError, DataError, RunDirError, ClusterError: bad input, before anything is written.
    """
    from kerasdist.training import ps

    start = time.perf_counter()
    datasets, strategy, run_dir, resumable = _prepare(recipe, cluster_resolver, overwrite)
    if recipe.trainer.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    with strategy.scope():
        model = build_compiled_model(
            recipe, strategy.num_replicas_in_sync,
            steps_per_execution=recipe.strategy.steps_per_execution)
        manager, epoch_var, initial_epoch = restore_checkpoint(recipe, model, run_dir, resumable, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_json_atomic(run_dir / outputs.RUN_INFO, {
        "fingerprint": outputs.model_fingerprint(recipe), "kerasdist": __version__,
        "recipe": recipe.model_dump(mode="json")})
    jobs = ps.cluster_spec(strategy)
    say(f"training {recipe.model.name} with strategy 'parameter_server' on "
        f"{jobs.num_tasks('worker')} worker(s) and {jobs.num_tasks('ps')} ps; batch "
        f"{recipe.data.batch_size} per step; run dir {run_dir}")
    clock = ThroughputMeter(recipe.data.batch_size)  # only its epoch_end_s is used here
    history, ps_stats = _train(
        recipe, model, datasets, initial_epoch=initial_epoch,
        callbacks=_callbacks(recipe, run_dir, manager, epoch_var, [clock, *callbacks]),
        verbose=recipe.trainer.verbose if verbose is None else verbose)
    return _finish(recipe, model, datasets, history=history, ps_stats=ps_stats, jobs=jobs,
                   run_dir=run_dir, initial_epoch=initial_epoch, start=start,
                   epoch_end_s=clock.clock.epoch_end_s)


def _finish(recipe, model, datasets, *, history, ps_stats, jobs, run_dir, initial_epoch, start,
            epoch_end_s=()):
    from kerasdist.training import ps

    evaluation = {}
    if datasets.eval_fn is not None:
        evaluation = ps.evaluate(model, datasets.eval_fn, steps=recipe.trainer.validation_steps,
                                 verbose=0, return_dict=True)
    model_path = (outputs.save_model_atomic(model, run_dir / "model.keras")
                  if recipe.output.save_model else None)
    stats = dict(ps_stats or {})
    stats.update(num_ps=jobs.num_tasks("ps"), num_workers=jobs.num_tasks("worker"))
    throughput = {"examples_per_sec": stats.get("examples_per_sec", 0.0),
                  "timed_steps": stats.get("timed_steps", 0),
                  "timed_seconds": stats.get("timed_seconds", 0.0),
                  "global_batch_size": recipe.data.batch_size,
                  "epoch_end_s": list(epoch_end_s),
                  "epoch_level_examples_per_sec": _epoch_level_rate(stats),
                  "epoch_examples_per_sec": [n / t if t else 0.0 for n, t in zip(
                      stats.get("epoch_examples", []), stats.get("epoch_seconds", []), strict=True)]}
    result = RunResult(
        history=history, evaluation=evaluation, throughput=throughput,
        wall_time_s=time.perf_counter() - start, run_dir=run_dir, model_path=model_path,
        metrics_path=run_dir / "metrics.json", initial_epoch=initial_epoch,
        epochs=recipe.trainer.epochs, num_replicas=jobs.num_tasks("worker"),
        strategy=recipe.strategy.kind, extra={"parameter_server": stats})
    write_metrics(result, recipe)
    return result


def _epoch_level_rate(stats: dict) -> float | None:
    """examples/s over whole training epochs 2..n (first scheduled call included, validation
    excluded) — the only timing tf_keras's PS ``fit`` allows; None with fewer than 2 epochs."""
    seconds, examples = stats.get("epoch_seconds", [])[1:], stats.get("epoch_examples", [])[1:]
    return sum(examples) / sum(seconds) if seconds and sum(seconds) > 0 else None

"""One worker of a synchronous multi-worker cluster: Keras ``model.fit`` under MultiWorkerMirroredStrategy.

Every worker process runs :func:`fit_worker` with its own role (``TFConfig``); the workers train in
lockstep and hold identical weights after every step. Only the chief (``chief:0``, or ``worker:0``
when there is no chief) writes what the user looks at: checkpoints, ``model.keras``, TensorBoard
logs, ``metrics.json`` and ``run.json``. Other workers write only into a temporary per-task folder
that is deleted after each save.

Order of work:
  1. create the strategy (before any other TF op, as TF requires), install :mod:`kerasdist._compat`;
  2. build the sharded inputs, the model and the optimizer; restore the latest backup and check
     that every worker restored the same global step;
  3. ``model.fit`` from that exact step (a half-done epoch is finished with a shorter ``fit``),
     saving every ``trainer.checkpoint.every_steps`` steps and at epoch ends;
  4. evaluate on the held-out split (all workers; logs are the mean over workers), write outputs.

Failures:
  * a lost peer (killed, hung, unreachable) makes the next collective fail within
    ``strategy.timeout_s`` seconds (usually sooner: TF's coordination service notices missed
    heartbeats); :func:`fit_worker` raises :class:`~kerasdist.errors.ClusterError` naming the lost task;
  * SIGTERM (preemption) on any worker: all workers save a checkpoint at the same step and
    :class:`Preempted` is raised; the CLI exits with code 130 and the next launch finishes the run.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from kerasdist import __version__
from kerasdist.errors import ClusterError, TaskFailedError
from kerasdist.training import outputs
from kerasdist.training.fit import RunResult, build_compiled_model, say, write_metrics

EXIT_PREEMPTED = 130
"""Exit status of a worker (and of ``kerasdist fit``) stopped by SIGTERM after saving: the CLI's
'interrupted' code. It is >= 128, so Kubeflow's ``restartPolicy: ExitCode`` retries it."""


class Preempted(KeyboardInterrupt):
    """Training stopped because a worker received SIGTERM; a checkpoint at ``step`` was saved.

    A ``KeyboardInterrupt`` so that it passes ``except Exception`` handlers like Ctrl-C does; the
    CLI turns it into exit code 130 ("interrupted; re-run to resume").
    """

    def __init__(self, step: int):
        super().__init__(f"preempted: checkpoint saved at global step {step}; re-run to resume")
        self.step = step


def _start_strategy(recipe, tf_config):
    """Create the strategy first (TF refuses collectives after its runtime starts), then the rest."""
    import tensorflow as tf

    from kerasdist import _compat
    from kerasdist.strategies import registry as strategies

    if recipe.cluster.threads_per_task:  # before TF starts; the local launcher also sets env vars
        tf.config.threading.set_intra_op_parallelism_threads(recipe.cluster.threads_per_task)
    strategy = strategies.build(recipe.strategy, cluster_resolver=tf_config.cluster_resolver())
    mends = _compat.apply()
    import keras

    keras.utils.set_random_seed(recipe.trainer.seed)
    if recipe.trainer.deterministic:
        tf.config.experimental.enable_op_determinism()
    say(f"task {tf_config.task_name}{' (chief)' if tf_config.is_chief else ''}: "
        f"{strategy.num_replicas_in_sync} replicas in sync; mends {mends or 'none'}")
    return strategy, mends


def lost_tasks(message: str, tf_config) -> list[str]:
    """Task names (``worker:1``) other than this one mentioned in a TF error message."""
    found = {f"{job}:{index}" for job, index in
             re.findall(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)", message)}
    found.discard(tf_config.task_name)
    return sorted(found)


def _peer_error(err, tf_config, start_step: int, timeout_s: float) -> ClusterError:
    """The ClusterError for a failed collective, naming the lost task: from TF's message, else
    (a bare collective timeout) from a liveness probe of the peers (:mod:`mw_probe`)."""
    from kerasdist.training.mw_probe import unresponsive_peers

    states = unresponsive_peers(tf_config)
    lost = lost_tasks(err.message, tf_config) or sorted(states)
    named = [f"{task} ({states[task]})" if task in states else task for task in lost]
    who = f"lost task {', '.join(named)}" if lost else "lost contact with a peer task"
    lines = [line.strip() for line in err.message.splitlines() if line.strip()]
    telling = [line for line in lines
               if re.search(r"task:\d|aborted|unhealthy|[Tt]ime(d )?out|[Dd]eadline", line)]
    first = (telling or lines or [""])[0]
    return TaskFailedError(
        f"task {tf_config.task_name}: {who} during training ({type(err).__name__}; collective "
        f"timeout {timeout_s:.0f} s, started at global step {start_step}); restart the cluster "
        f"to resume from the last backup. Received: {first[:300]}")


def _check_same_step(strategy, step: int, tf_config, run_dir: Path) -> None:
    """Collective: every worker restored the same global step, else ClusterError naming them."""
    import tensorflow as tf

    @tf.function
    def gather(value):
        return strategy.gather(strategy.run(lambda v: tf.reshape(v, [1]), args=(value,)), axis=0)

    steps = [int(s) for s in gather(tf.constant(step, tf.int64)).numpy()]
    if len(set(steps)) > 1:
        per_replica = ", ".join(f"replica {i}: step {s}" for i, s in enumerate(steps))
        raise ClusterError(
            f"task {tf_config.task_name}: the workers restored different checkpoints "
            f"({per_replica}); output.run_dir must be on a filesystem every worker sees. "
            f"Received: run_dir='{run_dir}'")


def _fit_phases(model, data, strategy, *, start_step: int, epochs: int, backup, fit_kwargs: dict):
    """``model.fit`` from global ``start_step``: first the rest of a half-done epoch (a shorter
    ``fit``), then whole epochs. Returns the merged history ``{name: [per-epoch values]}``."""
    spe = data.steps_per_epoch
    epoch, done = divmod(start_step, spe)
    phases = []
    if done:
        phases.append((epoch, epoch + 1, spe - done, start_step))
        epoch += 1
    if epoch < epochs:
        phases.append((epoch, epochs, spe, epoch * spe))
    history: dict[str, list[float]] = {}
    for first, last, steps, stream_step in phases:
        if backup.preempted:
            break
        hist = model.fit(data.train_dataset(strategy, start_step=stream_step), initial_epoch=first,
                         epochs=last, steps_per_epoch=steps, shuffle=False, **fit_kwargs)
        for key, values in hist.history.items():
            history.setdefault(key, []).extend(float(v) for v in values)
    return history


def _callbacks(recipe, *, run_dir: Path, is_chief: bool, backup, meter, extra):
    import keras

    from kerasdist.training.mw_callbacks import WeightDigest

    cbs = [meter, backup, WeightDigest(backup)]
    if recipe.output.tensorboard and is_chief:
        cbs.append(keras.callbacks.TensorBoard(log_dir=str(run_dir / "tensorboard")))
    return cbs + list(extra)


def _prepare_model(recipe, strategy, data, *, tf_config, run_dir: Path, resumable: bool):
    """Model + optimizer under the strategy, the backup store, and the restored global step."""
    import shutil

    from kerasdist.training.mw_callbacks import BackupStore
    from kerasdist.training.mw_compression import compress_gradients

    ckpt_dir = run_dir / outputs.CHECKPOINT_DIR
    if tf_config.is_chief and not resumable and ckpt_dir.exists():
        say(f"--overwrite: discarding the checkpoints in {ckpt_dir}")
        shutil.rmtree(ckpt_dir)
    with strategy.scope():
        model = build_compiled_model(recipe, strategy.num_replicas_in_sync)
        model.optimizer.build(model.trainable_variables)
    compress_gradients(model.optimizer, recipe.strategy.gradient_compression)
    store = None
    if recipe.trainer.checkpoint.enabled:
        store = BackupStore(model=model, directory=ckpt_dir, is_chief=tf_config.is_chief,
                            task_name=tf_config.task_name,
                            max_to_keep=recipe.trainer.checkpoint.max_to_keep,
                            steps_per_epoch=data.steps_per_epoch)
        store.remove_stale_temp()
    step = store.restore() if (store is not None and resumable) else 0
    _check_same_step(strategy, step, tf_config, run_dir)
    return model, store, step


def _write_run_info(recipe, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_json_atomic(run_dir / outputs.RUN_INFO, {
        "fingerprint": outputs.model_fingerprint(recipe), "kerasdist": __version__,
        "recipe": recipe.model_dump(mode="json")})


def _evaluate(model, data, strategy, recipe) -> dict[str, float]:
    """Held-out evaluation on every worker (collective); values are means over the workers."""
    eval_ds = data.eval_dataset(strategy)
    if eval_ds is None:
        return {}
    logs = model.evaluate(eval_ds, steps=recipe.trainer.validation_steps, verbose=0,
                          return_dict=True)
    return {key: float(value) for key, value in logs.items()}


def _train_and_evaluate(recipe, model, data, strategy, *, store, start_step: int, run_dir: Path,
                        is_chief: bool, meter, verbose, callbacks):
    """Fit from ``start_step`` with backups and preemption votes, then evaluate.

    Returns:
        ``(history, evaluation)``.

    Raises:
        Preempted: after every worker saved at the same step.
    """
    from kerasdist.training.mw_callbacks import PreemptionWatch, StepBackup

    with PreemptionWatch(strategy) as watch:
        backup = StepBackup(store, start_step=start_step, watch=watch,
                            every_steps=recipe.trainer.checkpoint.every_steps)
        total = recipe.trainer.epochs * data.steps_per_epoch
        say(f"training from global step {start_step} of {total} "
            f"({data.steps_per_epoch} steps per epoch)")
        fit_kwargs = dict(
            validation_data=data.eval_dataset(strategy) if recipe.trainer.validation else None,
            validation_steps=recipe.trainer.validation_steps,
            verbose=recipe.trainer.verbose if verbose is None else verbose,
            callbacks=_callbacks(recipe, run_dir=run_dir, is_chief=is_chief, backup=backup,
                                 meter=meter, extra=callbacks))
        history = _fit_phases(model, data, strategy, start_step=start_step, backup=backup,
                              epochs=recipe.trainer.epochs, fit_kwargs=fit_kwargs)
        if backup.preempted:
            raise Preempted(backup.step)
        return history, _evaluate(model, data, strategy, recipe)


def _write_chief_outputs(recipe, model, result_kwargs, *, run_dir: Path) -> RunResult:
    model_path = (outputs.save_model_atomic(model, run_dir / "model.keras")
                  if recipe.output.save_model else None)
    result = RunResult(model_path=model_path, metrics_path=run_dir / "metrics.json",
                       run_dir=run_dir, **result_kwargs)
    write_metrics(result, recipe)
    return result


def fit_worker(recipe, *, tf_config, overwrite: bool = False, verbose=None,
               callbacks=()) -> RunResult | None:
    """Train as one worker of a ``multi_worker`` cluster; every worker calls this at the same time.

    Args:
        recipe: a validated recipe with ``strategy.kind: multi_worker``.
        tf_config: this task's :class:`~kerasdist.cluster.spec.TFConfig` (cluster + role). The
            process environment is not changed; the strategy gets ``tf_config.cluster_resolver()``.
        overwrite: discard checkpoints of another model in ``output.run_dir`` (chief deletes them).
        verbose: Keras ``fit`` verbosity; default ``recipe.trainer.verbose``.
        callbacks: extra Keras callbacks, run on every worker (they must not write shared files
            unless they check ``tf_config.is_chief``).

    Returns:
        :class:`RunResult` on the chief (also written to ``metrics.json``); None on other workers.
        ``extra`` holds ``global_steps`` (= ``optimizer.iterations``: ``epochs * steps_per_epoch``
        after any number of restarts), ``start_step``, ``steps_per_epoch``, ``shard_policy``,
        ``task``, ``mends`` and ``weights_sha256``.

    Raises:
        ClusterError: a peer task was lost (named) or workers restored different checkpoints.
        Preempted: SIGTERM; every worker saved a checkpoint at the same step first.
        RecipeError, DataError, RunDirError: bad input, before training starts.
    """
    import tensorflow as tf

    from kerasdist.training.callbacks import ThroughputMeter
    from kerasdist.training.mw_callbacks import weights_digest
    from kerasdist.training.mw_data import build_data

    start = time.perf_counter()
    strategy, mends = _start_strategy(recipe, tf_config)
    data = build_data(recipe, strategy)
    run_dir, chief = Path(recipe.output.run_dir), tf_config.is_chief
    resumable = outputs.check_run_dir(run_dir, recipe, overwrite=overwrite)
    meter, store, start_step = ThroughputMeter(recipe.data.batch_size), None, 0
    try:
        model, store, start_step = _prepare_model(recipe, strategy, data, tf_config=tf_config,
                                                  run_dir=run_dir, resumable=resumable)
        if chief:
            _write_run_info(recipe, run_dir)
        history, evaluation = _train_and_evaluate(
            recipe, model, data, strategy, store=store, start_step=start_step, run_dir=run_dir,
            is_chief=chief, meter=meter, verbose=verbose, callbacks=callbacks)
    except tf.errors.OpError as err:
        raise _peer_error(err, tf_config, start_step, recipe.strategy.timeout_s) from None
    finally:
        if store is not None:
            store.close()
    steps, digest = int(model.optimizer.iterations.numpy()), weights_digest(model)
    say(f"task {tf_config.task_name}: done at global step {steps}; weights sha256 {digest}")
    if not chief:
        return None
    return _write_chief_outputs(recipe, model, dict(
        history=history, evaluation=evaluation, throughput=meter.summary(),
        wall_time_s=time.perf_counter() - start, initial_epoch=start_step // data.steps_per_epoch,
        epochs=recipe.trainer.epochs, num_replicas=strategy.num_replicas_in_sync,
        strategy=recipe.strategy.kind, extra={
            "global_steps": steps, "start_step": start_step, "weights_sha256": digest,
            "steps_per_epoch": data.steps_per_epoch, "shard_policy": data.shard_policy,
            "task": tf_config.task_name, "mends": mends}), run_dir=run_dir)

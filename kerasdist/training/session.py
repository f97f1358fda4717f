"""THE run lifecycle: one recipe, one process's part of it, from the recipe to a :class:`RunResult`.

Every strategy kind runs through :func:`run_session`; a strategy object
(:class:`kerasdist.strategies.Strategy`) contributes only how its ``tf.distribute.Strategy`` is built,
how input is distributed and which training loop runs. Order of work, so that bad input never
writes anything and a resumed run continues at the exact global step:

1. check the run directory (:class:`~kerasdist.training.rundir.RunDir`): reads only;
2. build the strategy first (``MultiWorkerMirroredStrategy`` must exist before any other TF op),
   then the :mod:`kerasdist._compat` mends, seeds and op determinism;
3. build the distributed input (nothing is written yet);
4. build and compile the model under ``strategy.scope()`` and restore the latest checkpoint
   (:class:`~kerasdist.keras.backup.BackupStore`; the global step is ``optimizer.iterations``);
5. the chief writes ``run.json``; the strategy's loop trains and evaluates;
6. the chief saves ``model.keras`` and ``metrics.json`` atomically (never a non-finite model).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from kerasdist import tracking
from kerasdist._log import RECORD, ensure_configured, get_logger, keras_verbose
from kerasdist._signals import startup, terminate_on_sigterm
from kerasdist._timeline import mark, set_task
from kerasdist.strategies import RunContext, registry
from kerasdist.training.model import build_compiled_model
from kerasdist.training.result import RunResult, stop_reason, write_metrics
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.cluster.spec import TFConfig
    from kerasdist.config import Recipe
    from kerasdist.data.inputs import StreamInput
    from kerasdist.strategies import Strategy


log = get_logger("training")


@dataclass
class _Session:
    """One process's part of a run as start-up built it, carried on by :func:`_run`: the recipe
    (without ``output.tracking`` when its store was unusable and not required), its run directory,
    strategy object and ``tf.distribute.Strategy``, the compiled model, the input, the mends
    applied, this task's role (None for one process), name and whether it is the chief, the
    recipe's callbacks built, and ``started`` (``time.perf_counter()`` at the start, s)."""

    recipe: Recipe
    run_dir: RunDir
    strategy: Strategy
    tf_strategy: Any
    model: Any
    data: StreamInput
    mends: list
    tf_config: TFConfig | None
    task: str
    is_chief: bool
    recipe_callbacks: list
    started: float


def _start_runtime(recipe: Recipe, *, strategy: Strategy, tf_config: TFConfig | None):
    """Threads, then the strategy (first TF op of the process), then mends, seeds, determinism."""
    import keras
    import tensorflow as tf

    from kerasdist import _compat

    threads = recipe.intra_op_threads()
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        except RuntimeError:
            # TensorFlow already runs in this process (an in-process cluster, a notebook): 'auto'
            # is a speed hint and keeps the pool it has; a number the user set is refused.
            if recipe.cluster.threads_per_task != "auto":
                raise
            log.debug(f"cluster.threads_per_task 'auto' ({threads}) not applied: TensorFlow is "
                      "already initialised in this process")
    resolver = tf_config.cluster_resolver() if tf_config is not None else None
    tf_strategy = strategy.build(recipe.strategy, cluster_resolver=resolver)
    mends = _compat.apply()
    keras.utils.set_random_seed(recipe.trainer.seed)
    if recipe.trainer.deterministic:
        tf.config.experimental.enable_op_determinism()
    return tf_strategy, mends


def _build_model(recipe: Recipe, *, strategy: Strategy, tf_strategy):
    """The compiled model with its optimizer built, under the strategy's scope; checked against
    the data before anything is written (:func:`kerasdist.training.checks.check_inputs`)."""
    from kerasdist.training import checks

    with tf_strategy.scope():
        model = build_compiled_model(recipe, tf_strategy.num_replicas_in_sync,
                                     **strategy.compile_kwargs(recipe.strategy))
        model.optimizer.build(model.trainable_variables)
    checks.check_inputs(recipe, model)
    return model


def _make_store(s: _Session):
    from kerasdist.keras.backup import BackupStore

    store = None
    if s.recipe.trainer.checkpoint.enabled:
        with s.tf_strategy.scope():
            store = BackupStore(model=s.model, directory=s.run_dir.checkpoints,
                                is_chief=s.is_chief, task_name=s.task,
                                steps_per_epoch=s.data.steps_per_epoch,
                                max_to_keep=s.recipe.trainer.checkpoint.max_to_keep,
                                asynchronous=s.recipe.trainer.checkpoint.async_)
    s.strategy.prepare_model(s.model, s.recipe.strategy)
    if store is not None:
        store.remove_stale_temp()
    return store


def _hyperparameters(optimizer) -> dict[str, float]:
    """The optimizer's hyperparameters held in its variables (saved in checkpoints): what the
    recipe asks for, read before a restore overwrites them. Empty for a schedule (a function of
    ``optimizer.iterations``, not a variable: nothing to restore or re-apply)."""
    import keras

    from kerasdist._compat import internals

    if isinstance(internals.learning_rate_setting(optimizer),
                  keras.optimizers.schedules.LearningRateSchedule):
        return {}
    return {"learning_rate": float(keras.ops.convert_to_numpy(optimizer.learning_rate))}


def _apply_hyperparameters(optimizer, wanted: dict[str, float], *, recipe: Recipe,
                           previous: dict | None, step: int, log_it: bool) -> None:
    """After a restore: hyperparameters the recipe changed since the previous run apply from the
    resumed step. A checkpoint holds the learning rate it was written with (as a callback such
    as ``ReduceLROnPlateau`` left it); when the recipe's constant ``optimizer.learning_rate``
    differs from the previous run's (its ``run.json``), the recipe's (scaled as the recipe says)
    is assigned and logged ("learning_rate 0.001 -> 0.5 at step 6"); otherwise the checkpoint's
    stays. A schedule is never assigned (it continues at ``optimizer.iterations``; a changed
    schedule was refused by :meth:`RunDir.check <kerasdist.training.rundir.RunDir.check>`). The
    other optimizer fields are not in the checkpoint (built from the recipe); their changes since
    the previous run are logged too."""
    import keras
    import numpy as np

    before = ((previous or {}).get("recipe") or {}).get("optimizer") or {}
    now = recipe.optimizer.model_dump(mode="json")
    changes = []
    if "learning_rate" in wanted:
        restored = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        recipe_changed = before.get("learning_rate", now["learning_rate"]) != now["learning_rate"]
        if recipe_changed and np.float32(restored) != np.float32(wanted["learning_rate"]):
            optimizer.learning_rate = wanted["learning_rate"]
            changes.append(f"learning_rate {restored:.6g} -> {wanted['learning_rate']:.6g}")
    changes += [f"{key} {before[key]!r} -> {value!r}" for key, value in now.items()
                if key not in ("name", "learning_rate") and key in before and before[key] != value]
    if log_it:
        for change in changes:
            log.warning(f"optimizer.{change} at step {step} (the recipe's value, applied from the "
                        "resumed step)")


def _callbacks(s: _Session, extra: Sequence) -> list:
    """kerasdist's callbacks (throughput first, ``trainer.profile``'s profiler on every task,
    TensorBoard on the chief unless the recipe has its own), then ``extra`` (the caller's, the
    tracker). The recipe's ``callbacks`` travel apart (``RunContext.state_callbacks``): the loops
    run them before their checkpoint saves."""
    from kerasdist.keras.callbacks import EpochTensorBoard, StepProfile, ThroughputMeter
    from kerasdist.training.keras_objects import has_tensorboard

    node, profile, spec = s.task.replace(":", "-"), s.recipe.trainer.profile, s.tf_config
    cbs = [ThroughputMeter(s.recipe.data.batch_size, task=node,
                           gather=s.strategy.gather_figures(s.tf_strategy))]
    if profile is not None:  # a parameter-server cluster's servers run no callbacks: traced
        servers = {f"{job}-{i}": address for job in ("worker", "ps") for i, address in
                   enumerate(spec.cluster.get(job, ()))} if s.strategy.traits.needs_ps else {}
        cbs.append(StepProfile(profile.steps, s.run_dir.tensorboard, task=node, servers=servers))
    if s.recipe.output.tensorboard and s.is_chief and not has_tensorboard(s.recipe.callbacks):
        cbs.append(EpochTensorBoard(log_dir=str(s.run_dir.tensorboard)))
    return cbs + list(extra)


def _recipe_callbacks(recipe: Recipe, run_dir: RunDir) -> list:
    """The recipe's ``callbacks``, built on every task (EarlyStopping must stop every worker).
    Keras's writing callbacks are first made chief-aware with atomic writes, as
    ``kerasdist.enable()`` does (:mod:`kerasdist._compat.keras_chief_callbacks`: ModelCheckpoint;
    :mod:`kerasdist._compat.keras_chief_logs`: TensorBoard, CSVLogger): under a multi-worker
    strategy only the chief writes the run directory; elsewhere Keras's own code runs."""
    from kerasdist.training.keras_objects import make_callbacks

    if not recipe.callbacks:
        return []
    from kerasdist._compat import keras_chief_callbacks, keras_chief_logs

    keras_chief_callbacks.install()
    keras_chief_logs.install()
    return make_callbacks(recipe.callbacks, run_dir.path)


def _train_and_evaluate(run: RunContext, s: _Session):
    import tensorflow as tf

    from kerasdist.data.inputs import input_failure

    loop = s.strategy.make_loop()
    total = run.recipe.trainer.epochs * run.data.steps_per_epoch
    split = run.recipe.data.train_split
    try:
        if run.start_step < total:
            log.info(f"training from global step {run.start_step} of {total} "
                     f"({run.data.steps_per_epoch} steps per epoch)")
            history = loop.train(run)
        else:
            # said once where the run entered (ClusterKind.enter), before the cluster starts
            log.debug("all epochs already completed by the checkpoint; evaluating only")
            history = {}
        split = run.recipe.data.eval_split
        return history, loop.evaluate(run)
    except tf.errors.OpError as err:
        data_error = input_failure(run.recipe.data, err, split)
        if data_error is not None:  # the user's data function raised: exit 2 naming it
            raise data_error from None
        raised = s.strategy.explain_failure(err, config=run.recipe.strategy,
                                            tf_config=s.tf_config, start_step=run.start_step)
        if raised is err:
            raise
        raise raised from None


def run_session(recipe: Recipe, *, tf_config=None, overwrite: bool = False, verbose=None,
                callbacks: Sequence = (), entry_checked: bool = False) -> RunResult | None:
    """Run this process's part of ``recipe`` (see module docs for the order of work).

    Args:
        recipe: a validated :class:`kerasdist.config.Recipe`.
        tf_config: this task's role (:class:`kerasdist.cluster.spec.TFConfig`) on a cluster; None
            when this process is the whole job. The process environment is never changed.
        overwrite: start afresh: the chief moves a previous run in ``output.run_dir`` aside to
            ``<run_dir>.old-<time>`` (nothing is deleted; see :mod:`kerasdist.training.rundir`).
        verbose: Keras progress verbosity; default ``recipe.trainer.verbose``.
        callbacks: extra Keras callbacks, after kerasdist's own; on a multi-worker cluster they run
            on every worker (they must not write shared files unless on the chief).
        entry_checked: the run's entry checks were made (:meth:`ClusterKind.enter
            <kerasdist.launch.clusters.base.ClusterKind.enter>`, the tracking store's included):
            not repeated here. False: the chief checks the tracking store first.

    Returns:
        :class:`RunResult` in the process that writes the outputs (also in ``metrics.json``), None
        in other tasks. ``extra`` holds ``global_steps`` (= ``optimizer.iterations``),
        ``start_step``, ``steps_per_epoch``, ``shard_policy``, ``task``, ``mends``,
        ``weights_sha256`` and the loop's own figures (``parameter_server``).

    Raises:
        RecipeError, DataError, RunDirError: bad input, before anything is written (an
            unreachable ``output.tracking`` store included; see
            :meth:`RunDir.check <kerasdist.training.rundir.RunDir.check>`); RunDirError also when
            another live run holds the run directory's lock.
        TaskFailedError: a peer task was lost (named in the message).
        TrainingError: no checkpoint reads back whole; a non-finite loss; a non-finite model or
            optimizer state where a checkpoint or ``model.keras`` would be saved (not saved).
        Preempted: SIGTERM or SIGINT (Ctrl-C) during a Keras-fit loop; a checkpoint was saved
            first.
        KeyboardInterrupt: Ctrl-C or SIGTERM outside the training steps; a second Ctrl-C;
            :class:`~kerasdist.errors.Interrupted` during start-up (exit code 130 / 143).
    """
    task = tf_config.task_name if tf_config is not None else "chief:0"
    set_task(task)
    mark("session")
    ensure_configured()
    strategy = registry.for_recipe(recipe)
    start = time.perf_counter()
    is_chief = tf_config.is_chief if tf_config is not None else True
    run_dir = RunDir.of(recipe)
    schema = strategy.traits.checkpoint_schema
    resumable = run_dir.check(recipe, checkpoint_schema=schema, overwrite=overwrite)
    with contextlib.ExitStack() as stack:
        # SIGTERM outside the training steps (evaluation, final save) ends the run as Ctrl-C
        # does (exit 130, checkpoints kept); in training the loop's PreemptionWatch saves; during
        # start-up (below) SIGINT/SIGTERM exit 130/143, also while TF blocks the main thread
        stack.enter_context(terminate_on_sigterm(unless_handled=True))
        with startup("starting: the tracker, the strategy (connecting to the cluster), the "
                     "input, the model"):
            if is_chief and not entry_checked:  # first: a few seconds, no TensorFlow
                recipe = tracking.check(recipe)  # without it when unreachable and not required
            tf_strategy, mends = _start_runtime(recipe, strategy=strategy, tf_config=tf_config)
            mark("strategy")
            data = strategy.make_input(recipe, tf_strategy)
            _check_profile(recipe, data.steps_per_epoch)
            mark("input")
            model = _build_model(recipe, strategy=strategy, tf_strategy=tf_strategy)
            mark("model")
            from_recipe = _recipe_callbacks(recipe, run_dir)  # bad config: nothing written
        if is_chief:
            resumable = run_dir.claim(stack, recipe, checkpoint_schema=schema,
                                      overwrite=overwrite)
        session = _Session(recipe=recipe, run_dir=run_dir, strategy=strategy,
                           tf_strategy=tf_strategy, model=model, data=data, mends=mends,
                           tf_config=tf_config, task=task, is_chief=is_chief,
                           recipe_callbacks=from_recipe, started=start)
        stack.enter_context(tracking.watch_task(recipe, task))
        return _run(session, resumable=resumable, verbose=verbose, callbacks=callbacks)


def _check_profile(recipe: Recipe, steps_per_epoch: int) -> None:
    """Raises RecipeError when ``trainer.profile.steps`` ends after the run's last step."""
    from kerasdist.errors import RecipeError

    total, profile = recipe.trainer.epochs * steps_per_epoch, recipe.trainer.profile
    if profile is not None and profile.steps[1] > total:
        raise RecipeError(f"trainer.profile.steps ends after the run's {total} steps ("
                          f"{recipe.trainer.epochs} epochs of {steps_per_epoch}). Received: "
                          f"steps={list(profile.steps)}")


def _run(s: _Session, *, resumable: bool, verbose, callbacks: Sequence) -> RunResult | None:
    """Restore, train and evaluate; the chief's outputs (:func:`_finish`)."""
    store = _make_store(s)
    tracker = None
    try:
        wanted = _hyperparameters(s.model.optimizer)
        start_step = store.restore() if (store is not None and resumable) else 0
        if start_step:
            _apply_hyperparameters(s.model.optimizer, wanted, recipe=s.recipe,
                                   previous=s.run_dir.previous, step=start_step, log_it=s.is_chief)
        s.strategy.after_restore(s.tf_strategy, start_step, task=s.task, run_dir=s.run_dir.path)
        if s.is_chief:
            s.run_dir.write_run_info(s.recipe, s.strategy.traits.checkpoint_schema)
            s.data.write_artifacts(s.run_dir.path)  # e.g. a csv source's vocabularies
            tracker = tracking.start(s.recipe, run_dir=s.run_dir.path,
                                     num_replicas=s.strategy.num_replicas(s.tf_strategy))
            callbacks = [*callbacks, *([tracker] if tracker is not None else [])]
        run = RunContext(recipe=s.recipe, model=s.model, tf_strategy=s.tf_strategy, data=s.data,
                         store=store, start_step=start_step, callbacks=_callbacks(s, callbacks),
                         verbose=keras_verbose(s.recipe.trainer.verbose if verbose is None
                                               else verbose, is_chief=s.is_chief),
                         task=s.task, is_chief=s.is_chief, state_callbacks=s.recipe_callbacks,
                         logs=s.run_dir.logs)
        if tracker is not None:
            tracker.meter = run.callbacks[0]
        log.info(f"training {s.recipe.model.name} with strategy '{s.recipe.strategy.kind}' on "
                 f"{s.strategy.describe(s.tf_strategy)}; global batch {s.recipe.data.batch_size}; "
                 f"mends {s.mends or 'none'}; run dir {s.run_dir.path}")
        history, evaluation = _train_and_evaluate(run, s)
    except BaseException as err:
        if tracker is not None:
            tracker.fail("FAILED" if isinstance(err, Exception) else "KILLED")  # Ctrl-C, SIGTERM
        raise
    finally:
        if store is not None:
            store.close()
    return _finish(s, run, history=history, evaluation=evaluation, tracker=tracker)


def _finish(s: _Session, run: RunContext, *, history: dict, evaluation: dict,
            tracker) -> RunResult | None:
    """The weights digest (logged by every task); on the chief the checked final state,
    ``model.keras``, ``metrics.json`` and the tracker's end; None elsewhere."""
    from kerasdist.keras.backup import check_finite_state
    from kerasdist.keras.callbacks import weights_digest

    recipe, run_dir, model, data = s.recipe, s.run_dir, s.model, s.data
    steps, digest = int(model.optimizer.iterations.numpy()), weights_digest(model)
    log.log(RECORD, f"done at global step {steps}; weights sha256 {digest}")
    if not s.is_chief:
        return None
    check_finite_state(model, f"the trained model at global step {steps}", keeps=(
        f"{run_dir.model.name} and the newest checkpoint on disk stay the last good ones"))
    model_path = run_dir.save_model(model) if recipe.output.save_model else None
    if model_path is not None:
        serving = run_dir.save_inference_model(recipe, model)
        if serving is not None:
            log.info(f"saved {serving.name}: the model behind the data's preprocessing (it "
                     "predicts raw rows)")
    start_step, store = run.start_step, run.store
    stopped = stop_reason(steps=steps, start_step=start_step, epochs=recipe.trainer.epochs,
                          steps_per_epoch=data.steps_per_epoch, callbacks=s.recipe_callbacks)
    result = RunResult(
        history=history, evaluation=evaluation, throughput=run.callbacks[0].summary(),
        wall_time_s=time.perf_counter() - s.started, run_dir=run_dir.path, model_path=model_path,
        metrics_path=run_dir.metrics, initial_epoch=start_step // data.steps_per_epoch,
        epochs=steps // data.steps_per_epoch, num_replicas=s.strategy.num_replicas(s.tf_strategy),
        strategy=recipe.strategy.kind, extra={
            "epochs_planned": recipe.trainer.epochs, "stopped": stopped,
            "global_steps": steps, "start_step": start_step, "weights_sha256": digest,
            "steps_per_epoch": data.steps_per_epoch, "shard_policy": data.shard_policy,
            "task": s.task, "mends": s.mends, "tasks": run.callbacks[0].tasks,
            "restored_state_sha256": getattr(store, "restored_digest", None),
            "restore_verified": bool(getattr(store, "restore_verified", False)), **run.extra})
    write_metrics(result, recipe)
    if tracker is not None:
        tracker.finish(evaluation=evaluation, step=steps, artifacts=(
            [model_path, run_dir.metrics] if recipe.output.tracking.log_model else []))
    return result

"""The two training loops a strategy can contribute to the run lifecycle.

* :class:`KerasFitLoop`: Keras ``model.fit`` from the exact global step of the checkpoint (a
  half-done epoch is finished with a shorter ``fit``), saving every
  ``trainer.checkpoint.every_steps`` steps and at epoch ends (:class:`~kerasdist.keras.backup.StepBackup`),
  stopping all replicas at one agreed step on SIGTERM or SIGINT (Ctrl-C)
  (:class:`~kerasdist.keras.preemption.PreemptionWatch`).
  Used by ``default``, ``mirrored`` and ``multi_worker``.
* :class:`CoordinatorLoop`: kerasdist's parameter-server ``fit`` (:func:`kerasdist.keras.ps_fit.fit`)
  from the checkpoint's global step on the same resumable streams, saving every
  ``trainer.checkpoint.every_steps`` steps (after a join) and at epoch ends.

Both read and write the same checkpoint schema (:mod:`kerasdist.keras.backup`).
"""

from __future__ import annotations

from kerasdist._log import get_logger
from kerasdist.errors import Preempted
from kerasdist.strategies.context import RunContext

log = get_logger("training")


def _merge(history: dict, more: dict) -> None:
    for key, values in more.items():
        history.setdefault(key, []).extend(float(v) for v in values)


def fit_phases(start_step: int, steps_per_epoch: int, epochs: int):
    """``(first_epoch, last_epoch, steps_per_epoch, stream_step)`` of each ``fit`` call that
    trains from global step ``start_step`` to ``epochs * steps_per_epoch``: a half-done epoch is
    finished by a shorter first call."""
    epoch, done = divmod(start_step, steps_per_epoch)
    phases = []
    if done:
        phases.append((epoch, epoch + 1, steps_per_epoch - done, start_step))
        epoch += 1
    if epoch < epochs:
        phases.append((epoch, epochs, steps_per_epoch, epoch * steps_per_epoch))
    return phases


class KerasFitLoop:
    """Keras ``model.fit`` on the strategy's resumable stream input (see module docs).

    Args:
        boundary_callbacks: ``fn(run) -> list`` of Keras callbacks placed after every other
            callback, in ``fit`` and in the held-out ``evaluate`` (multi-worker: the epoch-boundary
            barrier and the collective watchdog's step guard,
            :mod:`kerasdist.strategies.multi_worker`); made once per loop; default none.
    """

    def __init__(self, *, boundary_callbacks=None):
        self.boundary_callbacks = boundary_callbacks
        self._boundary = None

    def _boundary_callbacks(self, run) -> list:
        if self._boundary is None:
            self._boundary = list(self.boundary_callbacks(run)) if self.boundary_callbacks else []
        return self._boundary

    def train(self, run: RunContext) -> dict[str, list[float]]:
        """Fit from ``run.start_step`` to ``epochs * steps_per_epoch``; returns the history.

        Raises:
            Preempted: SIGTERM or SIGINT; every replica saved a checkpoint at the same step first.
            TrainingError: a non-finite loss, or a non-finite state at a checkpoint (not saved).
        """
        from kerasdist._compat.keras_23360_exhausted_warning import quiet_end_of_input
        from kerasdist.keras.backup import StepBackup
        from kerasdist.keras.callbacks import StopOnNonFiniteLoss, WeightDigest
        from kerasdist.keras.preemption import PreemptionWatch, preemption_signals

        recipe, data = run.recipe, run.data
        history: dict[str, list[float]] = {}
        # the validation input ends where it ends: no "ran out of data" warning (keras#23360)
        declared = recipe.trainer.validation_steps is not None
        with PreemptionWatch(run.tf_strategy, signals=preemption_signals(recipe)) as watch, \
                quiet_end_of_input(steps_declared=declared):
            # one process reads its stop flag at every step; workers vote every few steps
            backup = StepBackup(run.store, start_step=run.start_step, watch=watch,
                                every_steps=recipe.trainer.checkpoint.every_steps,
                                **({"check_every": 1} if watch.single_process else {}))
            eval_ds = data.eval_dataset(run.tf_strategy) if recipe.trainer.validation else None
            # workers of a cluster record their weights' digest per epoch (compared across logs)
            digest = [WeightDigest(backup, run.extra.setdefault("epoch_weights_sha256", []))] \
                if getattr(run.tf_strategy, "cluster_resolver", None) else []
            callbacks = [StopOnNonFiniteLoss(), *run.state_callbacks, backup, *digest,
                         *run.callbacks,
                         *self._boundary_callbacks(run)]
            for first, last, steps, stream_step in fit_phases(
                    run.start_step, data.steps_per_epoch, recipe.trainer.epochs):
                if backup.preempted:
                    break
                try:
                    hist = run.model.fit(
                        data.train_dataset(run.tf_strategy, start_step=stream_step),
                        initial_epoch=first, epochs=last, steps_per_epoch=steps, shuffle=False,
                        validation_data=eval_ds, validation_steps=recipe.trainer.validation_steps,
                        callbacks=callbacks, verbose=run.verbose)
                except Preempted:  # mid-epoch (StepBackup): training ends as Keras ends it
                    for callback in callbacks:
                        callback.on_train_end()
                    raise
                _merge(history, hist.history)
                if run.model.stop_training and not backup.preempted:
                    log.info("a callback stopped training (e.g. EarlyStopping) at global step "
                             f"{backup.step}")
                    break
            if backup.preempted:
                raise Preempted(backup.step)
        return history

    def evaluate(self, run: RunContext) -> dict[str, float]:
        """Held-out evaluation (every replica; multi-worker logs are the mean over workers)."""
        from kerasdist._compat.keras_23360_exhausted_warning import quiet_end_of_input

        eval_ds = run.data.eval_dataset(run.tf_strategy)
        if eval_ds is None:
            return {}
        steps = run.recipe.trainer.validation_steps
        with quiet_end_of_input(steps_declared=steps is not None):  # keras#23360
            logs = run.model.evaluate(eval_ds, steps=steps, verbose=0, return_dict=True,
                                      callbacks=self._boundary_callbacks(run))
        return {key: float(value) for key, value in logs.items()}


def _stop_when_asked(watch):
    """A Keras callback: once SIGTERM or SIGINT was received (``watch``, a
    :class:`~kerasdist.keras.preemption.PreemptionWatch`), set ``model.stop_training``; the
    parameter-server loop then stops scheduling, joins and ends ``fit`` without ending the cut
    epoch (:func:`kerasdist.keras.ps_fit.fit`); :class:`CoordinatorLoop` saves the checkpoint."""
    import keras

    class StopWhenAsked(keras.callbacks.Callback):
        def stop_requested(self) -> bool:
            """Read by the coordinator's loop while it waits on a call (ps_loop)."""
            return watch.requested

        def on_train_batch_end(self, batch, logs=None):
            if watch.requested:
                self.model.stop_training = True

    return StopWhenAsked()


def _skipping(train_fn, skip_batches: int):
    """``dataset_fn(input_context)`` of a stream (:class:`kerasdist.data.inputs.StreamInput`
    ``train_fn``) started ``skip_batches`` batches in."""
    return lambda ctx: train_fn(ctx, skip_batches)


class CoordinatorLoop:
    """kerasdist's parameter-server loop, run by the coordinator (see module docs)."""

    def train(self, run: RunContext) -> dict[str, list[float]]:
        """Fit from the checkpoint's global step to ``epochs * steps_per_epoch`` (a half-done
        epoch is finished by a shorter first ``fit``), saving every
        ``trainer.checkpoint.every_steps`` steps (the coordinator joins, then saves) and at epoch
        ends; adds ``parameter_server`` figures (:class:`~kerasdist.keras.ps_loop.PSStats`, the
        ps placement) to ``run.extra``.

        Raises:
            Preempted: SIGTERM or SIGINT; the coordinator stopped scheduling, joined the workers
                and saved a checkpoint at the global step reached (exit code 130).
        """
        import math

        from kerasdist._compat import tf_frozen_task
        from kerasdist.keras import ps_fit
        from kerasdist.keras.backup import EpochEndSave
        from kerasdist.keras.callbacks import StopOnNonFiniteLoss
        from kerasdist.keras.preemption import PreemptionWatch, preemption_signals
        from kerasdist.keras.ps_loop import PSStats, global_step

        recipe, data = run.recipe, run.data
        spec = ps_fit.cluster_spec(run.tf_strategy)
        workers = spec.num_tasks("worker")
        saver = ([EpochEndSave(run.store, every_steps=recipe.trainer.checkpoint.every_steps)]
                 if run.store is not None else [])
        eval_fn = data.eval_fn if recipe.trainer.validation else None
        history: dict[str, list[float]] = {}
        total = None
        # The coordinator alone decides (no vote): SIGTERM or SIGINT stops the scheduling, the
        # loop joins the workers, then the checkpoint at the step reached is written below.
        # A stop keeps freed functions registered (tf_frozen_task: removing one waits on every
        # task, a frozen worker too), for good when calls were left on a silent worker.
        watch = PreemptionWatch(run.tf_strategy, on_request=tf_frozen_task.keep_functions,
                                signals=preemption_signals(recipe))
        stuck = False
        try:
            with watch:
                callbacks = [StopOnNonFiniteLoss(), _stop_when_asked(watch), *run.state_callbacks,
                             *saver, *run.callbacks]
                for first, last, steps, stream_step in fit_phases(
                        run.start_step, data.steps_per_epoch, recipe.trainer.epochs):
                    # each worker's share of the steps; synchronous: every pipeline, every step
                    sync = getattr(recipe.strategy, "sync", None)
                    skip = stream_step if sync else math.ceil(stream_step / workers)
                    hist = ps_fit.fit(run.model, _skipping(data.train_fn, skip), epochs=last,
                                      initial_epoch=first, steps_per_epoch=steps,
                                      validation_data=None if watch.requested else eval_fn,
                                      validation_steps=recipe.trainer.validation_steps,
                                      callbacks=callbacks, verbose=run.verbose)
                    _merge(history, hist.history)
                    total = total or PSStats(workers)
                    total.merge(hist.ps_totals)
                    stuck = stuck or hist.left_in_flight
                    if run.model.stop_training:
                        break
                if watch.requested and saver:  # the checkpoint at the step reached
                    saver[0].save_step(global_step(run.model))
        finally:
            if not stuck:
                tf_frozen_task.release_functions()
        if watch.requested:
            step = global_step(run.model)
            log.info(f"preempted: checkpoint at global step {step} saved; stopping")
            raise Preempted(step)
        from kerasdist.keras.ps_placement import describe, ps_placement

        placement = ps_placement(run.model, spec.num_tasks("ps"), logs=run.logs)
        total = total or PSStats(workers)
        run.extra["parameter_server"] = {**total.summary(global_step(run.model)),
                                         "num_ps": spec.num_tasks("ps"),
                                         "num_workers": workers, "ps_placement": placement}
        for line in describe(placement):
            log.info(line)
        return history

    def evaluate(self, run: RunContext) -> dict[str, float]:
        """Held-out evaluation scheduled on the workers (each batch exactly once)."""
        from kerasdist.keras import ps_fit

        if run.data.eval_fn is None:
            return {}
        return ps_fit.evaluate(run.model, run.data.eval_fn, steps=run.recipe.trainer.validation_steps,
                               verbose=0, return_dict=True)

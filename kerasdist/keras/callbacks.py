"""Keras callbacks kerasdist adds to every training loop: throughput timing, and the digest of the
weights every worker records at each epoch end (:class:`WeightDigest`)."""

from __future__ import annotations

import hashlib
import threading
import time

import keras
import numpy as np

from kerasdist._log import RECORD, get_logger
from kerasdist._timeline import mark
from kerasdist.keras.timing import StepClock

log = get_logger("backup")


class ThroughputMeter(keras.callbacks.Callback):
    """Measure training examples/s over timed steps, excluding compile/trace and validation.

    Drives a :class:`~kerasdist.keras.timing.StepClock` (``self.clock``), counting a call's steps
    from the batch index Keras passes, so ``steps_per_execution`` > 1 and the parameter-server loop
    follow the same rule; kerasdist's only throughput definition. At each epoch end ``tasks``
    gets each task's cumulative steps and steps/s over the epoch's training
    (``{"worker-1": {"steps": [...], "steps_per_sec": [...]}}``): this task's, each worker's from
    the ``ps_steps_worker_<i>`` logs under parameter server, or every task's with ``gather``.

    Args:
        global_batch_size: examples per step (all replicas together).
        task: this task's name (``worker-1``).
        gather: ``fn({task: (steps, seconds)}) -> {task: (steps, seconds)}``, a collective that
            returns every task's figures of the epoch (multi-worker); None: this task's only.
    """

    def __init__(self, global_batch_size: int, *, task: str = "chief-0", gather=None):
        super().__init__()
        self.clock = StepClock(global_batch_size)
        self._last_batch = -1
        self._marked = False
        self.task, self.gather, self.tasks = task, gather, {}
        self._epoch = [0.0, 0.0, 0]  # begin, last step's end (perf_counter s), steps

    def on_train_begin(self, logs=None):
        self.clock.train_begin()

    def on_epoch_begin(self, epoch, logs=None):
        self.clock.epoch_begin()
        self._last_batch = -1
        self._epoch = [time.perf_counter(), time.perf_counter(), 0]

    def on_train_batch_end(self, batch, logs=None):
        if not self._marked:  # the start-up timeline (kerasdist._timeline)
            self._marked = True
            mark("first step")
        self.clock.step_end(max(1, batch - self._last_batch))
        self._epoch[1:] = time.perf_counter(), self._epoch[2] + max(1, batch - self._last_batch)
        self._last_batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.clock.epoch_end()
        seconds = self._epoch[1] - self._epoch[0]
        workers = {f"worker-{k.rsplit('_', 1)[1]}": (float(v), seconds) for k, v in
                   (logs or {}).items() if k.startswith("ps_steps_worker_")}
        figures = workers or {self.task: (float(self._epoch[2]), seconds)}
        for task, (steps, secs) in (self.gather(figures) if self.gather else figures).items():
            entry = self.tasks.setdefault(task, {"steps": [], "steps_per_sec": []})
            entry["steps"].append(int(steps) + (entry["steps"][-1] if entry["steps"] else 0))
            entry["steps_per_sec"].append(steps / secs if secs > 0 else 0.0)

    def summary(self) -> dict:
        """The clock's JSON-ready figures (``metrics.json``'s ``throughput``)."""
        return self.clock.summary()


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """Keras's ``TensorBoard``, without its per-step Python when nothing is written per step.

    Keras's ``on_train_batch_end`` calls ``summary.scalar`` for every log entry of every step even
    with ``update_freq='epoch'``, where nothing is written (``docs/benchmarks.md``). The step hooks
    are skipped then, after the run's first step (it writes the graph); with a ``profile_batch``, a
    number ``update_freq`` or ``write_steps_per_second`` it is Keras's ``TensorBoard`` unchanged.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import inspect

        given = inspect.signature(keras.callbacks.TensorBoard).bind(*args, **kwargs).arguments
        self.per_step = not (self.update_freq == "epoch" and not self.write_steps_per_second
                             and _no_profile(given.get("profile_batch", 0)))
        self._first_step_done = False

    def on_train_batch_begin(self, batch, logs=None):
        if self.per_step or not self._first_step_done:
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self.per_step or not self._first_step_done:
            super().on_train_batch_end(batch, logs)
            self._first_step_done = True


def _no_profile(profile_batch) -> bool:
    """Whether a ``TensorBoard(profile_batch=...)`` value asks for no profile (0, "0", "0,0")."""
    if isinstance(profile_batch, str):
        return all(part.strip() in ("", "0") for part in profile_batch.split(","))
    if isinstance(profile_batch, (list, tuple)):
        return all(not int(b) for b in profile_batch)
    return not profile_batch


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stop training with an error at the first step whose loss is NaN or infinite.

    Unlike Keras's ``TerminateOnNaN`` (which only sets ``stop_training``, so a caller would save
    the non-finite weights), this raises before any later callback of the step (put it first).

    Raises:
        kerasdist.errors.TrainingError: naming the batch and the loss value (exit code 1).
    """

    def on_train_batch_end(self, batch, logs=None):
        import math

        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(keras.ops.convert_to_numpy(loss))
        if not math.isfinite(loss):
            from kerasdist.errors import TrainingError

            raise TrainingError(
                f"the training loss became {loss} at batch {batch} of this epoch; stopped without "
                "saving (the last checkpoint and model on disk are the last good ones). Lower "
                "optimizer.learning_rate or check the data for NaN/inf values.")


class MetricsProgbar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar without the parameter-server figures (``ps_*``; they stay in the logs)."""

    def _shown(self, logs):
        return {k: v for k, v in (logs or {}).items() if not k.startswith("ps_")}

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, self._shown(logs))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, self._shown(logs))


def weights_digest(model) -> str:
    """SHA-256 of every model weight's bytes, in order (hex, 64 characters)."""
    digest = hashlib.sha256()
    for variable in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(variable)).tobytes())
    return digest.hexdigest()


class WeightDigest(keras.callbacks.Callback):
    """Record ``epoch E step S weights sha256 HEX`` after every epoch, on every worker: logged at
    :data:`kerasdist._log.RECORD` level (task logs, not a console at the default verbosity) and
    appended to ``records``. Comparing them across the workers shows identical weights.

    Args:
        step_source: an object with a ``step`` attribute (the :class:`StepBackup`).
        records: receives ``{"epoch": E, "step": S, "sha256": HEX}`` per epoch (E from 1).
    """

    def __init__(self, step_source, records: list):
        super().__init__()
        self.step_source, self.records = step_source, records

    def on_epoch_end(self, epoch, logs=None):
        step, digest = self.step_source.step, weights_digest(self.model)
        log.log(RECORD, f"epoch {epoch + 1} step {step} weights sha256 {digest}")
        self.records.append({"epoch": epoch + 1, "step": step, "sha256": digest})


class StepProfile(keras.callbacks.Callback):
    """A TensorBoard profile of global steps ``first`` to ``last`` (1-based, inclusive) of this
    task into ``<logdir>/profile-<task>``, as Keras's ``TensorBoard(profile_batch=...)``. Tasks that
    run no callbacks (``servers``: a parameter-server cluster's workers and ps) are traced through
    their TensorFlow servers for ``last - first + 1`` times this task's mean step time so far (1 s
    a step when none ran).

    Args:
        steps: ``(first, last)`` global steps.
        logdir: the run's TensorBoard folder.
        task: this task's name (``worker-1``).
        servers: ``{task: "host:port"}`` traced remotely; default none.
    """

    def __init__(self, steps, logdir, *, task: str, servers=None):
        super().__init__()
        (self.first, self.last), self.logdir, self.task = steps, str(logdir), task
        self.servers, self.threads, self.state = dict(servers or {}), [], "waiting"

    def on_train_begin(self, logs=None):
        self.step = self.began_step = int(np.asarray(self.model.optimizer.iterations))
        self.began, self._last = time.perf_counter(), -1

    def on_epoch_begin(self, epoch, logs=None):
        self._last = -1

    def on_train_batch_begin(self, batch, logs=None):
        import tensorflow as tf

        if self.state == "waiting" and self.first <= self.step + 1 <= self.last:
            self.state = "profiling"
            tf.profiler.experimental.start(f"{self.logdir}/profile-{self.task}")
            done = self.step - self.began_step
            per_step = (time.perf_counter() - self.began) / done if done else 1.0
            duration_ms = max(100, int(1000 * per_step * (self.last - self.step)))
            for task, address in self.servers.items():
                self.threads.append(threading.Thread(target=_trace, daemon=True, args=(
                    address, f"{self.logdir}/profile-{task}", duration_ms)))
                self.threads[-1].start()

    def on_train_batch_end(self, batch, logs=None):
        self.step += max(1, batch - self._last)
        self._last = batch
        if self.state == "profiling" and self.step >= self.last:
            self.on_train_end()

    def on_train_end(self, logs=None):
        import tensorflow as tf

        if self.state == "profiling":
            self.state = "done"
            tf.profiler.experimental.stop()
            log.info(f"profile of global steps {self.first}-{self.last} written to "
                     f"{self.logdir}/profile-{self.task}")
        for thread in self.threads:
            thread.join()
        self.threads = []


def _trace(address: str, logdir: str, duration_ms: int) -> None:
    import tensorflow as tf

    try:
        tf.profiler.experimental.client.trace(f"grpc://{address}", logdir, duration_ms,
                                              num_tracing_attempts=1)  # bounded: one window
    except Exception as err:  # noqa: BLE001 - a profile must not end the run
        log.warning(f"no profile of {logdir}: {type(err).__name__}: {err}")

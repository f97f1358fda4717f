"""The coordinator's loops for parameter-server training: schedule steps, join, call callbacks.

The loop schedules up to ``MAX_PENDING_PER_WORKER * num_workers`` calls
(:mod:`kerasdist.keras.ps_steps`) ahead, reports each in order as it completes, and joins at each
epoch's end before reading metrics and the per-worker counters (one small variable on a ps). Steps
are at-least-once (``docs/python-api.md``): a lost worker repeats at most its call in flight
(:func:`repeated_steps_bound`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kerasdist._log import get_logger
from kerasdist.keras import ps_stop
from kerasdist.keras.ps_input import SentIterator

log = get_logger("training")

MAX_PENDING_PER_WORKER = 4  # scheduled-but-unreported calls per worker before the loop waits
CALLS_IN_FLIGHT_PER_WORKER = 1  # ClusterCoordinator: one closure-processing thread per worker


def repeated_steps_bound(lost_workers: int, steps_per_execution: int = 1) -> int:
    """Most steps a run can apply twice when ``lost_workers`` worker tasks died mid-run: each lost
    worker's call in flight is re-run, at most ``steps_per_execution`` steps."""
    return lost_workers * CALLS_IN_FLIGHT_PER_WORKER * max(1, steps_per_execution)


class PSStats:
    """Per-worker step counts, examples and staleness of parameter-server steps, and whole-epoch
    seconds and examples (first call included, validation excluded). ``steps`` are the steps the
    loop scheduled and saw complete (exact); the other figures come from the workers' counters
    and may exceed them after a lost worker by at most :func:`repeated_steps_bound`.
    """

    def __init__(self, num_workers: int):
        self.steps_per_worker = np.zeros(num_workers, np.int64)
        self.completed_steps: int | None = None  # set by the loop; None: the counters' sum
        self.examples = 0
        self.staleness_sum = 0
        self.staleness_max = 0
        self.epoch_seconds: list[float] = []
        self.epoch_examples: list[int] = []
        self.sync: dict | None = None  # synchronous mode: K, N, gradients, aggregated, dropped

    @property
    def steps(self) -> int:
        """Steps scheduled and completed (the counters' sum where the loop set none)."""
        return self.counted_steps if self.completed_steps is None else self.completed_steps

    @property
    def counted_steps(self) -> int:
        """Steps the workers counted (at-least-once; see the class docs)."""
        return int(self.steps_per_worker.sum())

    @classmethod
    def from_counters(cls, counters) -> PSStats:
        """Figures from the per-worker counters ``[num_workers, 4]`` (int64; columns
        :data:`kerasdist.keras.ps_steps.COUNTER_COLUMNS`: steps, staleness_sum, examples,
        staleness_max)."""
        counters = np.asarray(counters, np.int64).reshape(-1, 4)
        stats = cls(len(counters))
        stats.steps_per_worker = counters[:, 0].copy()
        stats.staleness_sum = int(counters[:, 1].sum())
        stats.examples = int(counters[:, 2].sum())
        stats.staleness_max = int(counters[:, 3].max(initial=0))
        return stats

    def merge(self, other: PSStats) -> None:
        if self.completed_steps is not None or other.completed_steps is not None:
            self.completed_steps = self.steps + other.steps
        self.steps_per_worker += other.steps_per_worker
        self.examples += other.examples
        self.staleness_sum += other.staleness_sum
        self.staleness_max = max(self.staleness_max, other.staleness_max)
        self.epoch_seconds += other.epoch_seconds
        self.epoch_examples += other.epoch_examples
        if other.sync:
            mine = self.sync or {**other.sync, "gradients": 0, "aggregated": 0, "dropped": 0}
            self.sync = {**mine, **{key: mine[key] + other.sync[key]
                                    for key in ("gradients", "aggregated", "dropped")}}

    @property
    def whole_epoch_examples_per_sec(self) -> float | None:
        """examples/s over whole training epochs 2..n (None with fewer than 2 epochs)."""
        seconds, examples = self.epoch_seconds[1:], self.epoch_examples[1:]
        return sum(examples) / sum(seconds) if seconds and sum(seconds) > 0 else None

    @property
    def staleness_mean(self) -> float:
        counted = self.counted_steps
        return self.staleness_sum / counted if counted else 0.0

    def logs(self, global_step: int) -> dict[str, float]:
        """Scalar entries for the epoch logs (History, TensorBoard, progress bar)."""
        logs = {"ps_global_step": float(global_step), "ps_steps": float(self.steps),
                "ps_staleness_mean": self.staleness_mean,
                "ps_staleness_max": float(self.staleness_max)}
        for i, n in enumerate(self.steps_per_worker):
            logs[f"ps_steps_worker_{i}"] = float(n)
        if self.sync:
            logs.update(ps_sync_aggregated=float(self.sync["aggregated"]),
                        ps_sync_dropped=float(self.sync["dropped"]))
        return logs

    def summary(self, global_step: int) -> dict[str, Any]:
        """JSON-ready figures of a whole run (``metrics.json``'s ``parameter_server``)."""
        return {"global_step": int(global_step), "steps": self.steps,
                "steps_per_worker": [int(n) for n in self.steps_per_worker],
                "num_workers": len(self.steps_per_worker), "examples": int(self.examples),
                "whole_epoch_examples_per_sec": self.whole_epoch_examples_per_sec,
                "epoch_seconds": list(self.epoch_seconds),
                "epoch_examples": list(self.epoch_examples), "staleness_mean": self.staleness_mean,
                "staleness_max": int(self.staleness_max),
                **({"sync": dict(self.sync)} if self.sync else {})}


@dataclass
class PSRun:
    """What the loops need (``counters``: :func:`kerasdist.keras.ps_steps.make_counters`)."""

    model: Any
    strategy: Any
    coordinator: Any
    num_workers: int
    train_function: Any = None
    test_function: Any = None
    counters: Any = None
    sync: Any = None  # synchronous mode: the kerasdist.keras.ps_sync.SyncStep
    stuck: bool = False  # a stop left calls in flight (a worker that does not answer)

    @property
    def max_pending(self) -> int:
        return MAX_PENDING_PER_WORKER * self.num_workers


def callback_list(model, callbacks, *, verbose, steps: int | None, batches: int):
    """``callbacks`` as the ``CallbackList`` of one ``evaluate``/``predict`` pass (with Keras's
    progress bar unless ``verbose`` is 0), its length ``steps``, else ``batches`` when known (> 0)."""
    import keras

    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return keras.callbacks.CallbackList(callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1,
                                        steps=steps or (batches if batches > 0 else None), model=model)


def global_step(model) -> int:
    """``model.optimizer.iterations`` read from the ps (0 without an optimizer)."""
    return int(np.asarray(model.optimizer.iterations)) if model.optimizer is not None else 0


def metrics_logs(model, last_logs=None) -> dict[str, Any]:
    """The logs Keras's ``fit``/``evaluate`` report (call after ``join``), picked as
    ``Trainer._get_metrics_result_or_logs`` does: the model's metric results when the last step's
    logs carry the same keys (both flattened by ``pythonify_logs``), else the last completed call's.

    Args:
        model: the compiled model.
        last_logs: the last step's logs (nested dict of scalars or arrays), or None/empty for
            the metric results.

    Returns:
        A flat ``{name: float}`` (values that are not scalars stay arrays, as Keras leaves them).
    """
    from kerasdist._compat import internals

    result = internals.pythonify_logs(model.get_metrics_result())
    last = internals.pythonify_logs(last_logs) if last_logs else {}
    if not last or set(last) == set(result):
        return result
    return last


def train_epoch(run: PSRun, iterator, *, steps: int, callbacks) -> tuple[dict, PSStats]:
    """Schedule ``steps`` training steps (summed over workers); return (last logs, stats).

    Batch callbacks as calls are scheduled and complete; stops once ``model.stop_training`` is
    set. A step saver (:func:`_step_saver`) is called, after a join, each time the scheduled steps
    pass a multiple of its ``every_steps`` before the epoch's end.
    """
    import tensorflow as tf

    model = run.model
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    begin, started = 0, False
    run.counters.assign(tf.zeros_like(run.counters))
    saver = _step_saver(callbacks)
    first_step = global_step(model) if saver is not None else 0
    epoch_started = time.perf_counter()
    asked = ps_stop.stop_probe(callbacks)
    calls = ps_stop.Calls(callbacks, asked)

    while begin < steps and not model.stop_training:
        size = min(per_call, steps - begin)
        callbacks.on_train_batch_begin(begin)
        calls.pending.append((begin + size - 1, run.coordinator.schedule(
            run.train_function, args=(iterator, tf.constant(size, tf.int32)))))
        begin += size
        # wait for the first call (tracing, registration on the workers), then keep a few
        if not started or len(calls.pending) > run.max_pending:
            started = True
            if not calls.complete():
                ps_stop.go_on_without(run, calls.pending)
                break
        if saver is not None and begin < steps and \
                (first_step + begin) // saver.every_steps > (first_step + begin - size) // \
                saver.every_steps:
            # every scheduled step applied, none in flight (unless a stop leaves a silent
            # worker's calls: then the epoch-end save below writes the steps applied)
            if ps_stop.left_in_flight(run, asked) or not calls.complete_all():
                ps_stop.go_on_without(run, calls.pending)
                break
            saver.save_step(global_step(model))
    if run.stuck or ps_stop.left_in_flight(run, asked) or not calls.complete_all():
        ps_stop.go_on_without(run, calls.pending)
        begin -= len(calls.pending) * per_call  # at most: the last call may have been shorter
        calls.pending.clear()
    last_logs = calls.last_logs
    stats = PSStats.from_counters(run.counters.numpy())
    stats.completed_steps = begin  # join returned: every scheduled call completed
    stats.epoch_seconds.append(time.perf_counter() - epoch_started)
    stats.epoch_examples.append(stats.examples)
    return last_logs, stats


def _step_saver(callbacks):
    """The callback that saves every ``every_steps`` steps (:class:`kerasdist.keras.backup.
    EpochEndSave` with ``every_steps``), or None."""
    for callback in getattr(callbacks, "callbacks", callbacks) or []:
        if getattr(callback, "every_steps", None) and hasattr(callback, "save_step"):
            return callback
    return None


def _evaluation_call(run: PSRun, iterator, done: int, callbacks, exhausted: set, last: list):
    arg = iterator
    if isinstance(iterator, SentIterator):
        arg = next(iterator, None)
        if arg is None:
            exhausted.update(range(run.num_workers))
            return done
    stats, logs = run.coordinator.schedule(run.test_function, args=(arg,)).fetch()
    worker, ran, _ = (int(v) for v in stats)
    if not ran:
        exhausted.add(worker)
        return done
    callbacks.on_test_batch_begin(done)
    callbacks.on_test_batch_end(done, logs)
    last[:] = [logs]
    return done + 1


def evaluate_loop(run: PSRun, iterator, *, steps: int | None, callbacks) -> dict:
    """Run ``test_step`` over the per-worker evaluation shards; return the metric results.

    Until ``steps`` batches ran or every worker reported its shard exhausted. One call is in
    flight at a time: metrics updating with ``assign(self + delta)`` (``F1Score``) would lose
    updates to two workers at once.

    Args:
        run: the :class:`PSRun`.
        iterator: per-worker iterators over finite evaluation pipelines.
        steps: batches to evaluate (summed over workers), or None for all of them.
        callbacks: a Keras ``CallbackList``.

    Returns:
        ``{metric name: float}`` as Keras picks it (:func:`metrics_logs`; the last call's
        logs for a custom ``test_step`` whose keys are not the metrics').
    """
    model = run.model
    model.reset_metrics()
    callbacks.on_test_begin()
    exhausted: set = set()
    done, last = 0, [{}]
    while (steps is None or done < steps) and len(exhausted) < run.num_workers:
        done = _evaluation_call(run, iterator, done, callbacks, exhausted, last)
    run.coordinator.join()
    logs = metrics_logs(model, last[0])
    callbacks.on_test_end(logs)
    return logs

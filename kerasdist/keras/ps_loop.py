"""The coordinator's loops for parameter-server training: schedule steps, join, call callbacks.

The loop owns everything around the step (:mod:`kerasdist.keras.ps_steps`): it schedules up to
``MAX_PENDING_PER_WORKER * num_workers`` steps ahead, fetches each step's result in order as it
completes (so Keras callbacks and the progress bar advance while the workers run), joins the
coordinator at the end of every epoch and only then reads metrics, writes checkpoints and calls
``on_epoch_end``.

Steps are **at-least-once**. TF's ``ClusterCoordinator`` runs one scheduled function at a time per
worker (one closure-processing thread each); when a worker is lost, the function it was running
is put back in the queue and runs again elsewhere, re-applying the steps it had already applied.
A lost worker therefore repeats at most one scheduled call, ``steps_per_execution`` steps, on top
of the requested ones (:func:`repeated_steps_bound`); without a lost worker the global step
(``optimizer.iterations``) is exactly the number of steps scheduled.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_PENDING_PER_WORKER = 4  # scheduled-but-unreported steps per worker before the loop waits
CALLS_IN_FLIGHT_PER_WORKER = 1  # ClusterCoordinator: one closure-processing thread per worker


def repeated_steps_bound(lost_workers: int, steps_per_execution: int = 1) -> int:
    """Most steps a run can apply twice (at-least-once) when ``lost_workers`` worker tasks died
    mid-run: each lost worker's calls in flight are re-run, each at most ``steps_per_execution``
    steps. Never more than the loop keeps scheduled, ``max_pending + 1`` calls."""
    return lost_workers * CALLS_IN_FLIGHT_PER_WORKER * max(1, steps_per_execution)


class PSStats:
    """Per-worker step counts, examples and staleness of parameter-server steps, and the
    whole-epoch time.

    Throughput over timed steps (the one definition every path uses) is measured by the
    :class:`~kerasdist.keras.callbacks.ThroughputMeter` callback; here only the *whole-epoch*
    figure is kept (first scheduled call included, validation excluded: the only timing
    tf_keras's own PS ``fit`` allows), as ``whole_epoch_examples_per_sec``. Units: steps =
    optimizer updates; seconds; examples/s.
    """

    def __init__(self, num_workers: int):
        self.steps_per_worker = np.zeros(num_workers, np.int64)
        self.examples = 0
        self.staleness_sum = 0
        self.staleness_max = 0
        # Whole-epoch figures (first call included, validation excluded), one entry per epoch:
        # the timing tf_keras's own PS fit allows, used by ``kerasdist bench`` to compare.
        self.epoch_seconds: list[float] = []
        self.epoch_examples: list[int] = []

    @property
    def steps(self) -> int:
        return int(self.steps_per_worker.sum())

    def add(self, stats) -> None:
        """Add one call's int64 stats ``[worker, steps, staleness_sum, staleness_max, examples]``."""
        worker, steps, s_sum, s_max, examples = (int(v) for v in stats)
        self.steps_per_worker[worker] += steps
        self.examples += examples
        self.staleness_sum += s_sum
        self.staleness_max = max(self.staleness_max, s_max)

    def merge(self, other: PSStats) -> None:
        self.steps_per_worker += other.steps_per_worker
        self.examples += other.examples
        self.staleness_sum += other.staleness_sum
        self.staleness_max = max(self.staleness_max, other.staleness_max)
        self.epoch_seconds += other.epoch_seconds
        self.epoch_examples += other.epoch_examples

    @property
    def whole_epoch_examples_per_sec(self) -> float | None:
        """examples/s over whole training epochs 2..n (None with fewer than 2 epochs)."""
        seconds, examples = self.epoch_seconds[1:], self.epoch_examples[1:]
        return sum(examples) / sum(seconds) if seconds and sum(seconds) > 0 else None

    @property
    def staleness_mean(self) -> float:
        return self.staleness_sum / self.steps if self.steps else 0.0

    def logs(self, global_step: int) -> dict[str, float]:
        """Scalar entries for the epoch logs (History, TensorBoard, progress bar)."""
        logs = {"ps_global_step": float(global_step), "ps_steps": float(self.steps),
                "ps_staleness_mean": self.staleness_mean,
                "ps_staleness_max": float(self.staleness_max)}
        for i, n in enumerate(self.steps_per_worker):
            logs[f"ps_steps_worker_{i}"] = float(n)
        return logs

    def summary(self, global_step: int) -> dict[str, Any]:
        """JSON-ready figures of a whole run (``metrics.json``'s ``parameter_server``)."""
        return {"global_step": int(global_step), "steps": self.steps,
                "steps_per_worker": [int(n) for n in self.steps_per_worker],
                "num_workers": len(self.steps_per_worker), "examples": int(self.examples),
                "whole_epoch_examples_per_sec": self.whole_epoch_examples_per_sec,
                "epoch_seconds": list(self.epoch_seconds),
                "epoch_examples": list(self.epoch_examples), "staleness_mean": self.staleness_mean,
                "staleness_max": int(self.staleness_max)}


@dataclass
class PSRun:
    """What the loops need: the model, its strategy, the coordinator and the traced functions."""

    model: Any
    strategy: Any
    coordinator: Any
    num_workers: int
    train_function: Any = None
    test_function: Any = None

    @property
    def max_pending(self) -> int:
        return MAX_PENDING_PER_WORKER * self.num_workers


def global_step(model) -> int:
    """``model.optimizer.iterations`` read from the ps (0 without an optimizer)."""
    return int(np.asarray(model.optimizer.iterations)) if model.optimizer is not None else 0


def metrics_logs(model, last_logs=None) -> dict[str, float]:
    """The model's metric results read from the ps variables (call after ``join``).

    As Keras does, a custom step's last logs are used instead when they carry keys the
    model's metrics do not have.
    """
    result = {k: float(np.asarray(v)) for k, v in model.get_metrics_result().items()}
    if last_logs and set(last_logs) - set(result):
        return {k: float(np.asarray(v)) for k, v in last_logs.items()}
    return result


def train_epoch(run: PSRun, iterator, *, steps: int, callbacks) -> tuple[dict, PSStats]:
    """Schedule ``steps`` training steps (summed over workers); return (last logs, stats).

    Calls ``on_train_batch_begin`` when a call is scheduled and ``on_train_batch_end`` when its
    result is fetched; stops scheduling once ``model.stop_training`` is set.
    """
    import tensorflow as tf

    model, stats = run.model, PSStats(run.num_workers)
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    pending: collections.deque = collections.deque()
    last_logs, begin, started = {}, 0, False
    epoch_started = time.perf_counter()

    def complete():
        nonlocal last_logs
        end, value = pending.popleft()
        last_logs, vector = value.fetch()
        stats.add(vector)
        callbacks.on_train_batch_end(end, last_logs)

    while begin < steps and not model.stop_training:
        size = min(per_call, steps - begin)
        callbacks.on_train_batch_begin(begin)
        pending.append((begin + size - 1, run.coordinator.schedule(
            run.train_function, args=(iterator, tf.constant(size, tf.int32)))))
        begin += size
        if not started:  # wait for the first call (tracing, registration on the workers)
            complete()
            started = True
        elif len(pending) > run.max_pending:
            complete()
    run.coordinator.join()
    while pending:
        complete()
    stats.epoch_seconds.append(time.perf_counter() - epoch_started)
    stats.epoch_examples.append(stats.examples)
    return last_logs, stats


def _evaluation_round(run: PSRun, iterator, size: int, done: int, callbacks, exhausted: set):
    values = [run.coordinator.schedule(run.test_function, args=(iterator,))
              for _ in range(size)]
    for value in values:
        worker, ran, _ = (int(v) for v in value.fetch())
        if ran:
            callbacks.on_test_batch_begin(done)
            callbacks.on_test_batch_end(done, {})
            done += 1
        else:
            exhausted.add(worker)
    return done


def evaluate_loop(run: PSRun, iterator, *, steps: int | None, batches: int, callbacks) -> dict:
    """Run ``test_step`` over the per-worker evaluation shards; return the metric results.

    Scheduled steps go to whichever worker is free, so one worker may run out of its shard
    while another still has batches: the loop schedules rounds until ``steps`` batches ran or
    every worker has reported its shard exhausted, which makes a pass without ``steps`` exact
    (each batch evaluated once). Metrics are reset first and read after ``join``.

    Args:
        run: the :class:`PSRun`.
        iterator: per-worker iterators over finite evaluation pipelines.
        steps: batches to evaluate (summed over workers), or None for all of them.
        batches: batches in the whole pass if known (> 0), used to size the first round.
        callbacks: a Keras ``CallbackList``; batch callbacks get empty logs.

    Returns:
        ``{metric name: float}``.
    """
    model = run.model
    model.reset_metrics()
    callbacks.on_test_begin()
    exhausted: set = set()
    done = 0
    while (steps is None or done < steps) and len(exhausted) < run.num_workers:
        if steps is not None:
            size = steps - done
        else:
            size = max(batches - done, run.num_workers) if batches > 0 else run.max_pending
        done = _evaluation_round(run, iterator, size, done, callbacks, exhausted)
    run.coordinator.join()
    logs = metrics_logs(model)
    callbacks.on_test_end(logs)
    return logs

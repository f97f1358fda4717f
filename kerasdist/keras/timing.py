"""The one timing rule every kerasdist throughput figure uses, with no Keras import.

Kept free of Keras so that the tf_keras baseline (a ``TF_USE_LEGACY_KERAS=1`` process) and the raw
``tf.function`` baseline time their steps with exactly the code :class:`ThroughputMeter` uses.
"""

from __future__ import annotations

import time


class StepClock:
    """examples/s over timed steps, excluding compile/trace and validation.

    Within each epoch, the time between the end of step ``i-1`` and the end of step ``i`` is
    counted for ``i >= 1``: the first step of an epoch (tracing, iterator start) and everything
    between epochs (validation, checkpoints) are excluded. Call :meth:`train_begin` once, then
    :meth:`epoch_begin`, :meth:`step_end` after each step, :meth:`epoch_end` per epoch.

    Attributes:
        global_batch_size: examples per step (all replicas together).
        timed_steps: number of timed steps.
        timed_seconds: their total wall time, seconds.
        epoch_end_s: for each epoch, seconds from :meth:`train_begin` to the epoch's end (after
            its validation, when validation runs before :meth:`epoch_end`).
        epoch_examples_per_sec: examples/s over the timed steps of each epoch (warm-up shows as
            slower first epochs).
    """

    def __init__(self, global_batch_size: int):
        self.global_batch_size = global_batch_size
        self.timed_steps, self.timed_seconds = 0, 0.0
        self.epoch_end_s: list[float] = []
        self.epoch_examples_per_sec: list[float] = []
        self._start = self._last = None
        self._epoch_steps, self._epoch_seconds = 0, 0.0

    def train_begin(self) -> None:
        self._start = time.perf_counter()

    def epoch_begin(self) -> None:
        self._last, self._epoch_steps, self._epoch_seconds = None, 0, 0.0

    def step_end(self, steps: int = 1) -> None:
        """``steps`` optimizer steps ended now (more than 1 when one call runs several steps,
        e.g. ``steps_per_execution``); the first call of an epoch is not timed."""
        now = time.perf_counter()
        if self._last is not None:
            self.timed_steps += steps
            self.timed_seconds += now - self._last
            self._epoch_steps += steps
            self._epoch_seconds += now - self._last
        self._last = now

    def epoch_end(self) -> None:
        self.epoch_end_s.append(time.perf_counter() - self._start)
        self.epoch_examples_per_sec.append(
            self._epoch_steps * self.global_batch_size / self._epoch_seconds
            if self._epoch_seconds else 0.0)

    @property
    def examples_per_sec(self) -> float:
        """``timed_steps * global_batch_size / timed_seconds`` (0.0 if nothing was timed)."""
        if not self.timed_seconds:
            return 0.0
        return self.timed_steps * self.global_batch_size / self.timed_seconds

    def summary(self) -> dict:
        """JSON-ready figures (``metrics.json``'s ``throughput``)."""
        return {"examples_per_sec": self.examples_per_sec, "timed_steps": self.timed_steps,
                "timed_seconds": self.timed_seconds, "global_batch_size": self.global_batch_size,
                "epoch_end_s": list(self.epoch_end_s),
                "epoch_examples_per_sec": list(self.epoch_examples_per_sec)}

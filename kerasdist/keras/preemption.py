"""Preemption: SIGTERM or SIGINT stops training at a step every worker agrees on.

:class:`PreemptionWatch` turns the signal into a flag; every ``PREEMPTION_CHECK_STEPS`` steps all
workers all-reduce their flags (one scalar collective), so they all stop at the *same* step and
save one checkpoint there (a worker that stopped alone would leave the others blocked in the next
all-reduce). Used by :class:`kerasdist.keras.backup.StepBackup` and the parameter-server loop.
"""

from __future__ import annotations

import signal

from kerasdist._log import get_logger

log = get_logger("backup")

PREEMPTION_CHECK_STEPS = 10
"""Steps between two preemption votes (one scalar all-reduce each)."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that stop training with an agreed checkpoint: SIGTERM (preemption) and SIGINT (Ctrl-C,
also when sent to the whole process group)."""

SLURM_SIGNAL = signal.SIGUSR1
"""The default of ``cluster.preemption_signal``: under ``cluster.kind: slurm`` the signal users ask
Slurm to send before the time limit (``sbatch --signal=USR1@300``; ``kerasdist export slurm``
writes the recipe's) stops training too."""


def signal_of(name: str) -> signal.Signals:
    """The signal named ``name`` (``cluster.preemption_signal``: ``'USR1'``, ``'TERM'``, ...)."""
    return signal.Signals[f"SIG{name}"]


def preemption_signals(recipe) -> tuple[int, ...]:
    """The signals that stop ``recipe``'s training with an agreed checkpoint: :data:`SIGNALS`,
    and ``cluster.preemption_signal`` (default :data:`SLURM_SIGNAL`) on a cluster whose scheduler
    requeues (Slurm)."""
    if not recipe.cluster.traits.requeues:
        return SIGNALS
    extra = signal_of(recipe.cluster.preemption_signal)
    return SIGNALS + (() if extra in SIGNALS else (extra,))


class PreemptionWatch:
    """SIGTERM or SIGINT -> a flag that all workers agree on (context manager; restores the old
    handlers). A second SIGINT while the first is pending raises ``KeyboardInterrupt`` at once
    (the checkpoint of the last save stays the resume point).

    Args:
        strategy: the ``tf.distribute`` strategy whose workers vote; a strategy of one process
            (no ``cluster_resolver``) needs no vote: its flag is read directly.
        on_request: called (no arguments) in the signal handler when the first stop is asked
            (default None: nothing); it must be quick and run no TensorFlow op.
        signals: the signals watched (default :data:`SIGNALS`; :func:`preemption_signals`).

    Attributes:
        single_process: True when no vote is needed (the flag can be read at every step).
    """

    def __init__(self, strategy, *, on_request=None, signals=SIGNALS):
        self.strategy = strategy
        self.signals = tuple(signals)
        self.requested = False
        self._on_request = on_request
        self.single_process = getattr(strategy, "cluster_resolver", None) is None
        self._previous: dict[int, object] = {}
        self._vote_fn = None

    def __enter__(self) -> PreemptionWatch:
        for signum in self.signals:
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: the signal keeps its default action
                break
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt("a second SIGINT: stopped without saving")
        if not self.requested:
            log.warning(f"{name} received: saving a checkpoint at the next agreed step, then "
                        "exiting" + (" (Ctrl-C again to stop without saving)"
                                     if signum == signal.SIGINT else ""))
            if self._on_request is not None:
                self._on_request()
        self.requested = True

    def agreed(self) -> bool:
        """Collective (unless :attr:`single_process`): True on every worker when any worker has
        been asked to stop."""
        import tensorflow as tf

        if self.single_process:
            return self.requested
        if self._vote_fn is None:
            strategy = self.strategy

            @tf.function
            def vote(flag):
                votes = strategy.run(tf.identity, args=(flag,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None)

            self._vote_fn = vote
        return float(self._vote_fn(tf.constant(1.0 if self.requested else 0.0))) > 0

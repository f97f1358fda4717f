"""One point of the coordinator-scaling benchmark: a small dense net trained by a parameter-server
coordinator on an in-process cluster of N workers and 1 ps, all in this process.

The model (``FEATURES -> HIDDEN relu -> CLASSES``, SGD) and its input (one constant batch,
repeated) cost almost nothing per step, so the steps/s measured is what the coordinator and the
per-step RPCs sustain, timed over whole epochs 2..n without validation (the only basis
tf_keras's parameter-server ``fit`` allows: no batch-level callbacks).

* ``kerasdist``: :func:`kerasdist.keras.ps_fit.fit` with Keras 3, ``steps_per_execution`` =
  kerasdist's default for ``strategy.kind: parameter_server``.
* ``tf_keras``: tf_keras 2.x's own ``model.fit`` (the process must be started with
  ``TF_USE_LEGACY_KERAS=1``) with its default ``steps_per_execution`` (1).

Run: ``python -m kerasdist.bench.scaling_job {kerasdist,tf_keras} WORKERS STEPS EPOCHS OUT.json
[STEPS_PER_EXECUTION]`` (:mod:`kerasdist.bench.scaling` runs it in a private network namespace;
the last argument overrides the library's default, for side-by-side measurements).
"""

from __future__ import annotations

import sys
import time

FEATURES, HIDDEN, CLASSES, BATCH = 32, 64, 10, 32
IMPLEMENTATIONS = ("kerasdist", "tf_keras")


def _dataset_fn(input_context=None):
    import tensorflow as tf

    x = tf.random.stateless_normal([BATCH, FEATURES], seed=[1, 2])
    y = tf.argmax(tf.matmul(x, tf.ones([FEATURES, CLASSES])), axis=1)
    return tf.data.Dataset.from_tensors((x, y)).repeat()


def _model(k, steps_per_execution: int):
    model = k.Sequential([k.Input(shape=(FEATURES,)), k.layers.Dense(HIDDEN, activation="relu"),
                          k.layers.Dense(CLASSES)])
    model.compile(optimizer=k.optimizers.SGD(0.01),
                  loss=k.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


def epoch_timer(base):
    """A callback (a subclass of ``base``: Keras 3's or tf_keras's ``Callback``) recording each
    epoch's duration (``seconds``) and its end since the start of training (``ends``), in s."""

    class EpochTimer(base):
        def __init__(self):
            super().__init__()
            self.seconds: list[float] = []
            self.ends: list[float] = []
            self._start = self._begin = 0.0

        def on_train_begin(self, logs=None):
            self._start = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            self._begin = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            now = time.perf_counter()
            self.seconds.append(now - self._begin)
            self.ends.append(now - self._start)

    return EpochTimer()


def run(impl: str, workers: int, steps: int, epochs: int,
        steps_per_execution: int | None = None) -> dict:
    """Train ``epochs`` x ``steps`` steps with ``impl``; return the figures (see module docs).

    ``steps_per_execution``: steps per scheduled call; None = the library's default.

    Returns:
        ``{"impl", "workers", "steps_per_epoch", "epochs", "steps_per_execution",
        "epoch_seconds", "steps_per_sec" (epochs 2..n), "global_step"}``.
    """
    import tensorflow as tf

    from kerasdist.cluster.inprocess import start_inprocess_cluster

    cluster = start_inprocess_cluster(num_workers=workers, num_ps=1)
    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver)
    if impl == "kerasdist":
        import keras

        from kerasdist.config.strategy_configs import ParameterServerStrategyConfig
        from kerasdist.keras import ps_fit

        spe = steps_per_execution or ParameterServerStrategyConfig().steps_per_execution
        with strategy.scope():
            model = _model(keras, spe)
        timer = epoch_timer(keras.callbacks.Callback)
        ps_fit.fit(model, _dataset_fn, epochs=epochs, steps_per_epoch=steps, verbose=0,
                   callbacks=[timer])
    else:
        spe = steps_per_execution or 1
        with strategy.scope():
            model = _model(tf.keras, spe)
        timer = epoch_timer(tf.keras.callbacks.Callback)
        model.fit(tf.keras.utils.experimental.DatasetCreator(_dataset_fn), epochs=epochs,
                  steps_per_epoch=steps, verbose=0, callbacks=[timer])
    timed = timer.seconds[1:]
    return {"impl": impl, "workers": workers, "steps_per_epoch": steps, "epochs": epochs,
            "steps_per_execution": spe, "epoch_seconds": timer.seconds,
            "steps_per_sec": steps * len(timed) / sum(timed) if timed and sum(timed) > 0 else None,
            "global_step": int(model.optimizer.iterations.numpy())}


def main(argv=None) -> int:
    impl, workers, steps, epochs, out_path, *spe = sys.argv[1:] if argv is None else argv
    from kerasdist.bench.runner import write_result

    return write_result(run(impl, int(workers), int(steps), int(epochs), int(spe[0]) if spe else None),
                        out_path)


if __name__ == "__main__":
    sys.exit(main())

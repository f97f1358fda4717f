"""Bench: step time while checkpoints are written, ``trainer.checkpoint.async`` false vs true.

One process (default strategy) trains an MLP of ``--width`` units (3 Dense layers; Adam, so the
checkpoint holds the weights and two slots each) with kerasdist's own checkpoint path:
:class:`kerasdist.keras.backup.BackupStore` + :class:`~kerasdist.keras.backup.StepBackup`, a save
every ``--every`` steps into a fresh folder, ``--steps`` steps of ``--batch`` examples. Each step's
wall time is measured from ``on_train_batch_begin`` to the end of ``on_train_batch_end`` (so a
save's blocking part falls in the step that calls it). Reported per run: checkpoint size, median
step time of the steps without a save, mean and max of the steps that called a save, mean of the
``--after`` steps after each save (the background write runs then), what every save does first
in both modes (the non-finite check and the state digest, median of 3), the whole fit's seconds
and the wait for the last write in ``BackupStore.close``. Modes run round-robin, ``--repeats``
times.

Run: ``python tools/checkpoint_bench.py [--repeats 2] [--steps 200] [--every 20] [--width 2048]``.
The machine's load changes the figures: compare the modes of one run only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def _model(width: int, features: int):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, "relu"),
                              keras.layers.Dense(width, "relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-4), "mse")
    return model


def _one(asynchronous: bool, args) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from kerasdist.keras import state_digest
    from kerasdist.keras.backup import BackupStore, StepBackup, check_finite_state
    from kerasdist.keras.preemption import PreemptionWatch

    features = 512
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch * 16, features)).astype(np.float32)
    y = rng.standard_normal((args.batch * 16, 10)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).repeat()
    model = _model(args.width, features)
    model.optimizer.build(model.trainable_variables)
    times: list[float] = []

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as folder:
        store = BackupStore(model=model, directory=Path(folder), is_chief=True, task_name="chief",
                            max_to_keep=2, steps_per_epoch=args.steps, asynchronous=asynchronous)
        timer = StepTimes()
        with PreemptionWatch(tf.distribute.get_strategy()) as watch:
            backup = StepBackup(store, start_step=0, every_steps=args.every, watch=watch,
                                check_every=10 ** 9)
            started = time.perf_counter()
            model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
                      callbacks=[_Begin(timer), backup, timer])
            fitted = time.perf_counter() - started
        closing = time.perf_counter()
        store.close()
        waited = time.perf_counter() - closing
        checks = []
        for _ in range(3):  # what every save does first, in both modes (BackupStore.save)
            begun = time.perf_counter()
            check_finite_state(model, "the state", keeps="-")
            state_digest.state_digest(model)
            checks.append(time.perf_counter() - begun)
        size = sum(p.stat().st_size for p in Path(folder).glob(f"ckpt-{args.steps}.*"))
    saves = set(range(args.every - 1, args.steps, args.every))
    after = {s + k for s in saves for k in range(1, args.after + 1)} - saves
    timed = list(enumerate(times))[2:]  # the first steps trace the function
    plain = [t for i, t in timed if i not in saves and i not in after]
    saving = [t for i, t in timed if i in saves]
    return {"mode": "async" if asynchronous else "sync", "checkpoint_mb": size / 2 ** 20,
            "step_ms_median": 1e3 * statistics.median(plain),
            "save_step_ms_mean": 1e3 * statistics.mean(saving),
            "save_step_ms_max": 1e3 * max(saving),
            "after_save_ms_mean": 1e3 * statistics.mean([t for i, t in timed if i in after]),
            "checks_ms": 1e3 * statistics.median(checks), "fit_s": fitted, "close_wait_s": waited}


def _Begin(timer):
    """A callback placed first: starts ``timer``'s step clock before every other callback."""
    import keras

    class Begin(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            timer.on_train_batch_begin(batch)

    return Begin()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--after", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args(argv)
    print(f"{'run':>3} {'mode':>5} {'ckpt MB':>8} {'step ms':>8} {'save step ms':>13} "
          f"{'max ms':>7} {'after ms':>9} {'checks ms':>10} {'fit s':>6} {'close s':>8}")
    for repeat in range(args.repeats):
        for asynchronous in (False, True):
            r = _one(asynchronous, args)
            print(f"{repeat + 1:>3} {r['mode']:>5} {r['checkpoint_mb']:8.1f} "
                  f"{r['step_ms_median']:8.1f} {r['save_step_ms_mean']:13.1f} "
                  f"{r['save_step_ms_max']:7.1f} {r['after_save_ms_mean']:9.1f} "
                  f"{r['checks_ms']:10.1f} "
                  f"{r['fit_s']:6.2f} {r['close_wait_s']:8.2f}", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Per-step Python cost of the callbacks a default-strategy recipe run passes to ``model.fit``,
against the ``keras_enable`` bench row's (a ``ThroughputMeter`` only).

Each set is driven as Keras drives it: ``CallbackList.on_train_batch_begin/end`` with a step's
tensor logs (``loss``, ``accuracy``), ``--steps`` times after ``on_train_begin``; prints process
CPU microseconds and wall microseconds per step for each set. No model is trained: this isolates
the callbacks from the step itself (whose time the machine's load dominates).

    python tools/callback_step_cost.py --steps 3000 --repeats 3
"""

from __future__ import annotations

import argparse
import tempfile
import time


def _per_step(callbacks, steps: int) -> tuple[float, float]:
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    logs = {"loss": tf.constant(0.5), "accuracy": tf.constant(0.9)}
    listed = keras.callbacks.CallbackList(callbacks, add_history=True, model=model)
    listed.set_params({"epochs": 1, "steps": steps, "verbose": 0})
    listed.on_train_begin()
    listed.on_epoch_begin(0)
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(steps):
        listed.on_train_batch_begin(step)
        listed.on_train_batch_end(step, logs)
    return ((time.process_time() - cpu) / steps * 1e6, (time.perf_counter() - wall) / steps * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import keras
    import tensorflow as tf

    from kerasdist.keras.backup import StepBackup
    from kerasdist.keras.callbacks import EpochTensorBoard, StopOnNonFiniteLoss, ThroughputMeter
    from kerasdist.keras.preemption import PreemptionWatch

    with PreemptionWatch(tf.distribute.get_strategy()) as watch:
        def recipe(board):
            backup = StepBackup(None, start_step=0, watch=watch, every_steps=0, check_every=1)
            return [StopOnNonFiniteLoss(), backup, ThroughputMeter(128),
                    *([board(log_dir=tempfile.mkdtemp())] if board else [])]

        sets = {"keras_enable row (ThroughputMeter)": lambda: [ThroughputMeter(128)],
                "recipe row, Keras TensorBoard": lambda: recipe(keras.callbacks.TensorBoard),
                "recipe row, EpochTensorBoard": lambda: recipe(EpochTensorBoard),
                "recipe row, no TensorBoard": lambda: recipe(None)}
        for rep in range(args.repeats):
            for name, make in sets.items():
                cpu, wall = _per_step(make(), args.steps)
                print(f"repeat {rep}  {name:38s} cpu {cpu:7.1f} us/step  wall {wall:7.1f} us/step",
                      flush=True)


if __name__ == "__main__":
    main()

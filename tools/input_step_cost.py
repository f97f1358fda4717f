#!/usr/bin/env python3
"""Input alone: seconds to draw ``N`` training batches (after 20 warm-up batches) from kerasdist's
resumable in-memory stream (the recipe rows' input, :func:`kerasdist.data.inputs.build_data`)
and from ``make_dataset_fn`` (the ``keras_enable`` bench rows' input), same recipe and global
batch, one pipeline, in this one process, alternated.

    python tools/input_step_cost.py [--batches 600] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time


def _seconds(ds, batches: int) -> float:
    it = iter(ds)
    for _ in range(20):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/mnist_cnn.yaml")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import tensorflow as tf

    from kerasdist.config import load_recipe
    from kerasdist.data import build_datasets
    from kerasdist.data.inputs import build_data

    recipe = load_recipe(args.recipe, [f"data.batch_size={args.batch_size}"])
    stream = build_data(recipe, replicas=1)
    plain = build_datasets(recipe.data, repeat_train=True)
    for rep in range(args.repeats):
        a = _seconds(stream.train_fn(tf.distribute.InputContext(), 0), args.batches)
        b = _seconds(plain.train_fn(None), args.batches)
        print(f"repeat {rep}: resumable stream {a:.3f} s, make_dataset_fn {b:.3f} s "
              f"({args.batches} batches of {args.batch_size})", flush=True)


if __name__ == "__main__":
    main()

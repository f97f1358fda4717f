#!/usr/bin/env python3
"""Benchmark (not a test): peak RSS of a recipe whose file-backed training set grows 10x.

Writes a TFRecord training split in the seed's MNIST layout (the embedded digits, repeated to
``--records`` records in one file, then that file copied to make the 10x split: same bytes, ten
times as many), and trains the same recipe on each for a fixed number of steps, each run in a fresh
process that prints its own peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``,
KiB on Linux). Two inputs per size:

* ``stream``: ``train_split: train`` (a whole split name): kerasdist's streaming path
  (:mod:`kerasdist.data.sources.files`: records read from the files, shuffled in a buffer of
  ``data.shuffle_buffer`` records, skipped on raw records);
* ``memory``: the same digits in a Keras ``mnist.npz`` (``source: npz``), read whole into NumPy:
  the path every source took before streaming sources existed (until 2026-11-26 this row was
  ``train_split: 'train[:100%]'`` of the TFRecord files, which now streams too).

Usage::

    nice -n 10 python tools/stream_rss_bench.py [--records 60000] [--steps 100] [--out DIR]

Prints one table row per (input, size): records, file MiB, peak RSS MiB, wall seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent("""
    import json, resource, sys
    from kerasdist import fit
    from kerasdist.config import validate_recipe
    recipe = validate_recipe(json.loads(sys.argv[1]))
    result = fit(recipe, verbose=0)
    print("RESULT", json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                "steps": result.extra["global_steps"]}))
""")


def write_split(folder: Path, records: int, copies: int) -> int:
    """``copies`` TFRecord files of ``records`` digits each; returns the bytes written."""
    import numpy as np

    from kerasdist.data.readers import embedded_dir, load_idx_split, write_tfrecord

    folder.mkdir(parents=True, exist_ok=True)
    x, y = load_idx_split(embedded_dir(), "test")
    reps = -(-records // len(x))
    first = write_tfrecord(np.tile(x, (reps, 1, 1))[:records], np.tile(y, reps)[:records],
                           folder / "train-000.tfrecord")
    for k in range(1, copies):
        shutil.copyfile(first, folder / f"train-{k:03d}.tfrecord")
    return sum(p.stat().st_size for p in folder.glob("train-*.tfrecord"))


def write_npz(folder: Path, records: int, copies: int) -> Path:
    """The digits of :func:`write_split` (``records * copies``) as a Keras ``mnist.npz``."""
    import numpy as np

    from kerasdist.data.readers import embedded_dir, load_idx_split

    x, y = load_idx_split(embedded_dir(), "test")
    reps = -(-records // len(x))
    x, y = np.tile(x, (reps, 1, 1))[:records], np.tile(y, reps)[:records]
    path = folder / "mnist.npz"
    np.savez(path, x_train=np.tile(x, (copies, 1, 1)), y_train=np.tile(y, copies))
    return path


def run(folder: Path, kind: str, steps: int, run_dir: Path) -> dict:
    data = ({"source": {"kind": "tfrecord", "path": str(folder)}} if kind == "stream" else
            {"source": {"kind": "npz", "path": str(folder / "mnist.npz")}})
    recipe = {"model": {"name": "kerasdist.models.examples:small_image_cnn",
                        "params": {"image_size": [28, 28], "channels": 1, "num_classes": 10},
                        "loss": "sparse_categorical_crossentropy_from_logits"},
              "data": {**data, "train_split": "train", "eval_split": None, "batch_size": 128},
              "trainer": {"epochs": 1, "steps_per_epoch": steps, "verbose": 0},
              "output": {"run_dir": str(run_dir), "tensorboard": False, "save_model": False}}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(recipe)], capture_output=True,
                          text=True, check=False)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not line:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(line[0][7:]), "wall_s": time.perf_counter() - start}


def input_speed(folder: Path, batches: int = 300) -> dict:
    """Seconds to iterate ``batches`` training batches of 128 from the embedded digits written as
    one TFRecord file (streaming) and from the same digits in memory, in this process, no model."""
    import tensorflow as tf

    from kerasdist.config import validate_recipe
    from kerasdist.data import stream
    from kerasdist.data.inputs import build_streaming
    from kerasdist.data.readers import embedded_dir, load_idx_split, write_tfrecord
    from kerasdist.data.sources.memory import memory_units

    x, y = load_idx_split(embedded_dir(), "test")
    write_tfrecord(x, y, folder / "train-000.tfrecord")
    recipe = validate_recipe({"data": {"source": {"kind": "tfrecord", "path": str(folder)},
                                       "train_split": "train", "eval_split": None,
                                       "batch_size": 128}})
    ctx = tf.distribute.InputContext()
    out = {}
    for name, ds in (("stream", build_streaming(recipe, pipelines=1).train_fn(ctx, 0)),
                     ("memory", stream.train_fn(memory_units(x, y, "off"), recipe.data)(ctx, 0))):
        start = time.perf_counter()
        for _ in ds.take(batches):
            pass
        out[name] = time.perf_counter() - start
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000, help="records of the 1x split")
    parser.add_argument("--steps", type=int, default=100, help="training steps of every run")
    parser.add_argument("--out", type=Path, default=None, help="keep the files here")
    parser.add_argument("--speed-only", action="store_true",
                        help="only time 300 input batches, streamed and in memory (no model)")
    args = parser.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="kerasdist-rss-"))
    if args.speed_only:
        try:
            times = input_speed(root / "speed")
        finally:
            if args.out is None:
                shutil.rmtree(root, ignore_errors=True)
        print(" ".join(f"{k} {v:.2f} s" for k, v in times.items()) + " for 300 batches of 128")
        return 0
    rows = []
    try:
        for size in (1, 10):
            folder = root / f"x{size}"
            nbytes = write_split(folder, args.records, size)
            write_npz(folder, args.records, size)
            for kind in ("stream", "memory"):
                got = run(folder, kind, args.steps, root / f"run-{kind}-{size}")
                rows.append({"input": kind, "size": f"{size}x", "records": args.records * size,
                             "file_mib": nbytes / 2**20, "peak_rss_mib": got["peak_rss_kib"] / 1024,
                             "steps": got["steps"], "wall_s": got["wall_s"]})
                print(f"{kind:6s} {size:>2d}x  {args.records * size:>8d} records  "
                      f"{nbytes / 2**20:8.1f} MiB files  peak RSS {got['peak_rss_kib'] / 1024:8.1f} MiB"
                      f"  {got['steps']} steps  {got['wall_s']:.1f} s", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

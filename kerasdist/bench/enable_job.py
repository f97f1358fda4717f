"""The ``keras_enable`` bench rows: a user's own Keras 3 ``model.fit`` under a strategy with only
``kerasdist.enable()`` and none of the recipe lifecycle, so the strategy row divided by its
``keras_enable_<kind>`` row is kerasdist's own lifecycle cost (:mod:`kerasdist.bench.targets`).
Each uses the recipe's model, optimizer, data, global batch and strategy settings, the strategy's
own compile settings, and :class:`~kerasdist.keras.callbacks.ThroughputMeter` as every row.

Run: ``python -m kerasdist.bench.enable_job KIND RECIPE OUT.json`` with ``KIND`` one of
``default``, ``mirrored`` (one process) or ``multi_worker``, ``parameter_server`` (a task of a
cluster started by :mod:`kerasdist.bench.baseline_cluster`, ``TF_CONFIG`` set). Only the chief
(worker 0, or the coordinator) writes ``OUT.json``.
"""

from __future__ import annotations

import os
import sys
import time

KINDS = ("default", "mirrored", "multi_worker", "parameter_server")


def _strategy(kind: str, recipe):
    """The ``tf.distribute`` strategy for ``kind`` built from the recipe's strategy settings
    (``None`` for ``default``: no strategy at all), and whether this task is the chief."""
    if kind == "default":
        return None, True
    from kerasdist.cluster.spec import parse_tf_config
    from kerasdist.strategies import get

    tf_config = parse_tf_config(os.environ.get("TF_CONFIG")) if kind in KINDS[2:] else None
    resolver = tf_config.cluster_resolver() if tf_config else None
    strategy = get(kind).build(recipe.strategy, cluster_resolver=resolver)
    return strategy, tf_config is None or tf_config.is_chief


def run(kind: str, recipe) -> dict | None:
    import contextlib

    import keras

    import kerasdist
    from kerasdist.data import build_datasets
    from kerasdist.keras.callbacks import ThroughputMeter
    from kerasdist.strategies import get
    from kerasdist.training.model import build_compiled_model

    kerasdist.enable()
    keras.utils.set_random_seed(recipe.trainer.seed)
    strategy, chief = _strategy(kind, recipe)
    coordinated = get(kind).traits.topology == "coordinator"  # parameter server
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    if coordinated:
        replicas = 1  # asynchronous: each step is one worker's whole batch
    data = build_datasets(recipe.data, repeat_train=True)
    steps = recipe.trainer.steps_per_epoch or data.steps_per_epoch
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = build_compiled_model(recipe, replicas, **get(kind).compile_kwargs(recipe.strategy))
    if coordinated:
        train, held_out = data.train_fn, data.eval_fn
    elif strategy is not None:
        train = strategy.distribute_datasets_from_function(data.train_fn)
        held_out = strategy.distribute_datasets_from_function(data.eval_fn)
    else:
        train, held_out = data.train_fn(None), data.eval_fn(None)
    meter = ThroughputMeter(recipe.data.batch_size)
    start = time.perf_counter()
    hist = model.fit(train, epochs=recipe.trainer.epochs, steps_per_epoch=steps,
                     validation_data=held_out,
                     validation_steps=None if not coordinated else
                     max(1, data.num_eval // recipe.data.batch_size),
                     callbacks=[meter], verbose=0)
    if not chief:
        return None
    val = [float(v) for v in hist.history.get("val_accuracy", [])]
    return {"throughput": meter.summary(), "wall_time_s": time.perf_counter() - start,
            "val_accuracy": val, "final_accuracy": val[-1] if val else None}


def main(argv=None) -> int:
    kind, recipe_path, out_path = sys.argv[1:] if argv is None else argv
    if kind not in KINDS:
        raise SystemExit(f"enable_job: unknown kind {kind!r}; one of {', '.join(KINDS)}")
    from kerasdist.bench.runner import write_result
    from kerasdist.config import load_recipe

    return write_result(run(kind, load_recipe(recipe_path)), out_path)


if __name__ == "__main__":
    sys.exit(main())

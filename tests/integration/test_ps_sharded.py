"""Variables split over ps tasks by a partitioner train, evaluate, predict, save and checkpoint.

Keras 3 failed at the first step on any sharded variable (``'ShardedVariable' object has no
attribute 'handle'``); the mend is :mod:`kerasdist._compat.keras_sharded_variables`. The cluster is
the session's in-process one (2 workers, 2 ps); each test builds its own
``ParameterServerStrategy`` on it with a partitioner, as a user's own code would.
Tolerances: one SGD step ``rtol=1e-6, atol=1e-7`` (the same float32 ops, gradients concatenated);
evaluation ``rtol=1e-5, atol=1e-6`` (sums accumulated in another order across workers).
"""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist.data import make_dataset_fn

pytest_plugins = ["kerasdist.testing"]
# ps_strategy: TF's first PS strategy sets 2 environment variables; let it do so at session setup
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ps_strategy", "kerasdist_enabled")]

REPO = Path(__file__).resolve().parents[2]
VOCAB, DIM, LENGTH, BATCH = 60, 8, 4, 32
RNG = np.random.default_rng(11)
IDS = RNG.integers(0, VOCAB, (320, LENGTH)).astype(np.int64)
LABELS = (IDS[:, 0] % 2).astype(np.int64)  # the parity of the first token: learnable
FEATURES = RNG.standard_normal((320, 6)).astype(np.float32)
TARGETS = (FEATURES[:, :1] * 2.0 + 1.0).astype(np.float32)
partitioners = tf.distribute.experimental.partitioners


def _strategy(cluster, partitioner):
    return tf.distribute.ParameterServerStrategy(cluster.cluster_resolver,
                                                 variable_partitioner=partitioner)


def _embedding_model(learning_rate=0.05):
    model = keras.Sequential([keras.Input((LENGTH,), dtype="int64"),
                              keras.layers.Embedding(VOCAB, DIM), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _dense_model():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, "tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    return model


def _ps_tasks(variable):
    """The ps task index of each shard of a Keras variable (one entry when not sharded)."""
    value = variable.value if hasattr(variable, "value") else variable
    shards = getattr(value, "variables", [value])
    return [tf.DeviceSpec.from_string(shard.device).task for shard in shards]


def _assert_same_weights(a, b, **tol):
    for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(x, y, **tol)


@pytest.mark.timeout(240)
def test_sharded_dense_step_equals_a_strategy_free_step(inprocess_ps_cluster):
    strategy = _strategy(inprocess_ps_cluster, partitioners.FixedShardsPartitioner(2))
    with strategy.scope():
        model = _dense_model()
    reference = _dense_model()
    reference.set_weights(model.get_weights())
    kernel = model.layers[0].kernel
    assert _ps_tasks(kernel) == [0, 1]  # 6 rows: 3 on ps 0, 3 on ps 1

    # One batch repeated: whichever worker runs the one step sees the same examples.
    x, y = FEATURES[:BATCH], TARGETS[:BATCH]
    one_batch = lambda ctx: tf.data.Dataset.from_tensors((x, y)).repeat()  # noqa: E731
    model.fit(one_batch, epochs=1, steps_per_epoch=1, verbose=0)
    reference.train_on_batch(x, y)
    _assert_same_weights(model, reference, rtol=1e-6, atol=1e-7)
    momenta = [v for v in model.optimizer.variables if "momentum" in v.path]
    assert momenta and all(_ps_tasks(v) == [0, 1] for v in momenta if v.shape[0] >= 2)
    reference_momenta = [v for v in reference.optimizer.variables if "momentum" in v.path]
    for ours, theirs in zip(momenta, reference_momenta, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-7)

    history = model.fit(make_dataset_fn(FEATURES, TARGETS, global_batch_size=BATCH,
                                        training=True, repeat=True),
                        epochs=6, steps_per_epoch=20, verbose=0)
    # 3 epochs left too little margin under asynchronous steps: 1.141 -> 0.614 failed (TF 2.20,
    # .ci/other-versions, 2026-11-27)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]


@pytest.mark.timeout(240)
def test_sharded_embedding_trains_and_evaluates_like_unsharded(inprocess_ps_cluster):
    strategy = _strategy(inprocess_ps_cluster,
                         partitioners.MinSizePartitioner(min_shard_bytes=256, max_shards=2))
    with strategy.scope():
        model = _embedding_model()
    table = model.layers[0].embeddings
    assert _ps_tasks(table) == [0, 1]  # 60 x 8 float32 = 1920 bytes: 2 shards of 960
    history = model.fit(make_dataset_fn(IDS, LABELS, global_batch_size=BATCH, training=True,
                                        repeat=True), epochs=4, steps_per_epoch=20, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    for slot in (v for v in model.optimizer.variables if "embeddings" in v.path):
        assert _ps_tasks(slot) == [0, 1]

    reference = _embedding_model()
    reference.set_weights(model.get_weights())
    ours = model.evaluate(make_dataset_fn(IDS, LABELS, global_batch_size=BATCH, training=False),
                          return_dict=True, verbose=0)
    theirs = reference.evaluate(IDS, LABELS, batch_size=BATCH, return_dict=True, verbose=0)
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-6)
    assert theirs["accuracy"] > 0.9
    np.testing.assert_allclose(model.predict(IDS[:50], verbose=0),
                               reference.predict(IDS[:50], verbose=0), rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(240)
def test_sharded_checkpoint_restores_on_other_shard_counts_and_saves_keras_files(
        inprocess_ps_cluster, tmp_path):
    two = _strategy(inprocess_ps_cluster, partitioners.FixedShardsPartitioner(2))
    with two.scope():
        model = _embedding_model()
    model.fit(make_dataset_fn(IDS, LABELS, global_batch_size=BATCH, training=True, repeat=True),
              epochs=1, steps_per_epoch=10, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(tmp_path / "two")

    def restored(strategy):
        if strategy is None:
            target = _embedding_model()
        else:
            with strategy.scope():
                target = _embedding_model()
        target.optimizer.build(target.trainable_variables)
        status = tf.train.Checkpoint(model=target, optimizer=target.optimizer).restore(path)
        status.assert_existing_objects_matched()
        return target

    three = _strategy(inprocess_ps_cluster, partitioners.FixedShardsPartitioner(3))
    for target in (restored(None), restored(three)):
        _assert_same_weights(model, target, rtol=0, atol=0)
        assert int(target.optimizer.iterations) == int(model.optimizer.iterations) == 10
        ours = [np.asarray(v) for v in model.optimizer.variables]
        theirs = [np.asarray(v) for v in target.optimizer.variables]
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a, b)
    assert _ps_tasks(restored(three).layers[0].embeddings) == [0, 1, 0]

    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    _assert_same_weights(model, loaded, rtol=0, atol=0)


@pytest.mark.timeout(300)
def test_embedding_recipe_splits_its_tables_over_the_ps_and_learns(inprocess_ps_cluster, tmp_path):
    """``recipes/embedding_ps.yaml`` scaled down (8,192 items): every table and its Adam slots
    are split over the 2 ps, metrics.json records each ps's shards, and the model beats chance on
    held-out synthetic clicks (best possible about 0.8; chance 0.5)."""
    import json

    import yaml

    from kerasdist.config import validate_recipe
    from kerasdist.data import load_split
    from kerasdist.training import run_session

    recipe = yaml.safe_load((REPO / "recipes" / "embedding_ps.yaml").read_text())
    recipe["model"]["params"].update(num_items=8192, dim=8)
    recipe["data"].update(shuffle_buffer=40_000)
    recipe["data"]["source"].update(num_items=8192, num_examples=40_000)
    recipe["strategy"]["variable_partitioning"] = "fixed"
    recipe["trainer"].update(epochs=2, steps_per_epoch=60, verbose=0)
    recipe["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    config = validate_recipe(recipe)
    run_session(config, tf_config=inprocess_ps_cluster.tf_config)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    placement = metrics["parameter_server"]["ps_placement"]
    for entry in placement:
        # the optimizer's name is "adam" in a fresh process, "adam_<n>" after other tests of
        # this module built optimizers in the same process
        shards = {(re.sub(r"^adam_\d+/", "adam/", s["path"]), s["shape"][0])
                  for s in entry["shards"]}
        assert ("item_embedding/embeddings", 4096) in shards
        assert ("adam/item_embedding_embeddings_velocity", 4096) in shards
    assert abs(placement[0]["bytes"] - placement[1]["bytes"]) < 0.2 * placement[0]["bytes"]
    assert metrics["evaluation"]["accuracy"] > 0.6
    x, y = load_split(config.data, "train")
    assert x.dtype == np.int64 and x.shape == (40_000, 2) and set(np.unique(y)) == {0.0, 1.0}
    assert x[:, 1].max() < 8192 and x[:, 0].max() < config.data.source.num_users

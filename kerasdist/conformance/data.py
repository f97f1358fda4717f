"""The conformance cases' data: small, deterministic NumPy sets and the three input kinds.

Every set has :data:`NUM_EXAMPLES` examples, trained in global batches of :data:`GLOBAL_BATCH`
(so one epoch is :data:`STEPS_PER_EPOCH` optimizer steps) and never shuffled, so that a strategy
run and the strategy-free reference see the same global batches in the same order.

Input kinds (``Case.input``):

* ``numpy``: ``model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=False)``;
* ``dataset``: ``tf.data.Dataset.from_tensor_slices(...).batch(GLOBAL_BATCH)``;
* ``dataset_fn``: a function of a ``tf.distribute.InputContext``: pipeline ``i`` of ``P`` keeps rows
  ``[i*B/P, (i+1)*B/P)`` of every global batch and batches them per replica, so the replicas of a
  synchronous strategy together consume exactly the global batches of the other kinds. The
  synchronous strategies pass it through ``strategy.distribute_datasets_from_function``; parameter
  server takes the function itself (kerasdist's convention).
"""

from __future__ import annotations

import numpy as np

NUM_EXAMPLES = 64
GLOBAL_BATCH = 16
STEPS_PER_EPOCH = NUM_EXAMPLES // GLOBAL_BATCH
EPOCHS = 2
FEATURES = 8
CLASSES = 3
VOCAB = 20
SEQ_LEN = 6
WORDS = ("red", "green", "blue", "cat", "dog", "fish", "big", "small", "fast", "slow")


def _rng(seed: int):
    return np.random.default_rng(seed)


def make(kind: str, seed: int = 0, examples: int = NUM_EXAMPLES) -> dict:
    """``{"x": ..., "y": ..., "sample_weight": ...}`` for a data kind (NumPy; float32/int64).

    Kinds: ``dense`` (x float32 ``[N, 8]``, y int64 class in ``[0, 3)``), ``binary`` (y float32
    0/1 ``[N, 1]``), ``regression`` (y float32 ``[N, 1]``), ``tokens`` (x int64 ``[N, 6]`` in
    ``[1, 20)``), ``strings`` (x string ``[N, 1]`` of three words), ``words`` (x string
    ``[N, 1]``, one word), ``ints`` (x int64 ``[N, 1]`` category ids),
    ``multi`` (x ``{"a": [N, 8], "b": [N, 4]}``, y ``{"cls": class, "reg": [N, 1]}``).
    ``sample_weight`` is float32 ``[N]`` in ``[0.5, 1.5)``.
    """
    rng = _rng(seed)
    n = examples
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    w_true = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    cls = np.argmax(x @ w_true, axis=1).astype(np.int64)
    weight = rng.uniform(0.5, 1.5, size=n).astype(np.float32)
    if kind == "dense":
        return {"x": x, "y": cls, "sample_weight": weight}
    if kind == "binary":
        return {"x": x, "y": (cls == 0).astype(np.float32)[:, None], "sample_weight": weight}
    if kind == "regression":
        y = (x @ rng.normal(size=(FEATURES, 1)) + 0.5).astype(np.float32)
        return {"x": x, "y": y, "sample_weight": weight}
    if kind == "tokens":
        tokens = rng.integers(1, VOCAB, size=(n, SEQ_LEN)).astype(np.int64)
        return {"x": tokens, "y": (tokens[:, 0] % CLASSES).astype(np.int64), "sample_weight": weight}
    if kind == "strings":
        picks = rng.integers(0, len(WORDS), size=(n, 3))
        text = np.array([[" ".join(WORDS[i] for i in row)] for row in picks])
        return {"x": text, "y": (picks[:, 0] % CLASSES).astype(np.int64), "sample_weight": weight}
    if kind == "words":
        picks = rng.integers(0, len(WORDS), size=(n, 1))
        return {"x": np.array(WORDS)[picks], "y": (picks[:, 0] % CLASSES).astype(np.int64),
                "sample_weight": weight}
    if kind == "ints":
        ids = rng.integers(100, 110, size=(n, 1)).astype(np.int64)
        return {"x": ids, "y": (ids[:, 0] % CLASSES).astype(np.int64), "sample_weight": weight}
    if kind == "multi":
        b = rng.normal(size=(n, 4)).astype(np.float32)
        reg = (b.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        return {"x": {"a": x, "b": b}, "y": {"cls": cls, "reg": reg}, "sample_weight": weight}
    raise ValueError(f"unknown conformance data kind. Received: kind={kind!r}")


def _arrays(data: dict, *, weighted: bool) -> tuple:
    parts = (data["x"], data["y"])
    return parts + ((data["sample_weight"],) if weighted else ())


def dataset(data: dict, *, weighted: bool = False, batch: int = GLOBAL_BATCH,
            shuffle_seed: int | None = None, drop_remainder: bool = False):
    """The global-batched ``tf.data.Dataset`` of ``(x, y[, sample_weight])``; shuffled with
    ``shuffle_seed`` over the whole set when given (reshuffled each iteration)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(_arrays(data, weighted=weighted))
    if shuffle_seed is not None:
        ds = ds.shuffle(len(data["sample_weight"]), seed=shuffle_seed)
    return ds.batch(batch, drop_remainder=drop_remainder)


def dataset_fn(data: dict, *, weighted: bool = False, repeat: bool = False):
    """A ``fn(input_context) -> tf.data.Dataset`` giving the same global batches (module docs).

    Under parameter server each worker runs the function with ``num_input_pipelines`` = workers;
    it then keeps its slice of every global batch, so the workers together read every example.
    """
    import tensorflow as tf

    arrays = _arrays(data, weighted=weighted)

    def fn(input_context=None):
        pipelines = getattr(input_context, "num_input_pipelines", 1) or 1
        index = getattr(input_context, "input_pipeline_id", 0)
        replicas = getattr(input_context, "num_replicas_in_sync", 1) or 1
        share = GLOBAL_BATCH // pipelines
        per_replica = GLOBAL_BATCH // replicas if replicas >= pipelines else share
        ds = tf.data.Dataset.from_tensor_slices(arrays).batch(GLOBAL_BATCH)
        start = tf.cast(index, tf.int64) * share
        ds = ds.map(lambda *parts: tf.nest.map_structure(lambda t: t[start:start + share], parts))
        ds = ds.unbatch().batch(per_replica)
        return ds.repeat() if repeat else ds

    return fn


"""The conformance cases' data: deterministic NumPy sets fed the way users feed them.

Every set has :data:`NUM_EXAMPLES` examples by default; cases train :data:`EPOCHS` epochs of
:data:`STEPS_PER_EPOCH` steps on global batches of :data:`GLOBAL_BATCH`, then ``evaluate`` in
batches of :data:`EVAL_BATCH` and ``predict`` (:data:`kerasdist.conformance.report.ORACLE`).
Every run -- the strategy-free reference and each strategy -- sees the same global batches in
the same order: the seeded shuffle gives the same permutation in one process and under a
strategy (:mod:`kerasdist._compat.keras_20585_symbolic_build`).

Input kinds (``Case.input``):

* ``numpy``: ``model.fit(x, y, batch_size=GLOBAL_BATCH, validation_split=0.25, shuffle=False)``,
  one full pass over the first 75 % an epoch;
* ``dataset``: ``tf.data.Dataset.from_tensor_slices(...).shuffle(N, seed).batch(GLOBAL_BATCH)``;
* ``dataset_fn``: a function of a ``tf.distribute.InputContext``: every pipeline shuffles the
  whole set with the same seed and batches it globally (``drop_remainder=True``); pipeline ``i``
  of ``P`` keeps rows ``[i*B/P, (i+1)*B/P)`` of every global batch and batches them per replica,
  so the replicas of a synchronous strategy together consume exactly the global batches of the
  ``dataset`` kind. The synchronous strategies pass it through
  ``strategy.distribute_datasets_from_function``; parameter server takes the function itself
  (kerasdist's convention).
"""

from __future__ import annotations

import numpy as np

NUM_EXAMPLES = 3000
GLOBAL_BATCH = 16
EVAL_BATCH = 256
STEPS_PER_EPOCH = 4
EPOCHS = 2
SHUFFLE_SEED = 1
FEATURES = 8
CLASSES = 3
VOCAB = 20
WIDE_VOCAB = 200  # ``wide_tokens``: most rows of an Embedding(200, 8) are untouched by a batch
SEQ_LEN = 6
WORDS = ("red", "green", "blue", "cat", "dog", "fish", "big", "small", "fast", "slow")


def _rng(seed: int):
    return np.random.default_rng(seed)


def make(kind: str, seed: int = 0, examples: int = NUM_EXAMPLES) -> dict:
    """``{"x": ..., "y": ..., "sample_weight": ...}`` for a data kind (NumPy; float32/int64).

    Kinds: ``dense`` (x float32 ``[N, 8]``, y int64 class in ``[0, 3)``), ``binary`` (y float32
    0/1 ``[N, 1]``), ``regression`` (y float32 ``[N, 1]``), ``tokens`` (x int64 ``[N, 6]`` in
    ``[1, 20)``), ``strings`` (x string ``[N, 1]`` of three words), ``words`` (x string
    ``[N, 1]``, one word), ``ints`` (x int64 ``[N, 1]`` category ids), ``padded`` (x int64
    ``[N, 6]`` token ids followed by zero padding), ``wide_tokens`` (x int64 ``[N, 6]`` in
    ``[1, 200)``), ``images`` (x float32 ``[N, 8, 8, 1]``),
    ``bert`` (x ``{"token_ids", "segment_ids", "padding_mask"}`` int32 ``[N, 6]``),
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
    extra = _sequence_and_image_kinds(kind, rng, n, weight)
    if extra is not None:
        return extra
    if kind == "multi":
        b = rng.normal(size=(n, 4)).astype(np.float32)
        reg = (b.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        return {"x": {"a": x, "b": b}, "y": {"cls": cls, "reg": reg}, "sample_weight": weight}
    raise ValueError(f"unknown conformance data kind. Received: kind={kind!r}")


def _sequence_and_image_kinds(kind: str, rng, n: int, weight) -> dict | None:
    """The ``padded``, ``images`` and ``bert`` kinds of :func:`make` (None for other kinds)."""
    if kind == "padded":  # token ids, then zeros (padding) from a random length on
        tokens = rng.integers(1, VOCAB, size=(n, SEQ_LEN)).astype(np.int64)
        lengths = rng.integers(1, SEQ_LEN + 1, size=(n, 1))
        tokens = np.where(np.arange(SEQ_LEN)[None, :] < lengths, tokens, 0)
        return {"x": tokens, "y": (tokens[:, 0] % CLASSES).astype(np.int64), "sample_weight": weight}
    if kind == "wide_tokens":  # sparse gradients: a batch touches a few of WIDE_VOCAB rows
        tokens = rng.integers(1, WIDE_VOCAB, size=(n, SEQ_LEN)).astype(np.int64)
        return {"x": tokens, "y": (tokens[:, 0] % CLASSES).astype(np.int64), "sample_weight": weight}
    if kind == "images":
        images = rng.normal(size=(n, 8, 8, 1)).astype(np.float32)
        label = np.argmax(images.reshape(n, 64)[:, :CLASSES], axis=1).astype(np.int64)
        return {"x": images, "y": label, "sample_weight": weight}
    if kind == "bert":
        tokens = rng.integers(1, VOCAB, size=(n, SEQ_LEN)).astype(np.int32)
        mask = np.ones((n, SEQ_LEN), dtype=np.int32)
        x = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "padding_mask": mask}
        return {"x": x, "y": (tokens[:, 0] % CLASSES).astype(np.int64), "sample_weight": weight}
    return None


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


def dataset_fn(data: dict, *, weighted: bool = False, repeat: bool = False,
               shuffle_seed: int | None = SHUFFLE_SEED):
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
        ds = tf.data.Dataset.from_tensor_slices(arrays)
        if shuffle_seed is not None:
            ds = ds.shuffle(len(arrays[-1]), seed=shuffle_seed)
        ds = ds.batch(GLOBAL_BATCH, drop_remainder=True)
        start = tf.cast(index, tf.int64) * share
        ds = ds.map(lambda *parts: tf.nest.map_structure(lambda t: t[start:start + share], parts))
        ds = ds.unbatch().batch(per_replica)
        return ds.repeat() if repeat else ds

    return fn


def py_dataset(data: dict, *, weighted: bool = False, seed: int = SHUFFLE_SEED):
    """A ``keras.utils.PyDataset`` of global batches of ``GLOBAL_BATCH`` (the last one partial),
    in a seeded permutation drawn anew at every epoch end (``on_epoch_end``)."""
    import keras

    arrays = _arrays(data, weighted=weighted)
    count = len(data["sample_weight"])

    class ShuffledBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(count)

        def __len__(self):
            return -(-count // GLOBAL_BATCH)

        def __getitem__(self, index):
            rows = self.order[index * GLOBAL_BATCH:(index + 1) * GLOBAL_BATCH]
            return tuple(keras.tree.map_structure(lambda a: a[rows], part) for part in arrays)

        def on_epoch_end(self):
            self.order = self.rng.permutation(count)

    return ShuffledBatches()

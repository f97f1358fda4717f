"""An example ``data.source.function`` for ``data.source: {kind: python, function: ...}``
(docs/own-model-and-data.md).

``embedded_digits(split, input_context=None)`` returns the embedded MNIST digits of ``split`` (a
slice of the MNIST test set, e.g. ``'test[:80%]'``; TFDS slicing syntax) as a ``tf.data.Dataset``
of unbatched ``(uint8 (28, 28), int64)`` examples. It ignores ``input_context`` (so kerasdist
shards it by data); a function over many files would shard them itself, as TFDS does with
``tfds.ReadConfig(input_context=...)``.
"""

from __future__ import annotations


def embedded_digits(split: str):
    """The embedded MNIST digits of ``split`` as an unbatched ``tf.data.Dataset``."""
    import tensorflow as tf

    from kerasdist.config import DataConfig
    from kerasdist.data.inputs import load_split

    x, y = load_split(DataConfig(), split)
    return tf.data.Dataset.from_tensor_slices((x, y))

"""An example ``data.source.function`` (``data.source: {kind: python, function: ...}``;
docs/own-model-and-data.md): :func:`embedded_digits` ignores ``input_context``, so kerasdist
shards it by data; a function over many files would shard them itself.
"""

from __future__ import annotations


def embedded_digits(split: str):
    """The embedded MNIST digits of ``split`` (e.g. ``'test[:80%]'``) as an unbatched
    ``tf.data.Dataset`` of ``(uint8 (28, 28), int64)`` examples."""
    import tensorflow as tf

    from kerasdist.config import DataConfig
    from kerasdist.data.inputs import load_split

    x, y = load_split(DataConfig(), split)
    return tf.data.Dataset.from_tensor_slices((x, y))

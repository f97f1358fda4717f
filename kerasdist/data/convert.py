"""The conversions every input applies, whatever its source (a leaf module): the global batch
against the replicas, and uint8 images to float32 model inputs."""

from __future__ import annotations


def check_batch_divisible(global_batch: int, num_replicas: int) -> None:
    """Raise :class:`~kerasdist.errors.RecipeError` unless ``global_batch`` splits evenly over
    ``num_replicas``. ``data.batch_size`` is the global batch (examples per optimizer update); each
    replica gets ``global_batch / num_replicas`` (TF's ``InputContext.get_per_replica_batch_size``).
    """
    from kerasdist.errors import RecipeError

    if global_batch % num_replicas:
        raise RecipeError(
            f"data.batch_size (the global batch) must be divisible by the number of replicas "
            f"({num_replicas}). Received: batch_size={global_batch}; use e.g. "
            f"{max(num_replicas, global_batch - global_batch % num_replicas)}.")


def preprocess(normalize: bool):
    """The one image preprocessing, a batch map ``(x, y) -> (x, y)``: uint8 images become float32
    (scaled to [0, 1] when ``normalize``) with a channel axis ``(b, H, W) -> (b, H, W, 1)``; other
    inputs (e.g. the linear model's float features) pass unchanged."""
    import tensorflow as tf

    def one(x):
        if x.dtype == tf.uint8:
            x = tf.cast(x, tf.float32)
            if normalize:
                x = x / 255.0
            if x.shape.rank == 3:  # (batch, H, W) -> (batch, H, W, 1)
                x = tf.expand_dims(x, -1)
        return x

    def fn(x, y):
        return tf.nest.map_structure(one, x), y  # several named inputs: each converted

    return fn


def shard_policy(config, pipelines: int, *, units: int | None, what: str = "file(s)",
                 why_not: str | None = None) -> str:
    """The one resolver of ``data.auto_shard``: ``'file'``, ``'data'`` or ``'off'``.

    Args:
        config: the ``DataConfig``.
        pipelines: input pipelines (workers); one pipeline is never sharded.
        units: the training split's shardable units (files; image files), or None when the
            source has none (``why_not`` says why).
        what: what a unit is, for the message.

    Raises:
        RecipeError: ``auto_shard: file`` where the split cannot be sharded by file.
    """
    from kerasdist._log import get_logger
    from kerasdist.errors import RecipeError

    wanted = config.auto_shard
    if pipelines <= 1:
        return "off"
    if wanted in ("data", "off"):
        return wanted
    if units is not None and units >= pipelines:
        return "file"
    problem = why_not or (f"split '{config.train_split}' has {units} {what}, fewer than the "
                          f"{pipelines} workers")
    if wanted == "file":
        raise RecipeError(f"data.auto_shard 'file' cannot be used: {problem}. "
                          "Received: auto_shard='file'; use 'data' or 'auto'.")
    if units is not None:
        get_logger("data").info(f"input: sharding by data, not by file: {problem}")
    return "data"

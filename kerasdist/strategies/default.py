"""``default``: one device, no replication (TF's default strategy or ``OneDeviceStrategy``)."""

from __future__ import annotations


def build(config, **_):
    """Return ``tf.distribute.get_strategy()``, or ``OneDeviceStrategy(config.device)``.

    Raises:
        RecipeError: the named device does not exist in this process.
    """
    import tensorflow as tf

    from kerasdist.errors import RecipeError

    if config.device is None:
        return tf.distribute.get_strategy()
    names = {d.name.lower().replace("/device:", "/") for d in tf.config.list_logical_devices()}
    wanted = config.device.lower().replace("/device:", "/")
    wanted = wanted if wanted.startswith("/job") else f"/job:localhost/replica:0/task:0{wanted}"
    if wanted not in names:
        raise RecipeError(f"strategy.device: no such device. Received: device='{config.device}'; "
                          f"available: {', '.join(sorted(names))}")
    return tf.distribute.OneDeviceStrategy(config.device)

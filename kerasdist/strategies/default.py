"""``default``: one device, no replication (TF's default strategy or ``OneDeviceStrategy``)."""

from __future__ import annotations

from kerasdist.config.schema import DefaultStrategyConfig
from kerasdist.strategies.base import Strategy


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


class DefaultStrategy(Strategy):
    """``strategy.kind: default``: one process, one device; Keras ``model.fit``."""

    kind = "default"
    config_class = DefaultStrategyConfig

    def build(self, config, *, cluster_resolver=None):
        return build(config)

    def replicas_before_start(self, recipe) -> int:
        return 1

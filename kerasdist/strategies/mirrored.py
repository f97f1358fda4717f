"""``mirrored``: synchronous in-graph replication on one host (``tf.distribute.MirroredStrategy``).

Every replica holds a copy of each variable; gradients are all-reduced (summed) each step, so the
replicas stay identical. This is the TF2 form of the seed's multi-GPU "towers" with
``average_gradients`` (seed 004). Source: https://www.tensorflow.org/api_docs/python/tf/distribute/MirroredStrategy
"""

from __future__ import annotations

from kerasdist.config.schema import MirroredStrategyConfig
from kerasdist.errors import RecipeError
from kerasdist.strategies.base import Strategy


def split_cpu(n: int) -> list[str]:
    """Make at least ``n`` logical CPU devices and return the names of the first ``n``.

    Must run before TensorFlow initialises its devices. If it already has, the existing logical
    CPUs are used when there are enough of them.

    Raises:
        RecipeError: TensorFlow is initialised with fewer than ``n`` logical CPUs.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if len(tf.config.get_logical_device_configuration(cpu) or []) < n:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError:
        pass  # already initialised: check below
    logical = tf.config.list_logical_devices("CPU")
    if len(logical) < n:
        raise RecipeError(
            f"strategy.logical_cpus={n} cannot be applied: TensorFlow in this process is already "
            f"initialised with {len(logical)} logical CPU(s). Set it before any TensorFlow op runs."
        )
    return [d.name for d in logical[:n]]


def build(config, **_):
    """Return a ``MirroredStrategy`` over ``config.devices``, ``config.logical_cpus`` CPUs or TF's
    default device list (all GPUs, else the CPU)."""
    import tensorflow as tf

    devices = config.devices
    if config.logical_cpus:
        devices = split_cpu(config.logical_cpus)
    ops = {
        "auto": None,
        "reduce_to_one": tf.distribute.ReductionToOneDevice(),
        "nccl": tf.distribute.NcclAllReduce(),
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce(),
    }[config.cross_device_ops]
    try:
        return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=ops)
    except (ValueError, RuntimeError) as err:
        raise RecipeError(f"strategy.devices: {err}. Received: devices={devices}") from None


class MirroredStrategy(Strategy):
    """``strategy.kind: mirrored``: one process, one replica per device; Keras ``model.fit``."""

    kind = "mirrored"
    config_class = MirroredStrategyConfig

    def build(self, config, *, cluster_resolver=None):
        return build(config)

    def replicas_before_start(self, recipe) -> int | None:
        config = recipe.strategy
        return config.logical_cpus or (len(config.devices) if config.devices else None)

"""One task of the *floor* of ``tools/startup_profile.py``: what TensorFlow and Keras alone take to
a first training step on a local cluster, with no kerasdist code at all.

Run as ``python tools/startup_floor.py OUT.jsonl`` with ``TF_CONFIG`` set (a ``worker`` of a
2-worker MultiWorkerMirroredStrategy cluster, or ``ps``/``worker``/``chief`` of a
ParameterServerStrategy cluster whose chief is the coordinator). Appends marks like
:mod:`kerasdist._timeline` (``process``, ``imports``, ``strategy``, ``model``, ``first step``) to
OUT.jsonl. The model and data match ``recipes/linear_mwms.yaml`` (one Dense unit on 1 feature,
global batch 32); the step is a plain ``tf.function`` under ``strategy.run`` (Keras 3's ``fit``
does not run under these strategies).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kerasdist._timeline import process_start_time  # noqa: E402  (no TF; a few ms)

OUT = sys.argv[1]
TASK = json.loads(os.environ["TF_CONFIG"])["task"]
NAME = f"{TASK['type']}:{TASK['index']}"


def mark(name: str, t: float | None = None) -> None:
    with open(OUT, "a") as out:
        out.write(json.dumps({"task": NAME, "pid": os.getpid(), "mark": name,
                              "t": time.time() if t is None else t}) + "\n")


mark("process", process_start_time())
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)  # inter-op: TF's default, as kerasdist
mark("imports")


def _data(batch: int):
    x = tf.random.stateless_normal((256, 1), seed=(1, 2))
    return tf.data.Dataset.from_tensor_slices((x, 2.0 * x + 10.0)).repeat().batch(batch)


def _model():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    return model, keras.optimizers.Adam(0.01)


def _replica_step(model, optimizer):
    """One replica's step: half the mean squared error, its gradient applied."""
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2) / 2.0
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss
    return replica


def mirrored() -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    mark("strategy")
    with strategy.scope():
        model, optimizer = _model()
        optimizer.build(model.trainable_variables)
    mark("model")
    dataset = strategy.experimental_distribute_dataset(_data(32))

    replica = _replica_step(model, optimizer)

    @tf.function
    def step(batch):
        return strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)

    step(next(iter(dataset)))
    mark("first step")


def parameter_server() -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if TASK["type"] in ("ps", "worker"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=TASK["type"],
                                      task_index=TASK["index"], protocol="grpc", start=True)
        mark("server")
        server.join()
        return
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    mark("strategy")
    with strategy.scope():
        model, optimizer = _model()
        optimizer.build(model.trainable_variables)
    mark("model")
    per_worker = coordinator.create_per_worker_dataset(lambda: _data(32))
    iterator = iter(per_worker)

    replica = _replica_step(model, optimizer)

    @tf.function
    def step(it):
        return strategy.run(replica, args=next(it))

    coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    mark("first step")


if __name__ == "__main__":
    mirrored() if os.environ.get("FLOOR_KIND") == "mirrored" else parameter_server()

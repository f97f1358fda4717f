"""Child script of test_ps_coordinator_copies: a parameter-server ``model.fit`` (in-process
cluster: 2 workers, 1 ps; validation every epoch) with TensorFlow's cluster function library
runtime logging each instantiation (``TF_CPP_VMODULE=cluster_function_library_runtime=1``, set by
the test). Prints ``MAIN_TID=<native id of the main thread>`` and ``FIT_DONE`` on stderr."""

from __future__ import annotations

import sys
import threading

import keras
import numpy as np
import tensorflow as tf

import kerasdist
from kerasdist.cluster.inprocess import start_inprocess_cluster
from kerasdist.data import make_dataset_fn


def main() -> int:
    kerasdist.enable()
    cluster = start_inprocess_cluster(num_workers=2, num_ps=1)
    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((512, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    train = make_dataset_fn(x, y, global_batch_size=32, training=True, repeat=True)
    val = make_dataset_fn(x[:128], y[:128], global_batch_size=32, training=False)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    print(f"MAIN_TID={threading.get_native_id()}", file=sys.stderr, flush=True)
    model.fit(train, epochs=2, steps_per_epoch=24, validation_data=val, verbose=0)
    print("FIT_DONE", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A user's multi-worker Keras script with Keras's own fault-tolerance callbacks, unchanged:
``keras.callbacks.BackupAndRestore(backup_dir=...)`` and ``keras.callbacks.ModelCheckpoint(...)``,
both given ONE path shared by every worker, as TensorFlow's multi-worker tutorial does. It knows
nothing about kerasdist: ``kerasdist launch`` runs it on every worker.

A small Dense model on real MNIST digits (the embedded t10k sample), a few steps per epoch.

Usage: python mwms_backup_restore.py DATA_DIR OUT_DIR EPOCHS [PAUSE_FROM_EPOCH]

Writes, per task, ``OUT_DIR/pid-<type>-<index>`` (its process id, so a test can kill it),
``OUT_DIR/started-<type>-<index>.txt`` (one line per run of the script: the first epoch ``fit``
trains, after ``BackupAndRestore`` restored its state) and ``OUT_DIR/final-<type>-<index>.npy``
(the final weights, concatenated). From epoch ``PAUSE_FROM_EPOCH`` on (if given), each epoch
sleeps half a second at its end so that a test has time to kill a worker once the first backup is
on disk.
"""

import gzip
import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf


def load_mnist(folder, count):
    with gzip.open(os.path.join(folder, "t10k-images-idx3-ubyte.gz")) as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(folder, "t10k-labels-idx1-ubyte.gz")) as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
    return images[:count].astype(np.float32) / 255.0, labels[:count]


class Progress(keras.callbacks.Callback):
    """Appends the first epoch each ``fit`` trains to ``path``; slows epochs from ``pause_from``."""

    def __init__(self, path, pause_from):
        super().__init__()
        self.path, self.pause_from, self.first = path, pause_from, True

    def on_epoch_begin(self, epoch, logs=None):
        if self.first:
            self.first = False
            with open(self.path, "a") as fh:
                fh.write(f"{epoch}\n")
            print(f"training from epoch {epoch}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if self.pause_from is not None and epoch >= self.pause_from:
            time.sleep(0.5)


def main():
    data_dir, out_dir, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pause_from = int(sys.argv[4]) if len(sys.argv) > 4 else None
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}-{task['index']}"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"pid-{name}"), "w") as fh:
        fh.write(str(os.getpid()))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = 32 * strategy.num_replicas_in_sync
    images, labels = load_mnist(data_dir, 1024)
    train = tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch).repeat()
    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir=os.path.join(out_dir, "backup")),
        keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "checkpoint", "model.keras")),
        Progress(os.path.join(out_dir, f"started-{name}.txt"), pause_from),
    ]
    model.fit(train, epochs=epochs, steps_per_epoch=4, callbacks=callbacks, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    np.save(os.path.join(out_dir, f"final-{name}.npy"), weights)
    print(f"task {name} finished", flush=True)


if __name__ == "__main__":
    main()

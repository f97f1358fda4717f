"""A user's multi-worker Keras training script, written the way TensorFlow's multi-worker tutorial
teaches (strategy from TF_CONFIG, global batch = per-worker batch x workers, fit on a dataset),
for Keras 3. It knows nothing about kerasdist: ``kerasdist launch`` runs it on every worker.

Usage: python mnist_multi_worker.py DATA_DIR [EPOCHS]   (DATA_DIR holds the MNIST t10k idx files)
"""

import gzip
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf


def load_mnist(folder):
    with gzip.open(os.path.join(folder, "t10k-images-idx3-ubyte.gz")) as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)
    with gzip.open(os.path.join(folder, "t10k-labels-idx1-ubyte.gz")) as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
    return images.astype(np.float32) / 255.0, labels


def build_model():
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main():
    data_dir, epochs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    tf_config = json.loads(os.environ["TF_CONFIG"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    per_worker_batch = 64
    global_batch = per_worker_batch * strategy.num_replicas_in_sync
    images, labels = load_mnist(data_dir)
    train = tf.data.Dataset.from_tensor_slices((images[:8000], labels[:8000]))
    train = train.shuffle(8000, seed=1).batch(global_batch).repeat()
    held_out = tf.data.Dataset.from_tensor_slices((images[8000:], labels[8000:])).batch(global_batch)
    with strategy.scope():
        model = build_model()
    model.fit(train, epochs=epochs, steps_per_epoch=8000 // global_batch, verbose=2)
    loss, accuracy = model.evaluate(held_out, verbose=0)
    task = tf_config["task"]
    print(f"task {task['type']}:{task['index']} held-out accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()

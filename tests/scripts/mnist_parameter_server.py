"""A user's parameter-server Keras training script in the style of TensorFlow's parameter-server
tutorial (Keras ``fit`` section): the coordinator builds a ``ParameterServerStrategy`` from
TF_CONFIG with a variable partitioner, trains with ``model.fit`` on a ``dataset_fn`` with
``steps_per_execution``, TensorBoard and ModelCheckpoint callbacks, then evaluates. It knows nothing
about kerasdist: ``kerasdist launch --ps 1`` runs it as the chief and serves the other tasks.

Usage: python mnist_parameter_server.py DATA_DIR OUT_DIR [EPOCHS]
"""

import gzip
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


def main():
    data_dir, out_dir = sys.argv[1], sys.argv[2]
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=resolver.cluster_spec().num_tasks("ps"))
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    images, labels = load_mnist(data_dir)
    batch = 64

    def dataset_fn(input_context):
        ds = tf.data.Dataset.from_tensor_slices((images[:8000], labels[:8000]))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.shuffle(8000, seed=input_context.input_pipeline_id).batch(batch).repeat()

    with strategy.scope():
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
                      metrics=["accuracy"], steps_per_execution=2)
    callbacks = [keras.callbacks.TensorBoard(log_dir=os.path.join(out_dir, "tensorboard")),
                 keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "model.keras"))]
    model.fit(dataset_fn, epochs=epochs, steps_per_epoch=8000 // batch, callbacks=callbacks,
              verbose=2)
    held_out = tf.data.Dataset.from_tensor_slices((images[8000:], labels[8000:])).batch(batch)
    loss, accuracy = model.evaluate(held_out, verbose=0)
    print(f"coordinator held-out accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()

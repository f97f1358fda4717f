"""Seed 004: one process, several devices, one model tower per device, averaged gradients.

    python -m legacy.towers --num_devices 2          # or: python -m legacy towers --devices 2

Flow, as in the seed: the variables live on the CPU; each device builds a copy
of the model (a "tower") that reads its own batches from a TFRecord file
through the TF1 queue pipeline (string_input_producer -> TFRecordReader ->
parse_single_example with ``image_raw`` bytes + ``label`` int64 -> shuffle_batch)
and computes its gradients; ``average_gradients`` averages them per variable
on the CPU (the synchronisation point) and one momentum-SGD step (0.9,
Nesterov) updates the shared variables. This machine has no GPU, so the CPU is
split into N logical devices (``tf.config.set_logical_device_configuration``,
and ``device_count`` for the v1 session); GPUs are used when present.

``write_mnist_tfrecords`` turns the real MNIST sample into the seed's record
schema (train = first 80 %, validation = last 20 %) so the flow is self-contained.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from legacy._common import cnn_logits, load_mnist, say, session_config

IMAGE_PIXELS = 28 * 28
TOWER_NAME = "tower"
SEED004_STDDEVS = (5e-2, 5e-2, 0.04, 0.04)  # the seed's truncated-normal initialisers
TRAIN_FILE = "train.tfrecords"
VALIDATION_FILE = "validation.tfrecords"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="legacy.towers", description=__doc__.split("\n")[0])
    p.add_argument("--num_devices", "--num_gpus", type=int, default=2,
                   help="towers; logical CPU devices when no GPU is present")
    p.add_argument("--max_steps", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=50, help="per tower")
    # 0.005, not 0.01: at 0.01 two CI runs (2026-11-25) ended at chance accuracy (one with the
    # loss stuck at 2.30 from step 50), and 0.02 went to NaN by step 50 on seed 3 here, so 0.01 sat
    # within 2x of divergence. At 0.005: 200 steps 0.949-0.9525, 300 steps 0.964-0.9715 (seeds 1-5
    # and 1-3, measured 2026-11-25).
    p.add_argument("--learning_rate", type=float, default=0.005)
    p.add_argument("--data_dir", default=None,
                   help="folder with train/validation .tfrecords; written from MNIST if missing")
    p.add_argument("--mnist_dir", default=None, help="folder with the MNIST IDX .gz files")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--print_every", type=int, default=50)
    return p


def setup_devices(num_devices: int):
    """Must run before TensorFlow initialises its devices. Returns (tf, tower devices)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    tf.get_logger().setLevel("ERROR")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        devices = [f"/gpu:{i}" for i in range(min(num_devices, len(gpus)))]
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
        devices = [f"/cpu:{i}" for i in range(num_devices)]
    tf.compat.v1.disable_v2_behavior()
    return tf, devices


# ---------------------------------------------------------------------------
# TFRecord data in the seed's schema
# ---------------------------------------------------------------------------

def _example(tf, image, label):
    return tf.train.Example(features=tf.train.Features(feature={
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }))


def write_mnist_tfrecords(out_dir, mnist_dir=None, tf=None) -> dict:
    """Write the MNIST sample as train/validation TFRecords (image_raw bytes, label int64)."""
    if tf is None:
        import tensorflow as tf  # noqa: PLC0415
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (tx, ty), (ex, ey) = load_mnist(mnist_dir)
    counts = {}
    for name, images, labels in ((TRAIN_FILE, tx, ty), (VALIDATION_FILE, ex, ey)):
        with tf.io.TFRecordWriter(str(out / name)) as writer:
            for img, lab in zip(images, labels, strict=True):
                writer.write(_example(tf, img, lab).SerializeToString())
        counts[name] = len(labels)
    return counts


def decode(tf, serialized):
    """Parse one record of the seed's schema -> (float image in [-0.5, 0.5], int32 label)."""
    v1 = tf.compat.v1
    features = v1.parse_single_example(serialized, features={
        "image_raw": v1.FixedLenFeature([], tf.string),
        "label": v1.FixedLenFeature([], tf.int64),
    })
    image = v1.decode_raw(features["image_raw"], tf.uint8)
    image.set_shape([IMAGE_PIXELS])
    image = tf.cast(image, tf.float32) * (1.0 / 255) - 0.5
    return image, tf.cast(features["label"], tf.int32)


def queue_inputs(tf, filename, batch_size, seed):
    """The seed's TF1 input pipeline: filename queue -> reader -> shuffle_batch."""
    v1 = tf.compat.v1
    with tf.name_scope("input"):
        filename_queue = v1.train.string_input_producer([filename], num_epochs=None, seed=seed)
        _, serialized = v1.TFRecordReader().read(filename_queue)
        image, label = decode(tf, serialized)
        return v1.train.shuffle_batch(
            [image, label], batch_size=batch_size, num_threads=1,
            capacity=1000 + 3 * batch_size, min_after_dequeue=1000, seed=seed)


# ---------------------------------------------------------------------------
# towers
# ---------------------------------------------------------------------------

def tower_loss(tf, scope, filename, batch_size, seed):
    """Loss of one tower on its own batches; variables shared through the variable scope."""
    v1 = tf.compat.v1
    images, labels = queue_inputs(tf, filename, batch_size, seed)
    logits = cnn_logits(tf, images, 1.0, variable_device="/cpu:0", stddevs=SEED004_STDDEVS)
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits), name="cross_entropy")
    v1.add_to_collection("losses", xent)
    return tf.add_n(v1.get_collection("losses", scope), name="total_loss")


def average_gradients(tf, tower_grads):
    """Average each variable's gradient over the towers.

    ``tower_grads`` is one list of (gradient, variable) pairs per tower, all in
    the same variable order. Returns one list of (mean gradient, variable).
    This is where the towers synchronise: the mean needs every tower's result.
    """
    averaged = []
    for pairs in zip(*tower_grads, strict=True):
        var = pairs[0][1]
        if any(v is not var for _, v in pairs):
            raise ValueError("towers disagree on the variable order")
        grads = [g for g, _ in pairs if g is not None]
        if not grads:
            continue
        averaged.append((tf.reduce_mean(tf.stack(grads, axis=0), axis=0), var))
    return averaged


def build_training(tf, devices, train_file, args):
    v1 = tf.compat.v1
    global_step = v1.get_variable("global_step", [], initializer=v1.constant_initializer(0),
                                  trainable=False, dtype=tf.int64)
    opt = v1.train.MomentumOptimizer(args.learning_rate, 0.9, use_nesterov=True, use_locking=True)
    tower_grads, losses = [], []
    with v1.variable_scope(v1.get_variable_scope()):
        for i, device in enumerate(devices):
            with tf.device(device), tf.name_scope(f"{TOWER_NAME}_{i}") as scope:
                loss = tower_loss(tf, scope, train_file, args.batch_size, args.seed + i)
                v1.get_variable_scope().reuse_variables()
                tower_grads.append(opt.compute_gradients(loss, gate_gradients=0))
                losses.append(loss)
    with tf.device("/cpu:0"):
        grads = average_gradients(tf, tower_grads)
        train_op = opt.apply_gradients(grads, global_step=global_step)
        mean_loss = tf.reduce_mean(tf.stack(losses))
    return global_step, train_op, mean_loss, losses


def build_eval(tf, validation_file):
    """Held-out accuracy over the whole validation file (tf.data, one pass)."""
    v1 = tf.compat.v1
    with tf.device("/cpu:0"), tf.name_scope("eval"):
        ds = tf.data.TFRecordDataset(validation_file).map(lambda s: decode(tf, s)).batch(500)
        images, labels = v1.data.make_one_shot_iterator(ds).get_next()
        with v1.variable_scope(v1.get_variable_scope(), reuse=True):
            logits = cnn_logits(tf, images, 1.0, variable_device="/cpu:0",
                                stddevs=SEED004_STDDEVS)
        hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32),
                                              labels), tf.int32))
    return hits, tf.size(labels)


def _evaluate(tf, sess, hits, count):
    right = total = 0
    while True:
        try:
            h, c = sess.run([hits, count])
        except tf.errors.OutOfRangeError:
            return right / max(total, 1), total
        right, total = right + int(h), total + int(c)


def train(args) -> float:
    tf, devices = setup_devices(args.num_devices)
    if args.data_dir:
        return _train_on(tf, devices, Path(args.data_dir), args)
    with tempfile.TemporaryDirectory(prefix="towers_tfrecords_") as tmp:
        return _train_on(tf, devices, Path(tmp), args)


def _train_on(tf, devices, data_dir: Path, args) -> float:
    v1 = tf.compat.v1
    if not (data_dir / TRAIN_FILE).is_file():
        counts = write_mnist_tfrecords(data_dir, args.mnist_dir, tf=tf)
        say(f"wrote {counts} to {data_dir}")
    with tf.Graph().as_default(), tf.device("/cpu:0"):
        v1.set_random_seed(args.seed)
        global_step, train_op, mean_loss, losses = build_training(
            tf, devices, str(data_dir / TRAIN_FILE), args)
        hits, count = build_eval(tf, str(data_dir / VALIDATION_FILE))
        say("towers: " + ", ".join(f"{lo.op.name.split('/')[0]} on {lo.device}" for lo in losses))
        config = session_config(tf, threads=args.threads,
                                cpu_devices=len(devices) if devices[0].startswith("/cpu") else None)
        with v1.Session(config=config) as sess:
            say(f"session devices: {[d.name.split('/')[-1] for d in sess.list_devices()]}")
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            coord = v1.train.Coordinator()
            threads = v1.train.start_queue_runners(sess=sess, coord=coord)
            t0 = time.time()
            try:
                for step in range(1, args.max_steps + 1):
                    _, loss_value = sess.run([train_op, mean_loss])
                    if step % args.print_every == 0 or step == 1:
                        rate = step * args.batch_size * len(devices) / (time.time() - t0)
                        say(f"step {step}, loss = {loss_value:.3f} ({rate:.1f} examples/sec)")
            finally:
                coord.request_stop()
                coord.join(threads, stop_grace_period_secs=5, ignore_live_threads=True)
            train_s = time.time() - t0
            acc, total = _evaluate(tf, sess, hits, count)
            step_value = sess.run(global_step)
    say(f"train_wall_s={train_s:.3f}")
    say(f"towers={len(devices)} global_step={step_value} held-out accuracy={acc:.4f} "
        f"on {total} digits")
    return acc


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    train(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Shared helpers for the TF1 reproductions: MNIST IDX loading, cluster flags,
thread-limited session configs and the CNN used by the seed tutorials.

Everything here is plain ``tf.compat.v1`` graph-mode code (raw variables and
``tf.nn`` ops) because ``tf.compat.v1.layers`` needs Keras 2, which is not
installed next to Keras 3.
"""

from __future__ import annotations

import gzip
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent

# Where the real MNIST test set (10,000 digits, IDX format) may live, first hit wins.
_MNIST_DIRS = (
    os.environ.get("LEGACY_MNIST_DIR", ""),
    str(REPO_ROOT / "kerasdist" / "data" / "sample"),
    "/work/shared/data/mnist",
)
IMAGES_FILE = "t10k-images-idx3-ubyte.gz"
LABELS_FILE = "t10k-labels-idx1-ubyte.gz"
TRAIN_FRACTION = 0.8


def find_mnist_dir(explicit: str | None = None) -> Path:
    """Return the first folder that holds both MNIST IDX files."""
    for cand in (explicit or "",) + _MNIST_DIRS:
        if cand and (Path(cand) / IMAGES_FILE).is_file() and (Path(cand) / LABELS_FILE).is_file():
            return Path(cand)
    raise FileNotFoundError(
        f"MNIST IDX files ({IMAGES_FILE}, {LABELS_FILE}) not found; "
        "pass --data_dir or set LEGACY_MNIST_DIR"
    )


def _read_idx(path: Path, magic_expected: int) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != magic_expected:
        raise ValueError(f"{path}: IDX magic {magic}, expected {magic_expected}")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return data.reshape(dims)


def load_mnist(data_dir: str | None = None):
    """Load the 10k real digits and split them 80/20 (TFDS-style test[:80%] / test[80%:]).

    Returns ``(train_images, train_labels), (eval_images, eval_labels)`` with
    images as uint8 arrays of shape [n, 28, 28] and labels as int64 [n].
    """
    folder = find_mnist_dir(data_dir)
    images = _read_idx(folder / IMAGES_FILE, 2051)
    labels = _read_idx(folder / LABELS_FILE, 2049).astype(np.int64)
    if images.shape[0] != labels.shape[0]:
        raise ValueError("MNIST images and labels disagree in length")
    cut = int(round(images.shape[0] * TRAIN_FRACTION))
    return (images[:cut], labels[:cut]), (images[cut:], labels[cut:])


def to_float_flat(images: np.ndarray) -> np.ndarray:
    """uint8 [n,28,28] -> float32 [n,784] in [0, 1]."""
    return images.reshape(images.shape[0], -1).astype(np.float32) / 255.0


def split_hosts(text: str) -> list[str]:
    return [h.strip() for h in text.split(",") if h.strip()]


def add_cluster_flags(parser, train_steps: int, learning_rate: float) -> None:
    """The flags every seed script defines (tf.app.flags there, argparse here)."""
    parser.add_argument("--job_name", choices=("ps", "worker"), default=None,
                        help="ps or worker; omit to run the single-process variant")
    parser.add_argument("--task_index", type=int, default=0, help="index of the task in its job")
    parser.add_argument("--ps_hosts", default="localhost:2222",
                        help="comma-separated host:port list of the ps job")
    parser.add_argument("--worker_hosts", default="localhost:2223,localhost:2224",
                        help="comma-separated host:port list of the worker job")
    parser.add_argument("--train_steps", type=int, default=train_steps,
                        help="global step at which training stops")
    parser.add_argument("--learning_rate", type=float, default=learning_rate)
    parser.add_argument("--log_dir", default=None,
                        help="checkpoint/summary dir (chief only); a temp dir if omitted")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op and inter-op thread count of this task")
    parser.add_argument("--op_timeout_ms", type=int, default=120_000,
                        help="session operation timeout; stops a task that waits forever "
                             "on a dead peer (0 = wait forever, the TF1 default)")


def import_tf_v1():
    """Import TensorFlow, switch to TF1 graph behaviour and return ``tf.compat.v1``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    tf.get_logger().setLevel("ERROR")
    tf.compat.v1.disable_v2_behavior()
    return tf


def session_config(tf, threads: int = 1, op_timeout_ms: int = 0, device_filters=None,
                   cpu_devices: int | None = None):
    """A ConfigProto with few threads (everything shares 2 cores here)."""
    cfg = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=False,
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
    )
    if op_timeout_ms:
        cfg.operation_timeout_in_ms = op_timeout_ms
    if device_filters:
        cfg.device_filters.extend(device_filters)
    if cpu_devices:
        cfg.device_count["CPU"] = cpu_devices
    return cfg


def make_server(tf, args):
    """ClusterSpec + Server for this task, from the seed-style flags."""
    ps_hosts = split_hosts(args.ps_hosts)
    worker_hosts = split_hosts(args.worker_hosts)
    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = tf.compat.v1.train.Server(
        cluster,
        job_name=args.job_name,
        task_index=args.task_index,
        config=session_config(tf, threads=args.threads),
    )
    return cluster, server, ps_hosts, worker_hosts


def wait_for_chief(tf, server, config, timeout_s: float = 600.0, poll_s: float = 0.5) -> None:
    """Non-chief: poll until the chief has initialised the shared variables.

    MonitoredTrainingSession's worker session creator checks readiness and then
    sleeps 30 s (not configurable there) between checks; polling here first
    lets a worker join as soon as the chief is ready, like the seed's
    Supervisor(recovery_wait_secs=1).
    """
    v1 = tf.compat.v1
    not_ready = v1.report_uninitialized_variables(v1.global_variables())
    deadline = time.time() + timeout_s
    with v1.Session(server.target, config=config) as sess:
        while len(sess.run(not_ready)) > 0:
            if time.time() > deadline:
                raise TimeoutError(f"chief did not initialise the variables in {timeout_s} s")
            time.sleep(poll_s)


def serve_forever(server, label: str) -> None:
    """What the ps does in every seed: block in server.join() until killed."""
    say(f"{label}: parameter server started at {server.target}, joining")
    server.join()


def quiet_cancelled_queue_threads(tf) -> None:
    """Closing a session cancels the ops its queue-runner threads block in.

    TF's QueueRunner then re-raises CancelledError in its (daemon) thread and
    Python prints a traceback although nothing went wrong. Print one line instead.
    """
    import threading  # noqa: PLC0415

    previous = threading.excepthook

    def hook(info):
        if issubclass(info.exc_type, tf.errors.CancelledError):
            name = info.thread.name if info.thread else "?"
            say(f"(queue runner thread {name} stopped: session closed)")
            return
        previous(info)

    threading.excepthook = hook


def say(msg: str) -> None:
    print(msg, flush=True)


def hard_exit(code: int = 0) -> None:
    """Leave without running interpreter teardown.

    A task's gRPC server keeps threads alive that TF offers no way to stop; a
    normal interpreter exit can stall on them, so after the work is done and
    the output flushed, leave at once.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------------------
# The MNIST CNN of seeds 000 and 004, on raw v1 variables.
# ---------------------------------------------------------------------------

def cnn_logits(tf, images, keep_prob, variable_device=None, stddevs=(0.1, 0.1, 0.1, 0.1)):
    """conv5x5x32 -> pool -> conv5x5x64 -> pool -> fc1024 -> dropout -> fc10 logits.

    ``images`` is a float [batch, 784] tensor. Variables are made with
    ``get_variable`` so a caller can share them between towers through the
    enclosing variable scope; ``variable_device`` pins them (towers: the CPU).
    ``stddevs`` are the truncated-normal widths of conv1, conv2, fc1, logits
    weights (seed 000 uses 0.1 everywhere; seed 004 uses 0.05, 0.05, 0.04, 0.04).
    """
    v1 = tf.compat.v1

    def var(name, shape, init):
        if variable_device is None:
            return v1.get_variable(name, shape, initializer=init, dtype=tf.float32)
        with tf.device(variable_device):
            return v1.get_variable(name, shape, initializer=init, dtype=tf.float32)

    def weights(name, shape, stddev):
        return var(name, shape, v1.truncated_normal_initializer(stddev=stddev))

    def bias(name, shape):
        return var(name, shape, v1.constant_initializer(0.1))

    def conv_relu_pool(h, shape, stddev):
        kernel = weights("w", shape, stddev)
        h = tf.nn.relu(tf.nn.conv2d(h, kernel, [1, 1, 1, 1], "SAME") + bias("b", shape[-1:]))
        return tf.nn.max_pool2d(h, 2, 2, "SAME")

    h = tf.reshape(images, [-1, 28, 28, 1])
    with v1.variable_scope("conv1"):
        h = conv_relu_pool(h, [5, 5, 1, 32], stddevs[0])
    with v1.variable_scope("conv2"):
        h = conv_relu_pool(h, [5, 5, 32, 64], stddevs[1])
    h = tf.reshape(h, [-1, 7 * 7 * 64])
    with v1.variable_scope("fc1"):
        h = tf.nn.relu(tf.matmul(h, weights("w", [7 * 7 * 64, 1024], stddevs[2]))
                       + bias("b", [1024]))
    h = tf.nn.dropout(h, rate=1.0 - keep_prob)
    with v1.variable_scope("logits"):
        return tf.matmul(h, weights("w", [1024, 10], stddevs[3])) + bias("b", [10])

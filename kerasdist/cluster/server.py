"""Run this process as a ``ps`` or ``worker`` task server of a parameter-server cluster.

Servers start a ``tf.distribute.Server`` and block until killed: the coordinator (chief) sends them
work. Source: https://www.tensorflow.org/tutorials/distribute/parameter_server_training
"""

from __future__ import annotations

from kerasdist._log import get_logger
from kerasdist.cluster.spec import TFConfig, check_port_free, split_address

log = get_logger("cluster")


def server_config(tf_config: TFConfig, *, intra_op_threads: int = 0):
    """``tf.compat.v1.ConfigProto`` for a task server.

    ``inter_op_parallelism_threads`` is at least ``num_workers + 1``: with fewer, a worker whose
    scheduled functions wait on each other can deadlock on small machines (TF's own
    multi-worker test helper applies the same rule).
    """
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = max(4, tf_config.num("worker") + 1)
    if intra_op_threads:
        config.intra_op_parallelism_threads = intra_op_threads
    return config


def start_server(tf_config: TFConfig, *, intra_op_threads: int = 0):
    """Start this task's gRPC server (in TF's own threads) and return it.

    Raises:
        ClusterError: this task's port is already in use (names the task and port).
    """
    import tensorflow as tf

    check_port_free(tf_config.address, tf_config.task_name)
    server = tf.distribute.Server(
        tf_config.cluster_spec(), job_name=tf_config.task_type, task_index=tf_config.task_index,
        protocol="grpc", config=server_config(tf_config, intra_op_threads=intra_op_threads),
        start=True)
    _, port = split_address(tf_config.address)
    # TensorFlow offers no bind address: the server listens on every interface of this network
    # namespace (a local cluster's namespace has only loopback; see kerasdist.launch.isolation).
    log.warning(f"task {tf_config.task_name} serving on port {port} of every network interface "
                f"(TensorFlow binds all interfaces, without authentication); the cluster reaches "
                f"it as {tf_config.address}")
    return server


def serve(tf_config: TFConfig, *, intra_op_threads: int = 0) -> None:
    """Start this task's gRPC server and block forever.

    Raises:
        ClusterError: this task's port is already in use (names the task and port).
    """
    start_server(tf_config, intra_op_threads=intra_op_threads).join()

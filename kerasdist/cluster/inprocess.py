"""An in-process TensorFlow cluster: worker and ps servers running in threads of this process, for
tests and notebooks (``ParameterServerStrategy`` code runs unchanged against real gRPC servers).

* **Servers live until the process exits** (``tf.distribute.Server`` has no working ``stop()``
  for gRPC): start one per process and share it; fault-tolerance tests need subprocesses.
* **Worker servers need ``inter_op_parallelism_threads >= num_workers + 1``** or they can
  deadlock on few cores (as TF's ``create_in_process_cluster``); :func:`start_inprocess_cluster`
  sets it.
* **Connecting is for the rest of the process**: later ``MirroredStrategy`` steps in it can hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kerasdist.errors import ClusterError

_SERVERS: list[Any] = []  # keep every in-process server referenced until the process exits


@dataclass(frozen=True)
class InProcessCluster:
    """A running in-process cluster.

    Attributes:
        cluster_spec: ``tf.train.ClusterSpec`` with jobs ``worker``, ``ps`` and ``chief``.
        cluster_resolver: ``SimpleClusterResolver`` for the coordinator: task ``chief`` 0, rpc
            layer ``grpc``. Pass it to ``tf.distribute.ParameterServerStrategy`` or to
            ``kerasdist.strategies.registry.build(config, cluster_resolver=...)``.
        worker_addresses: ``host:port`` of each worker server.
        ps_addresses: ``host:port`` of each ps server.
        chief_address: ``host:port`` reserved for the coordinator; its server is started by the
            strategy (``tf.config.experimental_connect_to_cluster``), not here.
        servers: the started ``tf.distribute.Server`` objects (workers first, then ps).
    """

    cluster_spec: Any
    cluster_resolver: Any
    worker_addresses: tuple[str, ...]
    ps_addresses: tuple[str, ...]
    chief_address: str
    servers: tuple[Any, ...] = field(repr=False, default=())

    @property
    def tf_config(self):
        """The coordinator's role (``chief:0``) as a :class:`~kerasdist.cluster.spec.TFConfig`,
        e.g. for :func:`kerasdist.training.run_session`."""
        from kerasdist.cluster.spec import validate

        jobs = {k: list(v) for k, v in self.cluster_spec.as_dict().items()}
        return validate(jobs, "chief", 0)

    @property
    def num_workers(self) -> int:
        return len(self.worker_addresses)

    @property
    def num_ps(self) -> int:
        return len(self.ps_addresses)


def _check_counts(num_workers: int, num_ps: int, inter_op_threads: int | None) -> int:
    if num_workers < 1:
        raise ClusterError(f"num_workers must be >= 1. Received: num_workers={num_workers}")
    if num_ps < 0:
        raise ClusterError(f"num_ps must be >= 0. Received: num_ps={num_ps}")
    needed = num_workers + 1
    if inter_op_threads is None:
        return needed
    if inter_op_threads < needed:
        raise ClusterError(
            f"inter_op_threads must be >= num_workers + 1 = {needed}, or in-process workers can "
            f"deadlock. Received: inter_op_threads={inter_op_threads}; leave it None.")
    return inter_op_threads


def _start(cluster_spec, job: str, index: int, config, address: str):
    import tensorflow as tf

    try:
        server = tf.distribute.Server(cluster_spec, job_name=job, task_index=index,
                                      protocol="grpc", config=config, start=True)
    except (tf.errors.OpError, RuntimeError) as err:
        raise ClusterError(f"could not start the in-process '{job}' task {index} at {address} "
                           f"(port taken?): {err}") from None
    _SERVERS.append(server)
    return server


def start_inprocess_cluster(
    *,
    num_workers: int = 2,
    num_ps: int = 1,
    host: str = "localhost",
    inter_op_threads: int | None = None,
) -> InProcessCluster:
    """Start ``num_workers`` worker and ``num_ps`` ps gRPC servers in this process.

    Ports come from ``portpicker``. The servers run until the process exits (see module docs).

    Args:
        num_workers: worker tasks (>= 1).
        num_ps: parameter-server tasks (>= 0; ``ParameterServerStrategy`` needs >= 1).
        host: host name in the addresses.
        inter_op_threads: ``inter_op_parallelism_threads`` of each worker server; default
            ``num_workers + 1``, the least that avoids the deadlock described in the module docs.

    Returns:
        :class:`InProcessCluster`.

    Raises:
        ClusterError: bad counts, too few inter-op threads, or a server that could not start
            (the message names the task and its address).

    Example::

        cluster = start_inprocess_cluster(num_workers=2, num_ps=1)
        strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver)
    """
    import portpicker
    import tensorflow as tf

    threads = _check_counts(num_workers, num_ps, inter_op_threads)
    workers = tuple(f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_workers))
    ps = tuple(f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_ps))
    chief = f"{host}:{portpicker.pick_unused_port()}"
    jobs = {"worker": list(workers), "chief": [chief]}
    if ps:
        jobs["ps"] = list(ps)
    spec = tf.train.ClusterSpec(jobs)
    worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
    ps_config = tf.compat.v1.ConfigProto()
    ps_config.device_count["GPU"] = 0
    servers = [_start(spec, "worker", i, worker_config, a) for i, a in enumerate(workers)]
    servers += [_start(spec, "ps", i, ps_config, a) for i, a in enumerate(ps)]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="chief", task_id=0, rpc_layer="grpc")
    return InProcessCluster(cluster_spec=spec, cluster_resolver=resolver,
                            worker_addresses=workers, ps_addresses=ps, chief_address=chief,
                            servers=tuple(servers))

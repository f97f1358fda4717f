"""Cluster specs and TF_CONFIG: parse, build from seed-style flags, validate before anything starts.

``TF_CONFIG`` is the JSON environment variable TensorFlow reads to learn the cluster and the current
task (https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable)::

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"], "ps": ["host3:2222"]},
     "task": {"type": "worker", "index": 0}}

Accepted and refused as TensorFlow does (a sidecar ``evaluator`` not in ``cluster``, a string
index, bracketed IPv6; unknown task types, two chiefs, an index out of range); duplicate addresses,
which TensorFlow accepts silently, are refused naming the tasks. :meth:`TFConfig.to_json` is only
ever passed into a child process's environment, never written into this one's.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Mapping

from kerasdist.errors import ClusterError

TASK_TYPES = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class TFConfig:
    """A validated cluster spec plus the current task.

    Attributes:
        cluster: task type -> list of ``host:port`` addresses.
        task_type: this process's task type (``chief``, ``worker``, ``ps`` or ``evaluator``; an
            ``evaluator`` need not be listed in ``cluster``, as TensorFlow allows).
        task_index: this process's index within its task type, 0-based.
    """

    cluster: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    task_type: str = "worker"
    task_index: int = 0

    @property
    def address(self) -> str:
        """This task's ``host:port``.

        Raises:
            ClusterError: this task is a sidecar ``evaluator`` not listed in the cluster.
        """
        if self.task_type not in self.cluster:
            raise ClusterError(f"task {self.task_name} is not in the cluster, so it has no address "
                               "(a sidecar evaluator serves no port)")
        return self.cluster[self.task_type][self.task_index]

    @property
    def is_chief(self) -> bool:
        """True for the chief task, or worker 0 when the cluster has no chief (TF's convention)."""
        if self.task_type == "chief":
            return True
        return "chief" not in self.cluster and self.task_type == "worker" and self.task_index == 0

    @property
    def task_name(self) -> str:
        """``type:index``, e.g. ``worker:1``."""
        return f"{self.task_type}:{self.task_index}"

    def num(self, task_type: str) -> int:
        """Number of tasks of ``task_type`` (0 if absent)."""
        return len(self.cluster.get(task_type, ()))

    def for_task(self, task_type: str, task_index: int) -> TFConfig:
        """The same cluster seen from another task."""
        return validate(dict(self.cluster), task_type, task_index)

    def as_dict(self) -> dict:
        return {"cluster": {k: list(v) for k, v in self.cluster.items()},
                "task": {"type": self.task_type, "index": self.task_index}}

    def to_json(self) -> str:
        """The ``TF_CONFIG`` value for this task."""
        return json.dumps(self.as_dict())

    def cluster_spec(self):
        """``tf.train.ClusterSpec`` of the cluster."""
        import tensorflow as tf

        return tf.train.ClusterSpec({k: list(v) for k, v in self.cluster.items()})

    def cluster_resolver(self):
        """A ``SimpleClusterResolver`` for this task (grpc), without touching ``os.environ``."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            self.cluster_spec(), task_type=self.task_type, task_id=self.task_index,
            rpc_layer="grpc")


def split_address(address: str) -> tuple[str, int]:
    """``'host:port'`` or ``'[v6addr]:port'`` -> ``(host, port)``, the host without brackets."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _check_address(task: str, address: object) -> None:
    if not isinstance(address, str) or address.count(":") < 1:
        raise ClusterError(f"cluster task {task}: address must be 'host:port'. Received: {address!r}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"cluster task {task}: bad port in address. Received: '{address}'")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if ":" in host and not bracketed:  # gRPC reads a bare IPv6 address as a host without a port
        raise ClusterError(f"cluster task {task}: an IPv6 address needs brackets, e.g. "
                           f"'[::1]:{port}'. Received: '{address}'")
    if ("[" in host or "]" in host) and not (bracketed and ":" in host[1:-1]):
        raise ClusterError(f"cluster task {task}: brackets hold an IPv6 address only. "
                           f"Received: '{address}'")


def _check_jobs(cluster: Mapping) -> dict[str, tuple[str, ...]]:
    seen: dict[str, str] = {}
    clean: dict[str, tuple[str, ...]] = {}
    for job, addresses in cluster.items():
        if job not in TASK_TYPES:
            raise ClusterError(f"TF_CONFIG cluster: unknown task type '{job}'. "
                               f"Available: {', '.join(TASK_TYPES)}")
        if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)) or not addresses:
            raise ClusterError(f"TF_CONFIG cluster.{job} must be a non-empty list of 'host:port'. "
                               f"Received: {addresses!r}")
        for index, address in enumerate(addresses):
            name = f"{job}:{index}"
            _check_address(name, address)
            if address in seen:
                raise ClusterError(f"TF_CONFIG cluster: tasks {seen[address]} and {name} have the "
                                   f"same address '{address}'")
            seen[address] = name
        clean[job] = tuple(addresses)
    return clean


def _task_index(value: object) -> int | None:
    """TF's ``int(task['index'])`` for what it is meant to read: an int or a string of digits
    (``"1"``, as YAML/JSON templating often writes it); None for anything else (a bool, a float)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def validate(cluster: Mapping, task_type: str, task_index: int,
             *, require_ps: bool = False) -> TFConfig:
    """Validate a cluster mapping and the current task; return a :class:`TFConfig`.

    Raises:
        ClusterError: unknown task type, empty job, index out of range, malformed or duplicate
            addresses, or no ``ps`` task when ``require_ps``.
    """
    if not isinstance(cluster, Mapping) or not cluster:
        raise ClusterError(f"TF_CONFIG 'cluster' must be a non-empty mapping. Received: {cluster!r}")
    clean = _check_jobs(cluster)
    original = task_index
    for job in ("chief", "evaluator"):
        if len(clean.get(job, ())) > 1:
            raise ClusterError(f"TF_CONFIG cluster.{job} holds at most one task. "
                               f"Received: {list(clean[job])}")
    if require_ps and not clean.get("ps"):
        raise ClusterError("strategy 'parameter_server' needs at least one 'ps' task in the "
                           f"cluster. Received task types: {', '.join(clean)}")
    if task_type not in clean and task_type != "evaluator":  # TF: a sidecar evaluator may be unlisted
        raise ClusterError(f"TF_CONFIG task.type '{task_type}' is not in the cluster "
                           f"(task types: {', '.join(clean)})")
    task_index = _task_index(task_index)
    if task_index is None:
        raise ClusterError(f"TF_CONFIG task.index must be an integer (or a string of digits). "
                           f"Received: index={original!r}")
    if task_index < 0 or (
            task_type in clean and task_index >= len(clean[task_type])):
        size = f"{len(clean[task_type])} task(s)" if task_type in clean else "not in the cluster"
        raise ClusterError(f"TF_CONFIG task.index out of range for '{task_type}' "
                           f"({size}). Received: index={original!r}")
    return TFConfig(cluster=clean, task_type=task_type, task_index=task_index)


def parse_tf_config(text: str | None, *, require_ps: bool = False) -> TFConfig:
    """Parse and validate a ``TF_CONFIG`` JSON string.

    Raises:
        ClusterError: unset, not JSON (with line/column), or invalid (see :func:`validate`).
    """
    if not text:
        raise ClusterError("cluster.kind 'tf_config' needs the TF_CONFIG environment variable (or "
                           "--job-name/--task-index/--ps-hosts/--worker-hosts). Received: unset")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError(f"TF_CONFIG is not valid JSON (line {err.lineno}, column {err.colno}): "
                           f"{err.msg}. Received: {text[:200]!r}") from None
    if not isinstance(data, dict) or "cluster" not in data or "task" not in data:
        raise ClusterError(f"TF_CONFIG needs 'cluster' and 'task' keys. Received: {text[:200]!r}")
    task = data["task"]
    if not isinstance(task, dict) or "type" not in task:
        raise ClusterError(f"TF_CONFIG task needs 'type' and 'index'. Received: {task!r}")
    return validate(data["cluster"], task["type"], task.get("index", 0), require_ps=require_ps)


def from_flags(*, job_name: str, task_index: int, ps_hosts: str = "", worker_hosts: str = "",
               chief_host: str = "", require_ps: bool = False) -> TFConfig:
    """Build a :class:`TFConfig` from the seed tutorials' flags (comma-separated host lists).

    Example: ``from_flags(job_name="worker", task_index=1, ps_hosts="h0:2222",
    worker_hosts="h1:2222,h2:2222")``.
    """
    cluster = {}
    for job, hosts in (("chief", chief_host), ("worker", worker_hosts), ("ps", ps_hosts)):
        items = [h.strip() for h in hosts.split(",") if h.strip()]
        if items:
            cluster[job] = items
    return validate(cluster, job_name, task_index, require_ps=require_ps)


def check_port_free(address: str, task: str) -> None:
    """Raise ClusterError naming ``task`` and the port when ``address``'s port cannot be bound here.

    TensorFlow's servers bind the port on every interface whatever the host part says, so this
    binds the wildcard address (dual-stack IPv6 when available, as gRPC does)."""
    host, port = split_address(address)
    for family, wildcard in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine
            continue
        with sock:
            # Like gRPC's own servers: a port left in TIME_WAIT by a task that just died is free,
            # a port with a live listener is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((wildcard, port))
            except OSError as err:
                raise ClusterError(f"task {task}: port {port} on '{host}' is already in use or "
                                   f"cannot be bound ({err.strerror}). Received: "
                                   f"address='{address}'") from None
        return


def check_ports_free(spec: TFConfig) -> None:
    """:func:`check_port_free` for every task of a cluster on this machine (a local cluster)."""
    for job, addresses in spec.cluster.items():
        for index, address in enumerate(addresses):
            check_port_free(address, f"{job}:{index}")


def local_cluster(*, workers: int, ps: int = 0, chief: bool = False) -> TFConfig:
    """A cluster on free localhost ports (portpicker), seen from ``chief:0`` or ``worker:0``."""
    import portpicker

    def ports(n):
        return [f"localhost:{portpicker.pick_unused_port()}" for _ in range(n)]

    cluster = {"worker": ports(workers)}
    if ps:
        cluster["ps"] = ports(ps)
    if chief:
        cluster["chief"] = ports(1)
    return validate(cluster, "chief" if chief else "worker", 0)

"""Where a parameter-server model's variables live: each ps task's variables and shards.

A ``ParameterServerStrategy`` places every variable on one ps task (round robin), or, with a
``variable_partitioner``, splits it along axis 0 into shards on consecutive ps tasks
(:mod:`kerasdist._compat.keras_sharded_variables` makes Keras 3 train them). This module reads
the placement back from the variables' devices, for ``metrics.json`` and the console, so a user
can see that each of N ps holds about 1/N of a large table.
"""

from __future__ import annotations

import math
from pathlib import Path


def _shards(variable):
    """``[(shard_index, num_shards, tf.Variable)]`` of a Keras or TF variable."""
    from kerasdist._compat import internals

    value = internals.backing_variable(variable)
    inner = getattr(value, "variables", None)
    shards = [value] if inner is None else list(inner)
    return [(index, len(shards), shard) for index, shard in enumerate(shards)]


def ps_placement(model, num_ps: int, logs: Path | None = None) -> list[dict]:
    """Each ps task's share of ``model.weights`` and ``model.optimizer.variables``.

    Args:
        model: a Keras model built (and its optimizer built) under a ``ParameterServerStrategy``.
        num_ps: the number of ps tasks in the cluster.
        logs: the run's log folder (``<run_dir>/logs``): finds a local cluster's ps tasks by
            their logs too (:func:`ps_peak_rss`).

    Returns:
        One dict per ps task, in task order: ``{"task": i, "bytes": int, "variables": int,
        "shards": [{"path": str, "shard": k, "of": n, "shape": [rows, ...]}, ...]}``, plus
        ``"peak_rss_bytes"`` where the task's process could be read (:func:`ps_peak_rss`); ``shards``
        lists only the pieces of variables split in 2 or more (a whole variable counts in
        ``variables`` and ``bytes``). Variables placed on no ps task (the coordinator's own)
        are left out.
    """
    import tensorflow as tf

    tasks = [{"task": i, "bytes": 0, "variables": 0, "shards": []} for i in range(num_ps)]
    from kerasdist.keras.ps_fit import cluster_spec

    try:
        addresses = list(cluster_spec(model.distribute_strategy).as_dict().get("ps", []))
    except (AttributeError, ValueError):  # no cluster (not a parameter-server model)
        addresses = []
    for index, peak in (ps_peak_rss(addresses, logs) if addresses else {}).items():
        if index < num_ps:
            tasks[index]["peak_rss_bytes"] = peak
    optimizer_variables = list(getattr(getattr(model, "optimizer", None), "variables", []) or [])
    seen = set()
    for variable in [*model.weights, *optimizer_variables]:
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        for index, count, shard in _shards(variable):
            device = tf.DeviceSpec.from_string(getattr(shard, "device", "") or "")
            if device.job != "ps" or device.task is None or device.task >= num_ps:
                continue
            entry = tasks[device.task]
            entry["variables"] += 1
            entry["bytes"] += int(shard.shape.num_elements() or 0) * shard.dtype.size
            if count > 1:
                entry["shards"].append({"path": getattr(variable, "path", shard.name),
                                        "shard": index, "of": count,
                                        "shape": shard.shape.as_list()})
    return tasks


def ps_peak_rss(ps_addresses: list[str], logs: Path | None = None) -> dict[int, int]:
    """``{ps task index: peak resident set size in bytes}`` of the ps tasks of this cluster that
    run on this machine as processes readable by this user (local clusters): a process whose
    ``TF_CONFIG`` names task type ``ps`` and the same ps addresses, or, with ``logs`` (the run's
    log folder), a local cluster's ps task found by its log (forked tasks included:
    :func:`kerasdist._task_logs.local_task`); read from ``/proc/<pid>/status``
    (``VmHWM``, Linux). Tasks elsewhere are left out; empty off Linux."""
    import json
    import os

    import psutil

    from kerasdist._task_logs import local_task

    logs = Path(os.path.realpath(logs)) if logs is not None else None
    found: dict[int, int] = {}
    for process in psutil.process_iter(["pid"]):
        try:
            index = None
            local = local_task(process.pid) if logs is not None else None
            if local is not None and local[0] == logs and local[1].startswith("ps:"):
                index = int(local[1][3:])
            else:
                config = json.loads(process.environ().get("TF_CONFIG", "") or "{}")
                task = config.get("task", {})
                if task.get("type") == "ps" and config.get("cluster", {}).get("ps") == ps_addresses:
                    index = int(task.get("index", 0))
            if index is None:
                continue
            with open(f"/proc/{process.pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        found[index] = max(found.get(index, 0), int(line.split()[1]) * 1024)
        except (psutil.Error, OSError, ValueError, AttributeError):
            continue
    return found


def describe(placement: list[dict]) -> list[str]:
    """One console line per ps task, e.g. ``ps 0: 9 variable(s), 12.3 MiB, 4 shard(s) of split
    variables (largest sequential/dense/kernel 1/2 [1568, 128])``."""
    lines = []
    for entry in placement:
        line = (f"ps {entry['task']}: {entry['variables']} variable(s), "
                f"{entry['bytes'] / 2**20:.1f} MiB")
        if entry.get("peak_rss_bytes"):
            line += f" (process peak RSS {entry['peak_rss_bytes'] / 2**20:.0f} MiB)"
        if entry["shards"]:
            big = max(entry["shards"], key=lambda s: math.prod(int(n) for n in s["shape"]))
            line += (f", {len(entry['shards'])} shard(s) of split variables (largest "
                     f"{big['path']} {big['shard'] + 1}/{big['of']} {big['shape']})")
        lines.append(line)
    return lines

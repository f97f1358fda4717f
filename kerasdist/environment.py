"""``kerasdist env``: what a bug report needs, and the cluster role this process would take
(docs/launch.md, "Bug reports: kerasdist env").

:func:`collect` returns a JSON-ready mapping: ``versions``; ``environment`` (``KERAS_BACKEND``,
``TF_USE_LEGACY_KERAS``, ``TF_CPP_MIN_LOG_LEVEL``, ``CUDA_VISIBLE_DEVICES``; None when unset);
``devices``; ``mends`` (each :mod:`kerasdist._compat` mend's state: ``active``, ``needed``, ``not
needed`` or ``not applicable``, ``unknown version: <state>`` outside the tested range);
``supported`` and ``warning``; ``cluster``: where a role would come from (``flags``,
``TF_CONFIG``, ``slurm`` or ``none``) and either the validated role or its error.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

ENV_VARS = ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")
_DISTRIBUTIONS = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"),
                  "keras": ("keras",), "tf_keras": ("tf-keras", "tf_keras"), "ray": ("ray",)}


def _version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cluster(flags: dict[str, Any] | None) -> dict[str, Any]:
    from kerasdist.cluster.spec import from_flags, parse_tf_config
    from kerasdist.errors import KerasdistError

    if flags:
        source = "flags"
    elif os.environ.get("TF_CONFIG"):
        source = "TF_CONFIG"
    elif os.environ.get("SLURM_JOB_ID"):
        source = "slurm"
    else:
        return {"source": "none", "role": None,
                "note": "no TF_CONFIG, Slurm job or role flags: one-process strategies only"}
    try:
        if source == "flags":
            spec = from_flags(**flags)
        elif source == "TF_CONFIG":
            spec = parse_tf_config(os.environ["TF_CONFIG"])
        else:
            from kerasdist.launch.clusters.slurm import tf_config_from_slurm

            spec = tf_config_from_slurm(needs_ps=False)
    except KerasdistError as err:
        return {"source": source, "role": None, "error": str(err)}
    jobs = spec.cluster_resolver().cluster_spec().as_dict()
    return {"source": source, "role": spec.task_name, "is_chief": spec.is_chief,
            "tasks": {job: len(tasks) for job, tasks in jobs.items()}}


def collect(*, flags: dict[str, Any] | None = None, devices: bool = True) -> dict[str, Any]:
    """The report (see module docs). Imports TensorFlow when ``devices`` is true.

    Args:
        flags: seed-style role flags (``job_name``, ``task_index``, ``ps_hosts``,
            ``worker_hosts``, ``chief_host``) given on the command line, or None.
        devices: list TensorFlow's physical devices (imports TensorFlow, a few seconds).
    """
    from kerasdist import _compat
    from kerasdist._compat import versions
    from kerasdist._version import __version__

    report: dict[str, Any] = {
        "versions": {"kerasdist": __version__,
                     **{key: _version(names) for key, names in _DISTRIBUTIONS.items()},
                     "python": platform.python_version(),
                     "os": f"{platform.system()} {platform.release()} ({platform.machine()})"},
        "environment": {name: os.environ.get(name) for name in ENV_VARS},
        "devices": None,
        "mends": _compat.status(),
        "supported": dict(versions.SUPPORTED),
        "warning": versions.warning_line(),
        "cluster": _cluster(flags),
    }
    if devices:
        import tensorflow as tf

        report["devices"] = [device.name.replace("/physical_device:", "")
                             for device in tf.config.list_physical_devices()]
    return report


def format_text(report: dict[str, Any]) -> str:
    """The report as aligned ``key  value`` lines, one section per block."""
    lines = []
    if report.get("warning"):
        lines.append(f"warning: {report['warning']}")
    for section in ("versions", "supported", "environment", "mends"):
        lines.append(f"{section}:")
        for key, value in report[section].items():
            lines.append(f"  {key:<30} {'-' if value is None else value}")
    devices = report["devices"]
    lines.append(f"devices:\n  {', '.join(devices) if devices else '-'}")
    lines.append("cluster:")
    for key, value in report["cluster"].items():
        lines.append(f"  {key:<30} {'-' if value is None else value}")
    return "\n".join(lines)


def cluster_ok(report: dict[str, Any]) -> bool:
    """False when a cluster role was given (flags, TF_CONFIG, Slurm) but does not validate."""
    return "error" not in report["cluster"]

"""Registry of the cluster kinds (``cluster.kind``): one module per kind behind one protocol
(:class:`~kerasdist.launch.clusters.base.ClusterKind`), imported on first use; each kind's fields
and traits are on its config class (:mod:`kerasdist.config.cluster_configs`). ``get(kind)`` gives
a kind's object (an unknown kind is a ``ClusterError`` listing the ``available()`` ones);
``register(kind, obj)`` adds one (docs/architecture.md, "Adding a cluster kind").
"""

from __future__ import annotations

from kerasdist._registry import LazyRegistry
from kerasdist.errors import ClusterError

_BUILTIN: dict[str, str] = {
    "this_process": "kerasdist.launch.clusters.this_process:ThisProcessKind",
    "local": "kerasdist.launch.clusters.local:LocalKind",
    "tf_config": "kerasdist.launch.clusters.tf_config:TFConfigKind",
    "slurm": "kerasdist.launch.clusters.slurm:SlurmKind",
    "jobset": "kerasdist.launch.clusters.jobset:JobSetKind",
    "ray": "kerasdist.launch.clusters.ray:RayKind",
}


def _adopt(kind: str, obj):
    """``obj`` (a ``ClusterKind``, or its class instantiated) as the object of ``kind``."""
    from kerasdist.launch.clusters.base import ClusterKind

    obj = obj() if isinstance(obj, type) else obj
    if not isinstance(obj, ClusterKind):
        raise ClusterError(f"register() takes a kerasdist.launch.clusters.base.ClusterKind. "
                           f"Received: {obj!r} for kind '{kind}'")
    obj.kind = kind
    return obj


_KINDS = LazyRegistry(_BUILTIN, adopt=_adopt, unknown=lambda kind: ClusterError(
    f"cluster.kind: unknown cluster kind '{kind}'; available: {', '.join(available())}. "
    f"Received: kind='{kind}'"))

available, get, register = _KINDS.available, _KINDS.get, _KINDS.register


def of(recipe):
    """The kind object of a recipe's ``cluster.kind``."""
    return get(recipe.cluster.kind)


__all__ = ["available", "get", "of", "register"]

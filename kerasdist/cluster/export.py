"""Export a recipe as a Kubeflow ``TFJob`` manifest (``kerasdist export tfjob recipe.yaml``).

The Kubeflow training operator gives each pod the ``TF_CONFIG`` of its replica, so every pod runs
``kerasdist fit <recipe> --set cluster.kind=tf_config``
(https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/tensorflow/):
``Worker`` x ``cluster.workers`` (worker 0 the chief) under ``multi_worker``; ``Chief``,
``Worker`` x ``cluster.workers`` and ``PS`` x ``cluster.ps`` under ``parameter_server``; with
``--evaluator`` an ``Evaluator`` replica running the sidecar evaluator. ``restartPolicy:
OnFailure`` with ``runPolicy.backoffLimit: cluster.max_restarts``: a restarted pod resumes from
the last checkpoint on the shared run directory (``--pvc``, mounted at :data:`RUNS_MOUNT`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerasdist._version import __version__
from kerasdist.cluster.export_checks import export_kubernetes
from kerasdist.errors import RecipeError

API_VERSION = "kubeflow.org/v1"
DEFAULT_IMAGE = f"kerasdist:{__version__}"
"""The image ``export tfjob`` names unless ``--image`` is given: the tag the README's
``docker build -t kerasdist:<version> .`` of the repository's ``Dockerfile`` gives."""
IMAGE_UID = 1000
"""The non-root uid (and gid) of the ``Dockerfile``'s ``kerasdist`` user; every pod runs as it,
with ``fsGroup`` set to it so a mounted run-directory volume is writable."""
RUNS_MOUNT = "/kerasdist-runs"
CONTAINER_NAME = "tensorflow"  # the name the TFJob operator expects for the training container


@dataclass(frozen=True)
class PodResources:
    """Per-pod resources (Kubernetes quantities): requests = limits.

    Attributes:
        cpu: CPU cores, e.g. ``"2"`` or ``"500m"``.
        memory: e.g. ``"4Gi"``.
        gpus: ``nvidia.com/gpu`` per pod; 0 = none.
    """

    cpu: str = "2"
    memory: str = "4Gi"
    gpus: int = 0

    def as_dict(self) -> dict[str, Any]:
        limits: dict[str, Any] = {"cpu": self.cpu, "memory": self.memory}
        if self.gpus:
            limits["nvidia.com/gpu"] = self.gpus
        return {"requests": dict(limits), "limits": limits}


def job_name(recipe_path: str | Path) -> str:
    """A DNS-1123 name from the recipe file name (``mnist_cnn_mwms.yaml`` -> ``mnist-cnn-mwms``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", Path(recipe_path).stem.lower()).strip("-")
    return (name or "kerasdist")[:63].rstrip("-")


def replica_counts(recipe) -> dict[str, int]:
    """TFJob replica type -> replicas for the recipe's strategy.

    Raises:
        RecipeError: a strategy that runs in one process (nothing to distribute).
    """
    kind, cluster, topology = recipe.strategy.kind, recipe.cluster, recipe.strategy.traits.topology
    if topology == "peers":
        return {"Worker": cluster.workers}
    if topology == "coordinator":
        return {"Chief": 1, "Worker": cluster.workers, "PS": max(cluster.ps, 1)}
    raise RecipeError(f"strategy.kind '{kind}' runs in one process; a TFJob needs 'multi_worker' "
                      f"or 'parameter_server'. Received: kind='{kind}'")


def _pod_template(*, image: str, command: list[str], resources: PodResources,
                  pvc: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": image, "command": command,
                                 "resources": resources.as_dict(),
                                 "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}]}
    spec: dict[str, Any] = {"containers": [container],
                            "securityContext": {"runAsNonRoot": True, "runAsUser": IMAGE_UID,
                                                "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID}}
    if pvc:
        container["volumeMounts"] = [{"name": "runs", "mountPath": RUNS_MOUNT}]
        spec["volumes"] = [{"name": "runs", "persistentVolumeClaim": {"claimName": pvc}}]
    return {"spec": spec}


def tfjob_manifest(recipe, *, recipe_path: str, image: str, name: str | None = None,
                   namespace: str | None = None, resources: PodResources = PodResources(),
                   pvc: str | None = None, overrides: tuple[str, ...] = (),
                   evaluator: bool = False) -> dict[str, Any]:
    """Build the TFJob manifest (a plain dict) for a validated recipe.

    Args:
        recipe: the validated recipe (strategy ``multi_worker`` or ``parameter_server``).
        recipe_path: the recipe's path *inside the image* (the pods run ``kerasdist fit`` on it).
        image: container image with kerasdist installed (:data:`DEFAULT_IMAGE` on the CLI); its
            user must be uid :data:`IMAGE_UID` (pods run as it, not as root).
        name: TFJob name; default from the recipe file name.
        namespace: Kubernetes namespace; omitted when None.
        resources: per-pod CPU, memory and GPUs.
        pvc: PersistentVolumeClaim for the run directory (checkpoints shared by all pods).
        overrides: extra ``--set`` overrides passed to every pod.
        evaluator: add one ``Evaluator`` replica (the sidecar evaluator; needs ``pvc``).

    Returns:
        ``{"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": ..., "spec": ...}``.

    Raises:
        RecipeError: a one-process strategy, an empty image name, an evaluator without a
            shared run directory, or an option Kubernetes would refuse
            (:func:`kerasdist.cluster.export_checks.export_kubernetes`).
    """
    if not image:
        raise RecipeError("export tfjob: --image must name a container image. Received: ''")
    if evaluator and not pvc:
        raise RecipeError("export tfjob --evaluator: the evaluator reads the checkpoints the chief "
                          "writes, so the run directory must be shared: give --pvc. "
                          "Received: pvc=None")
    name = name or job_name(recipe_path)
    export_kubernetes("export tfjob", name=name, namespace=namespace, image=image, pvc=pvc,
                      resources=resources, recipe_path=str(recipe_path))
    command = ["kerasdist", "fit", str(recipe_path), "--set", "cluster.kind=tf_config"]
    for item in overrides:
        command += ["--set", item]
    if pvc:
        command += ["--set", f"output.run_dir={RUNS_MOUNT}/{name}"]
    template = _pod_template(image=image, command=command, resources=resources, pvc=pvc)
    replicas = {role: {"replicas": count, "restartPolicy": "OnFailure",
                       "template": copy.deepcopy(template)}
                for role, count in {**replica_counts(recipe),
                                    **({"Evaluator": 1} if evaluator else {})}.items()}
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/created-by": "kerasdist"}}
    if namespace:
        metadata["namespace"] = namespace
    run_policy = {"cleanPodPolicy": "Running", "backoffLimit": recipe.cluster.max_restarts}
    return {"apiVersion": API_VERSION, "kind": "TFJob", "metadata": metadata,
            "spec": {"runPolicy": run_policy, "tfReplicaSpecs": replicas}}


def dump_manifest(manifest: dict[str, Any]) -> str:
    """YAML text of a manifest (PyYAML, keys in insertion order)."""
    import yaml

    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)

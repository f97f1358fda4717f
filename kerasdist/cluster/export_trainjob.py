"""Export a recipe for Kubeflow Trainer v2 (``kerasdist export trainjob recipe.yaml``): a
namespaced ``TrainingRuntime`` (no framework's ML policy; the JobSet template of
:mod:`kerasdist.cluster.export_jobset` with every task in the one replicated job ``node``) and a
``TrainJob`` naming it. Every pod runs ``kerasdist fit <recipe> --set cluster.kind=jobset``; its
role comes from its rank in ``node`` (rank 0 the chief, then the ps, then the workers;
:func:`kerasdist.cluster.roles.rank_roles`). Each field and why: docs/kubernetes.md.
"""

from __future__ import annotations

import copy
from typing import Any

from kerasdist.cluster.export import PodResources, job_name
from kerasdist.cluster.export_checks import export_kubernetes
from kerasdist.cluster.export_jobset import (
    check_names,
    metadata,
    pod_environments,
    pod_failure_policy,
    pod_template_spec,
    restart_policy,
)
from kerasdist.cluster.roles import recipe_counts

API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINER_NODE = "node"
"""The replicated job of Kubeflow Trainer v2's trainer (its ``numNodes`` pods): roles by rank."""
ANCESTOR_LABEL = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
"""The label by which Trainer v2 finds the replicated job its ``spec.trainer`` fills in."""
_DEFAULT_RESOURCES = PodResources()


def trainjob_manifests(recipe, *, recipe_path: str, image: str, name: str | None = None,
                       namespace: str | None = None,
                       resources: PodResources = _DEFAULT_RESOURCES, pvc: str | None = None,
                       overrides: tuple[str, ...] = (), queue: str | None = None
                       ) -> list[dict[str, Any]]:
    """The ``TrainingRuntime`` and the ``TrainJob`` (plain dicts) of a validated recipe (see
    module docs).

    Args:
        recipe: the validated recipe (``multi_worker`` or ``parameter_server``).
        recipe_path: the recipe's path inside the image.
        image: container image with kerasdist.
        name: the TrainJob's name (its pods' host names start with it; the runtime is
            ``<name>-runtime``); default from the recipe file name.
        namespace: Kubernetes namespace of both; omitted when None.
        resources: per-pod CPU, memory and GPUs (``resourcesPerNode``).
        pvc: PersistentVolumeClaim for the run directory (shared checkpoints).
        overrides: extra ``--set`` overrides passed to every pod.
        queue: Kueue's LocalQueue, a label of the TrainJob; None: no label.

    Returns:
        ``[TrainingRuntime, TrainJob]``.

    Raises:
        RecipeError: a one-process strategy, ``cluster.ps`` 0 under ``parameter_server``, an
            empty image, a name too long for the pods' host names, or an option Kubernetes or
            Kueue would refuse.
    """
    counts = recipe_counts(recipe, what="export trainjob")
    tasks = sum(counts.values())
    name = name or job_name(recipe_path)
    export_kubernetes("export trainjob", name=name, namespace=namespace, image=image, pvc=pvc,
                      resources=resources, recipe_path=str(recipe_path), queue=queue)
    check_names(image=image, name=name, hosts=[f"{name}-{TRAINER_NODE}-0-{tasks - 1}"],
           what="export trainjob", pattern=f"<name>-{TRAINER_NODE}-0-<rank>")
    pod_spec = pod_template_spec(recipe, counts=counts, recipe_path=recipe_path, image=image,
                                 name=name, resources=resources, pvc=pvc, overrides=overrides,
                                 container_name=TRAINER_NODE)
    job_spec: dict[str, Any] = {"parallelism": tasks, "completions": tasks,
                                "completionMode": "Indexed", "backoffLimit": 0,
                                "podFailurePolicy": pod_failure_policy(TRAINER_NODE),
                                "template": {"spec": pod_spec}}
    if "chief" in counts:  # the chief's success ends the Job (Kubernetes' Job successPolicy)
        job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    runtime_name = f"{name}-runtime"
    runtime = {"apiVersion": API_VERSION, "kind": "TrainingRuntime",
               "metadata": metadata(runtime_name, namespace),
               "spec": {"mlPolicy": {"numNodes": tasks}, "template": {"spec": {
                   "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                   "failurePolicy": restart_policy(recipe.cluster.max_restarts),
                   "replicatedJobs": [{"name": TRAINER_NODE, "replicas": 1, "template": {
                       "metadata": {"labels": dict(ANCESTOR_LABEL)}, "spec": job_spec}}]}}}}
    (container,) = pod_spec["containers"]
    trainer = {"image": image, "command": list(container["command"]), "numNodes": tasks,
               "resourcesPerNode": copy.deepcopy(container["resources"])}
    trainjob = {"apiVersion": API_VERSION, "kind": "TrainJob",
                "metadata": metadata(name, namespace, queue),
                "spec": {"runtimeRef": {"name": runtime_name, "kind": "TrainingRuntime",
                                        "apiGroup": API_VERSION.split("/")[0]},
                         "trainer": trainer}}
    return [runtime, trainjob]


def trainjob_pod_environments(runtime: dict[str, Any],
                              trainjob: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``{'node:<rank>': environment}`` of every pod Trainer v2 would start for ``trainjob`` on
    ``runtime`` (the JobSet is named as the TrainJob; ``numNodes`` pods); for tests and dry
    runs."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    nodes = trainjob["spec"]["trainer"]["numNodes"]
    for job in spec["replicatedJobs"]:
        if job["name"] == TRAINER_NODE:
            job["template"]["spec"].update(parallelism=nodes, completions=nodes)
    return pod_environments({"metadata": {"name": trainjob["metadata"]["name"]}, "spec": spec})


__all__ = ["ANCESTOR_LABEL", "API_VERSION", "trainjob_manifests", "trainjob_pod_environments"]

"""Export a recipe as a Kubernetes JobSet (``kerasdist export jobset recipe.yaml``).

JobSet (https://jobset.sigs.k8s.io, ``jobset.x-k8s.io/v1alpha2``) is what Kubeflow Trainer v2
builds on; unlike the TFJob operator it sets no ``TF_CONFIG``: every pod runs ``kerasdist fit
<recipe> --set cluster.kind=jobset`` and derives its role from JobSet's environment and DNS names
(:mod:`kerasdist.launch.clusters.jobset`). The manifest:

* one replicated job per task type, named as the type (``chief`` x 1 and ``ps`` x ``cluster.ps``
  under ``parameter_server``; ``worker`` x ``cluster.workers``), each one Indexed Job
  (``completionMode: Indexed``) with one pod per task: the pod's ``JOB_COMPLETION_INDEX`` is its
  task index;
* ``network.enableDNSHostnames`` with ``publishNotReadyAddresses`` (the headless service JobSet
  creates answers for pods still starting: TF's servers connect before they are ready);
* ``JOBSET_NAME`` and ``REPLICATED_JOB_NAME`` from the pod's JobSet annotations (downward API);
* ``successPolicy``: the JobSet succeeds when the ``chief`` (parameter server: the coordinator) or
  every ``worker`` (multi-worker) completes; JobSet then deletes the pods still running (the ps
  and worker servers of a parameter-server run, which serve until stopped);
* ``failurePolicy.maxRestarts: cluster.max_restarts``, ``backoffLimit: 0``, ``restartPolicy:
  Never``: a failed pod fails its Job and JobSet recreates every Job, which resume from the last
  checkpoint on the shared run directory (``--pvc``);
* the pods run as the image's uid 1000 (``Dockerfile``), as the TFJob export's do.
"""

from __future__ import annotations

import copy
from typing import Any

from kerasdist.cluster.export import IMAGE_UID, RUNS_MOUNT, PodResources, job_name
from kerasdist.cluster.export_checks import export_kubernetes
from kerasdist.cluster.roles import recipe_counts
from kerasdist.config.cluster_configs import as_kind
from kerasdist.errors import RecipeError

API_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTAINER_NAME = "kerasdist"
ANNOTATIONS = {"JOBSET_NAME": "jobset.sigs.k8s.io/jobset-name",
               "REPLICATED_JOB_NAME": "jobset.sigs.k8s.io/replicatedjob-name"}
"""Environment variable -> the pod annotation JobSet sets, read through the downward API."""
_DEFAULT_RESOURCES = PodResources()


def _container(*, image: str, command: list[str], resources: PodResources, port: int,
               pvc: str | None) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": name, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{annotation}']"}}}
            for name, annotation in ANNOTATIONS.items()]
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": image, "command": command,
                                 "env": env, "ports": [{"name": "tf-grpc", "containerPort": port,
                                           "protocol": "TCP"}],
                                 "resources": resources.as_dict()}
    if pvc:
        container["volumeMounts"] = [{"name": "runs", "mountPath": RUNS_MOUNT}]
    return container


def check_names(*, image: str, name: str, hosts: list[str], what: str, pattern: str) -> None:
    """Refuse (:class:`RecipeError`, starting with ``what``) an empty image or a pod host name
    (``hosts``, of form ``pattern``) longer than a DNS label's 63 characters."""
    if not image:
        raise RecipeError(f"{what}: --image must name a container image. Received: ''")
    longest = max(len(host) for host in hosts)
    if longest > 63:
        raise RecipeError(f"{what}: the pods' host names '{pattern}' must be at most 63 "
                          f"characters; give a shorter --name. Received: name={name!r} "
                          f"({longest} characters)")


def pod_template_spec(recipe, *, counts: dict[str, int], recipe_path: str, image: str, name: str,
                      resources: PodResources, pvc: str | None, overrides: tuple[str, ...],
                      container_name: str = CONTAINER_NAME) -> dict[str, Any]:
    """The pod spec every task's pod runs: ``kerasdist fit <recipe> --set cluster.kind=jobset``
    with the recipe's counts, the JobSet environment (:data:`ANNOTATIONS`), uid
    :data:`IMAGE_UID`, the run directory on ``pvc`` (when given)."""
    cluster = as_kind(recipe.cluster, "jobset")
    command = ["kerasdist", "fit", str(recipe_path), "--set", "cluster.kind=jobset",
               "--set", f"cluster.workers={cluster.workers}"]
    if "ps" in counts:
        command += ["--set", f"cluster.ps={cluster.ps}"]
    for item in overrides:
        command += ["--set", item]
    if pvc:
        command += ["--set", f"output.run_dir={RUNS_MOUNT}/{name}"]
    container = _container(image=image, command=command, resources=resources,
                           port=cluster.port_base, pvc=pvc)
    container["name"] = container_name
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "containers": [container],
        "securityContext": {"runAsNonRoot": True, "runAsUser": IMAGE_UID,
                            "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID}}
    if pvc:
        pod_spec["volumes"] = [{"name": "runs", "persistentVolumeClaim": {"claimName": pvc}}]
    return pod_spec


def jobset_manifest(recipe, *, recipe_path: str, image: str, name: str | None = None,
                    namespace: str | None = None, resources: PodResources = _DEFAULT_RESOURCES,
                    pvc: str | None = None, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Build the JobSet manifest (a plain dict) for a validated recipe (see module docs).

    Args:
        recipe: the validated recipe (``multi_worker`` or ``parameter_server``).
        recipe_path: the recipe's path inside the image.
        image: container image with kerasdist (its user uid :data:`IMAGE_UID`).
        name: the JobSet's name (a DNS-1123 label; its pods' names start with it); default
            from the recipe file name.
        namespace: Kubernetes namespace; omitted when None.
        resources: per-pod CPU, memory and GPUs.
        pvc: PersistentVolumeClaim for the run directory (checkpoints shared by every pod; a
            restarted JobSet resumes from them).
        overrides: extra ``--set`` overrides passed to every pod.

    Returns:
        ``{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", ...}``.

    Raises:
        RecipeError: a one-process strategy, ``cluster.ps`` 0 under ``parameter_server``, an
            empty image, or a name too long for the pods' host names.
    """
    counts = recipe_counts(recipe, what="export jobset")
    name = name or job_name(recipe_path)
    export_kubernetes("export jobset", name=name, namespace=namespace, image=image, pvc=pvc,
                      resources=resources, recipe_path=str(recipe_path))
    check_names(image=image, name=name, hosts=[f"{name}-{job}-0-{n - 1}" for job, n in counts.items()],
           what="export jobset", pattern="<name>-<type>-0-<index>")
    cluster = recipe.cluster
    pod_spec = pod_template_spec(recipe, counts=counts, recipe_path=recipe_path, image=image,
                                 name=name, resources=resources, pvc=pvc, overrides=overrides)
    replicated = [{"name": job, "replicas": 1, "template": {"spec": {
        "parallelism": count, "completions": count, "completionMode": "Indexed",
        "backoffLimit": 0, "template": {"spec": copy.deepcopy(pod_spec)}}}}
        for job, count in counts.items()]
    metadata: dict[str, Any] = {"name": name,
                                "labels": {"app.kubernetes.io/created-by": "kerasdist"}}
    if namespace:
        metadata["namespace"] = namespace
    target = "chief" if "chief" in counts else "worker"
    return {"apiVersion": API_VERSION, "kind": "JobSet", "metadata": metadata,
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": [target]},
                     "failurePolicy": {"maxRestarts": cluster.max_restarts},
                     "replicatedJobs": replicated}}


def pod_environments(manifest: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``{task name: environment}`` of every pod of ``manifest`` as Kubernetes and JobSet would
    set it (the downward-API annotations resolved, ``JOB_COMPLETION_INDEX`` of an Indexed Job);
    for tests and dry runs."""
    name = manifest["metadata"]["name"]
    result = {}
    for job in manifest["spec"]["replicatedJobs"]:
        annotations = {ANNOTATIONS["JOBSET_NAME"]: name,
                       ANNOTATIONS["REPLICATED_JOB_NAME"]: job["name"]}
        (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
        for index in range(job["template"]["spec"]["completions"]):
            env = {"JOB_COMPLETION_INDEX": str(index)}
            for item in container["env"]:
                if "value" in item:
                    env[item["name"]] = item["value"]
                else:
                    path = item["valueFrom"]["fieldRef"]["fieldPath"]
                    env[item["name"]] = annotations[path.split("'")[1]]
            result[f"{job['name']}:{index}"] = env
    return result


__all__ = ["API_VERSION", "ANNOTATIONS", "check_names", "jobset_manifest", "pod_environments",
           "pod_template_spec"]

"""Export a recipe as a Kubernetes JobSet (``kerasdist export jobset recipe.yaml``).

Every pod runs ``kerasdist fit <recipe> --set cluster.kind=jobset`` and derives its role from
JobSet's environment and DNS names (:mod:`kerasdist.launch.clusters.jobset`): one Indexed Job per
task type (its ``JOB_COMPLETION_INDEX`` is the task index), the success and failure policies
(:func:`restart_policy`, :func:`pod_failure_policy`), the set's :func:`network_policy`, and
Kueue's :data:`QUEUE_LABEL` for ``queue``. Each field and why: docs/kubernetes.md.
"""

from __future__ import annotations

import copy
from typing import Any

from kerasdist.cluster.export import IMAGE_UID, RUNS_MOUNT, PodResources, job_name
from kerasdist.cluster.export_checks import export_kubernetes
from kerasdist.cluster.roles import recipe_counts
from kerasdist.config.cluster_configs import as_kind
from kerasdist.errors import EXIT_BAD_INPUT, RecipeError

API_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTAINER_NAME = "kerasdist"
ANNOTATIONS = {"JOBSET_NAME": "jobset.sigs.k8s.io/jobset-name",
               "REPLICATED_JOB_NAME": "jobset.sigs.k8s.io/replicatedjob-name"}
"""Environment variable -> the pod annotation JobSet sets, read through the downward API."""
JOBSET_LABEL = ANNOTATIONS["JOBSET_NAME"]
"""The label JobSet's controller also puts on every pod of a set, valued with the set's name (its
headless service selects the pods by it)."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""Kueue's label naming the LocalQueue a JobSet or TrainJob waits in for admission."""
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


def metadata(name: str, namespace: str | None, queue: str | None = None) -> dict[str, Any]:
    """An object's ``metadata``: its name, the namespace (when given), kerasdist's label and,
    with ``queue``, Kueue's :data:`QUEUE_LABEL`."""
    labels = {"app.kubernetes.io/created-by": "kerasdist", **({QUEUE_LABEL: queue} if queue else {})}
    return {"name": name, **({"namespace": namespace} if namespace else {}), "labels": labels}


def restart_policy(max_restarts: int) -> dict[str, Any]:
    """A JobSet's ``failurePolicy``: up to ``max_restarts`` restarts, each after every old pod is
    gone (``BlockingRecreate``: a new pod never meets an old one under the same DNS name); a Job
    failed by :func:`pod_failure_policy` fails the set on bad input (exit code 2: a restart
    would fail the same way) and restarts it, uncounted, when a pod was evicted or preempted.
    The rules match the Job's failure message, which Kubernetes' Job controller writes as
    ``Container <c> for pod <ns>/<pod> failed with exit code <n> matching FailJob rule at index
    <i>`` or ``Pod <ns>/<pod> has condition <type> matching FailJob rule at index <i>``."""
    def rule(name: str, action: str, pattern: str) -> dict[str, Any]:
        return {"name": name, "action": action, "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [pattern]}

    return {"maxRestarts": max_restarts, "restartStrategy": "BlockingRecreate", "rules": [
        rule("BadInput", "FailJobSet", f"failed with exit code {EXIT_BAD_INPUT} matching FailJob rule"),
        rule("Disrupted", "RestartJobSetAndIgnoreMaxRestarts",
             "has condition DisruptionTarget matching FailJob rule")]}


def pod_failure_policy(container: str) -> dict[str, Any]:
    """A Job's ``podFailurePolicy`` failing the Job by a named rule when ``container`` exits with
    code 2 or the pod was disrupted (``DisruptionTarget``: evicted, preempted): the failures
    :func:`restart_policy` tells apart."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                              "values": [EXIT_BAD_INPUT]}},
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}


def network_policy(*, name: str, namespace: str | None, port: int,
                   any_port: bool = False) -> dict[str, Any]:
    """A NetworkPolicy for the pods of JobSet ``name`` (:data:`JOBSET_LABEL`): connections to them
    are admitted only from the same pods, on the task servers' ``port`` (every port with
    ``any_port``: NCCL between GPU pods uses ports of its own). It restricts ingress only: the
    pods' egress (DNS, each other, downloads, a tracking server) stays as the namespace has it.

    Returns:
        ``{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", ...}`` named ``name``.
    """
    pods = {"matchLabels": {JOBSET_LABEL: name}}
    rule: dict[str, Any] = {"from": [{"podSelector": pods}]}
    if not any_port:
        rule["ports"] = [{"protocol": "TCP", "port": port}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(name, namespace),
            "spec": {"podSelector": copy.deepcopy(pods), "policyTypes": ["Ingress"],
                     "ingress": [rule]}}


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
                    pvc: str | None = None, overrides: tuple[str, ...] = (),
                    queue: str | None = None) -> dict[str, Any]:
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
        queue: Kueue's LocalQueue (:data:`QUEUE_LABEL`); None: no label.

    Returns:
        ``{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", ...}``.

    Raises:
        RecipeError: a one-process strategy, ``cluster.ps`` 0 under ``parameter_server``, an
            empty image, a name too long for the pods' host names, or an option Kubernetes or
            Kueue would refuse (:func:`kerasdist.cluster.export_checks.export_kubernetes`).
    """
    counts = recipe_counts(recipe, what="export jobset")
    name = name or job_name(recipe_path)
    export_kubernetes("export jobset", name=name, namespace=namespace, image=image, pvc=pvc,
                      resources=resources, recipe_path=str(recipe_path), queue=queue)
    check_names(image=image, name=name, hosts=[f"{name}-{job}-0-{n - 1}" for job, n in counts.items()],
           what="export jobset", pattern="<name>-<type>-0-<index>")
    cluster = recipe.cluster
    pod_spec = pod_template_spec(recipe, counts=counts, recipe_path=recipe_path, image=image,
                                 name=name, resources=resources, pvc=pvc, overrides=overrides)
    replicated = [{"name": job, "replicas": 1, "template": {"spec": {
        "parallelism": count, "completions": count, "completionMode": "Indexed",
        "backoffLimit": 0, "podFailurePolicy": pod_failure_policy(CONTAINER_NAME),
        "template": {"spec": copy.deepcopy(pod_spec)}}}}
        for job, count in counts.items()]
    target = "chief" if "chief" in counts else "worker"
    return {"apiVersion": API_VERSION, "kind": "JobSet",
            "metadata": metadata(name, namespace, queue),
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": [target]},
                     "failurePolicy": restart_policy(cluster.max_restarts),
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


__all__ = ["API_VERSION", "ANNOTATIONS", "JOBSET_LABEL", "QUEUE_LABEL", "check_names",
           "jobset_manifest", "metadata", "network_policy", "pod_environments",
           "pod_failure_policy", "pod_template_spec", "restart_policy"]

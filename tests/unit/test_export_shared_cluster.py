"""``export jobset`` and ``export trainjob`` on a shared cluster: the NetworkPolicy of the job's
pods, checked with the official Kubernetes Python client's models (the ``kubernetes`` package,
generated from Kubernetes' OpenAPI: an unknown field or a wrong type is refused); Kueue's queue
label and the refusal of a queue name Kueue would refuse; the restart rules, matched as JobSet
matches them against the failure messages Kubernetes' Job controller writes. JobSet's CRD and
Trainer v2's models check the same manifests' other fields (test_export_jobset.py,
test_export_trainjob.py)."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from kerasdist.cli import main
from kerasdist.cluster.export_jobset import JOBSET_LABEL, QUEUE_LABEL, restart_policy

models = pytest.importorskip("kubernetes.client.models",
                             reason="pip install kubernetes (the test extra)")
RECIPES = {"jobset": "recipes/mnist_cnn_mwms.yaml", "trainjob": "recipes/mnist_cnn_ps.yaml"}


def _export(tmp_path, target: str, *options: str) -> list[dict]:
    out = tmp_path / f"{target}.yaml"
    assert main(["export", target, RECIPES[target], "-o", str(out), "--name", "kd", *options]) == 0
    return list(yaml.safe_load_all(out.read_text()))


def _through_the_model(policy: dict) -> dict:
    """``policy`` through the client's ``V1NetworkPolicy`` (strict: extra fields forbidden,
    strict types) and back as the API's JSON names."""
    return models.V1NetworkPolicy.model_validate(policy).model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("target", ["jobset", "trainjob"])
def test_the_network_policy_admits_only_the_jobs_own_pods_to_the_task_port(tmp_path, target):
    *job, policy = _export(tmp_path, target, "--namespace", "ml")
    assert _through_the_model(policy) == policy  # nothing unknown, every type right
    assert (policy["kind"], policy["metadata"]["namespace"]) == ("NetworkPolicy", "ml")
    # JobSet labels every pod with its set's name; Trainer v2 names the set as the TrainJob
    assert job[-1]["metadata"]["name"] == "kd"
    own_pods = {"matchLabels": {JOBSET_LABEL: "kd"}}
    assert policy["spec"] == {"podSelector": own_pods, "policyTypes": ["Ingress"], "ingress": [
        {"from": [{"podSelector": own_pods}], "ports": [{"protocol": "TCP", "port": 8888}]}]}


def test_the_policy_check_can_fail(tmp_path):
    *_, policy = _export(tmp_path, "jobset")
    for edit in (lambda p: p["spec"].update(policytypes=["Ingress"]),
                 lambda p: p["spec"]["ingress"][0]["ports"][0].update(protocol=6),
                 lambda p: p["spec"]["podSelector"].update(matchLabels="kd")):
        bad = copy.deepcopy(policy)
        edit(bad)
        with pytest.raises(ValueError):
            _through_the_model(bad)


def test_no_network_policy_leaves_it_out_and_gpu_pods_admit_their_peers_on_every_port(tmp_path):
    assert [d["kind"] for d in _export(tmp_path, "jobset", "--no-network-policy")] == ["JobSet"]
    assert [d["kind"] for d in _export(tmp_path, "trainjob", "--no-network-policy")] == \
        ["TrainingRuntime", "TrainJob"]
    *_, policy = _export(tmp_path, "jobset", "--gpus", "1")  # NCCL: ports of its own
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {
        "matchLabels": {JOBSET_LABEL: "kd"}}}]}]
    assert _through_the_model(policy) == policy


def test_queue_labels_the_jobset_and_the_trainjob(tmp_path):
    jobset, _ = _export(tmp_path, "jobset", "--queue", "team-a.gpu")
    assert jobset["metadata"]["labels"][QUEUE_LABEL] == "team-a.gpu"
    runtime, trainjob, _ = _export(tmp_path, "trainjob", "--queue", "team-a")
    assert trainjob["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert QUEUE_LABEL not in runtime["metadata"]["labels"]  # Kueue admits the TrainJob
    jobset, _ = _export(tmp_path, "jobset")
    assert QUEUE_LABEL not in jobset["metadata"]["labels"]


@pytest.mark.parametrize("target", ["jobset", "trainjob"])
@pytest.mark.parametrize("queue", ["Team-A", "team_a", "-team", "team.", "a" * 64, "team a"])
def test_a_queue_name_kueue_refuses_is_exit_2_naming_it_and_nothing_is_written(
        tmp_path, capsys, target, queue):
    out = tmp_path / "out.yaml"
    assert main(["export", target, RECIPES[target], "-o", str(out), f"--queue={queue}"]) == 2
    err = capsys.readouterr().err
    assert f"export {target}: --queue must be a DNS-1123 subdomain" in err
    assert f"Received: queue={queue!r}" in err
    assert not out.exists()


def _action(rules: list[dict], reason: str, message: str) -> str:
    """The action JobSet takes for a failed Job (its controller's order: the first rule whose
    reasons and message patterns, searched as Go's regexp.MatchString does, match)."""
    for rule in rules:
        if reason in rule.get("onJobFailureReasons", [reason]) and any(
                re.search(p, message) for p in rule.get("onJobFailureMessagePatterns", [".*"])):
            return rule["action"]
    return "RestartJobSet"


@pytest.mark.parametrize("target, container", [("jobset", "kerasdist"), ("trainjob", "node")])
def test_the_restart_rules_tell_bad_input_from_an_eviction_and_a_crash(tmp_path, target,
                                                                        container):
    """The messages as Kubernetes' Job controller writes them (pod_failure_policy.go)."""
    documents = _export(tmp_path, target, "--no-network-policy")
    spec = documents[0]["spec"] if target == "jobset" else documents[0]["spec"]["template"]["spec"]
    rules = spec["failurePolicy"]["rules"]
    assert spec["failurePolicy"]["restartStrategy"] == "BlockingRecreate"
    for job in spec["replicatedJobs"]:
        job_spec = job["template"]["spec"]
        (pod_container,) = job_spec["template"]["spec"]["containers"]
        assert job_spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] == \
            pod_container["name"] == container
    exit_code = ("PodFailurePolicy", f"Container {container} for pod ml/kd-worker-0-1-x7f2q "
                 "failed with exit code 2 matching FailJob rule at index 0")
    evicted = ("PodFailurePolicy", "Pod ml/kd-worker-0-1-x7f2q has condition DisruptionTarget "
               "matching FailJob rule at index 1")
    assert _action(rules, *exit_code) == "FailJobSet"
    assert _action(rules, *evicted) == "RestartJobSetAndIgnoreMaxRestarts"
    assert _action(rules, "BackoffLimitExceeded", "Job has reached the specified backoff "
                   "limit") == "RestartJobSet"  # exit 1 (a lost peer) or 130: counted restarts
    assert _action(rules, "PodFailurePolicy", exit_code[1].replace("code 2", "code 21")) == \
        "RestartJobSet"
    assert restart_policy(3)["maxRestarts"] == 3

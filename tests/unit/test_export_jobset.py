"""``kerasdist export jobset``: the manifest validates against JobSet's own CRD schema (vendored in
tests/data/jobset, see its README), and ``cluster.kind: jobset`` derives each pod's TF_CONFIG from
the environment and DNS names JobSet gives it. The pods train on simulated hosts in
tests/multiprocess/test_jobset_hosts.py."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import jsonschema
import pytest
import yaml

from kerasdist.cli import build_parser, main
from kerasdist.cluster.export_jobset import jobset_manifest, pod_environments
from kerasdist.config import validate_recipe
from kerasdist.errors import ClusterError, RecipeError
from kerasdist.launch.clusters.jobset import pod_host, tf_config_from_jobset

CRD = Path(__file__).parents[1] / "data" / "jobset" / "jobset.x-k8s.io_jobsets.yaml.gz"


def _strict(node):
    """The CRD's schema as the API server applies it with strict field validation (kubectl's
    default): an object with declared properties refuses unknown fields unless it preserves them;
    an ``int-or-string`` field takes either."""
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string"):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


@pytest.fixture(scope="module")
def validator():
    crd = yaml.safe_load(gzip.open(CRD))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _errors(validator, manifest) -> list[str]:
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(manifest)]


@pytest.mark.parametrize("recipe_file", ["recipes/mnist_cnn_ps.yaml", "recipes/mnist_cnn_mwms.yaml"])
def test_the_exported_manifest_validates_against_jobsets_crd(tmp_path, validator, recipe_file):
    out = tmp_path / "jobset.yaml"
    assert main(["export", "jobset", recipe_file, "-o", str(out), "--pvc", "runs",
                 "--namespace", "ml", "--queue", "team-a"]) == 0
    manifest, policy = yaml.safe_load_all(out.read_text())  # the policy: test_export_shared_cluster
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and manifest["kind"] == "JobSet"
    assert policy["kind"] == "NetworkPolicy"
    assert manifest["spec"]["failurePolicy"]["rules"]  # the restart rules are validated too
    assert _errors(validator, manifest) == []


def test_the_validation_can_fail(validator):
    """The schema check is real: a misspelt field, a wrong type, a value out of its enum."""
    recipe = validate_recipe({"strategy": {"kind": "multi_worker"},
                              "cluster": {"kind": "local", "workers": 2}})
    good = jobset_manifest(recipe, recipe_path="r.yaml", image="kd:1")
    for edit, expected in (
            (lambda m: m["spec"].update(replicatedjobs=[]), "replicatedjobs"),
            (lambda m: m["spec"]["replicatedJobs"][0].update(replicas="two"), "not of type"),
            (lambda m: m["spec"]["successPolicy"].update(operator="Most"), "is not one of"),
            (lambda m: m["spec"]["failurePolicy"]["rules"][0].update(action="Retry"),
             "is not one of"),
            (lambda m: m["spec"]["failurePolicy"].update(restartStrategy="InPlace"),
             "is not one of")):
        bad = copy.deepcopy(good)
        edit(bad)
        assert any(expected in e for e in _errors(validator, bad)), expected


def test_parameter_server_layout_and_policies():
    recipe = validate_recipe({"strategy": {"kind": "parameter_server"},
                              "cluster": {"kind": "jobset", "workers": 3, "ps": 2,
                                          "max_restarts": 4, "port_base": 2222}})
    manifest = jobset_manifest(recipe, recipe_path="/app/ps.yaml", image="kd:2", name="ps-run",
                               overrides=("trainer.epochs=3",))
    spec = manifest["spec"]
    jobs = {j["name"]: j["template"]["spec"] for j in spec["replicatedJobs"]}
    assert {name: job["completions"] for name, job in jobs.items()} == \
        {"chief": 1, "ps": 2, "worker": 3}
    assert all(job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
               for job in jobs.values())
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert spec["failurePolicy"]["maxRestarts"] == 4
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    (container,) = jobs["worker"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "tf-grpc", "containerPort": 2222, "protocol": "TCP"}]
    args = build_parser().parse_args(container["command"][1:])
    assert args.overrides == ["cluster.kind=jobset", "cluster.workers=3", "cluster.ps=2",
                              "trainer.epochs=3"]


def test_every_pod_derives_its_role_and_the_same_cluster():
    recipe = validate_recipe({"strategy": {"kind": "parameter_server"},
                              "cluster": {"kind": "local", "workers": 2, "ps": 1}})
    manifest = jobset_manifest(recipe, recipe_path="r.yaml", image="kd:1", name="kd")
    configs = {task: tf_config_from_jobset(needs_ps=True, workers=2, ps=1, port=8888, environ=env)
               for task, env in pod_environments(manifest).items()}
    assert sorted(configs) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    assert {c.task_name for c in configs.values()} == set(configs)
    (cluster,) = {repr(c.cluster) for c in configs.values()}
    assert configs["worker:1"].cluster["worker"][1] == "kd-worker-0-1.kd:8888"
    assert configs["chief:0"].is_chief and pod_host("kd", "ps", 0, "sub") == "kd-ps-0-0.sub"


@pytest.mark.parametrize("environ, match", [
    ({"JOBSET_NAME": "kd", "REPLICATED_JOB_NAME": "worker"}, "missing JOB_COMPLETION_INDEX"),
    ({"REPLICATED_JOB_NAME": "worker", "JOB_COMPLETION_INDEX": "0"}, "missing JOBSET_NAME"),
    ({"JOBSET_NAME": "kd", "REPLICATED_JOB_NAME": "launcher", "JOB_COMPLETION_INDEX": "0"},
     "Received: 'launcher'"),
    ({"JOBSET_NAME": "kd", "REPLICATED_JOB_NAME": "worker", "JOB_COMPLETION_INDEX": "2"},
     r"within 0..1 .*Received: 2"),
    ({"JOBSET_NAME": "kd", "REPLICATED_JOB_NAME": "worker", "JOB_COMPLETION_INDEX": "x"},
     "Received: 'x'"),
])
def test_a_bad_jobset_environment_is_named(environ, match):
    with pytest.raises(ClusterError, match=match):
        tf_config_from_jobset(needs_ps=False, workers=2, environ=environ)


def test_the_cli_refuses_a_bad_jobset_run_with_exit_2(monkeypatch, capsys):
    for name in ("JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_COMPLETION_INDEX"):
        monkeypatch.delenv(name, raising=False)
    code = main(["fit", "recipes/mnist_cnn_mwms.yaml", "--set", "cluster.kind=jobset"])
    assert code == 2 and "missing JOBSET_NAME" in capsys.readouterr().err


def test_bad_exports_are_refused():
    one = validate_recipe({"strategy": {"kind": "default"}})
    with pytest.raises(RecipeError, match="runs in one process"):
        jobset_manifest(one, recipe_path="r.yaml", image="kd:1")
    mw = validate_recipe({"strategy": {"kind": "multi_worker"},
                          "cluster": {"kind": "local", "workers": 2}})
    with pytest.raises(RecipeError, match="at most 63 characters"):
        jobset_manifest(mw, recipe_path="r.yaml", image="kd:1", name="x" * 60)
    with pytest.raises(RecipeError, match="--image"):
        jobset_manifest(mw, recipe_path="r.yaml", image="")


def test_a_pod_without_the_jobset_variables_or_with_a_bad_index_is_refused_naming_them():
    from kerasdist.errors import ClusterError

    with pytest.raises(ClusterError, match="missing JOBSET_NAME, REPLICATED_JOB_NAME"):
        tf_config_from_jobset(needs_ps=False, workers=2, environ={})
    bad = {"JOBSET_NAME": "j", "REPLICATED_JOB_NAME": "worker", "JOB_COMPLETION_INDEX": "one"}
    with pytest.raises(ClusterError, match="JOB_COMPLETION_INDEX must be an integer. Received: 'one'"):
        tf_config_from_jobset(needs_ps=False, workers=2, environ=bad)

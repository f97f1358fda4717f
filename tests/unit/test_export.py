"""``kerasdist export tfjob``: a Kubeflow TFJob manifest, checked structurally."""

from __future__ import annotations

import pytest
import yaml

from kerasdist.cli import main
from kerasdist.cluster.export import CONTAINER_NAME, job_name, tfjob_manifest
from kerasdist.config import load_recipe, validate_recipe
from kerasdist.errors import RecipeError


def _containers(spec):
    return spec["template"]["spec"]["containers"]


def test_multi_worker_recipe_exports_workers(tmp_path, capsys):
    out = tmp_path / "job.yaml"
    code = main(["export", "tfjob", "recipes/mnist_cnn_mwms.yaml", "--image", "reg.example/kd:1",
                 "-o", str(out), "--cpu", "4", "--memory", "8Gi", "--pvc", "runs"])
    assert code == 0 and "wrote" in capsys.readouterr().out
    job = yaml.safe_load(out.read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    assert job["metadata"]["name"] == "mnist-cnn-mwms"
    recipe = load_recipe("recipes/mnist_cnn_mwms.yaml")
    assert job["spec"]["runPolicy"]["backoffLimit"] == recipe.cluster.max_restarts
    specs = job["spec"]["tfReplicaSpecs"]
    assert list(specs) == ["Worker"] and specs["Worker"]["replicas"] == recipe.cluster.workers
    worker = specs["Worker"]
    assert worker["restartPolicy"] == "OnFailure"
    (container,) = _containers(worker)
    assert container["name"] == CONTAINER_NAME and container["image"] == "reg.example/kd:1"
    command = container["command"]
    assert command[:3] == ["kerasdist", "fit", "recipes/mnist_cnn_mwms.yaml"]
    assert "cluster.kind=tf_config" in command
    assert "output.run_dir=/kerasdist-runs/mnist-cnn-mwms" in command
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert worker["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "runs"
    # The command really parses as a kerasdist fit invocation.
    from kerasdist.cli import build_parser

    args = build_parser().parse_args(command[1:])
    assert args.command == "fit" and "cluster.kind=tf_config" in args.overrides


def test_parameter_server_recipe_exports_chief_workers_and_ps():
    recipe = validate_recipe({"strategy": {"kind": "parameter_server"},
                              "cluster": {"kind": "local", "workers": 3, "ps": 2}})
    job = tfjob_manifest(recipe, recipe_path="/app/ps.yaml", image="kd:2", namespace="ml",
                         overrides=("trainer.epochs=3",))
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
    assert job["metadata"]["namespace"] == "ml"
    for spec in specs.values():
        (container,) = _containers(spec)
        assert container["command"] == ["kerasdist", "fit", "/app/ps.yaml", "--set",
                                        "cluster.kind=tf_config", "--set", "trainer.epochs=3"]
    text = yaml.safe_dump(job)
    assert "&id" not in text  # no YAML anchors: every replica spec is written out


def test_evaluator_replica_runs_the_same_command_on_the_shared_run_dir():
    recipe = validate_recipe({"strategy": {"kind": "parameter_server"},
                              "cluster": {"kind": "local", "workers": 2, "ps": 1}})
    job = tfjob_manifest(recipe, recipe_path="/app/ps.yaml", image="kd:2", pvc="runs",
                         evaluator=True)
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 1,
                                                             "Evaluator": 1}
    (chief,), (evaluator,) = _containers(specs["Chief"]), _containers(specs["Evaluator"])
    assert evaluator["command"] == chief["command"]  # its TF_CONFIG role makes it evaluate
    assert evaluator["volumeMounts"] == chief["volumeMounts"]
    with pytest.raises(RecipeError, match="give --pvc"):
        tfjob_manifest(recipe, recipe_path="/app/ps.yaml", image="kd:2", evaluator=True)


def test_one_process_strategy_is_refused():
    with pytest.raises(RecipeError, match="Received: kind='default'"):
        tfjob_manifest(validate_recipe({}), recipe_path="r.yaml", image="kd")


def test_job_name_is_dns_safe():
    assert job_name("recipes/My_Recipe.v2.yaml") == "my-recipe-v2"

"""Recipe validation: every bad input names its field and what was received."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerasdist.config import (
    Recipe,
    apply_overrides,
    dump_recipe,
    json_schema,
    load_recipe,
    validate_recipe,
)
from kerasdist.errors import RecipeError

GOOD = """
model: {name: mnist_cnn, params: {dropout: 0.25}}
data: {batch_size: 32}
trainer: {epochs: 2}
"""


def test_good_recipe_fills_defaults(write_recipe):
    recipe = load_recipe(write_recipe(GOOD))
    assert recipe.model.params == {"dropout": 0.25}
    assert recipe.data.batch_size == 32
    assert recipe.data.source == "embedded"
    assert recipe.strategy.kind == "default"


def test_recipe_is_frozen(write_recipe):
    recipe = load_recipe(write_recipe(GOOD))
    with pytest.raises(Exception, match="frozen"):
        recipe.data.batch_size = 7


def test_every_shipped_recipe_validates():
    from pathlib import Path

    recipes = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))
    assert len(recipes) >= 2
    for path in recipes:
        assert isinstance(load_recipe(path), Recipe)


def test_malformed_yaml_reports_file_line_column(write_recipe):
    path = write_recipe("model:\n  name: [mnist_cnn\ndata: {}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert f"{path}:3:" in str(err.value) and "malformed YAML" in str(err.value)


def test_unknown_key_reports_dotted_path_and_line(write_recipe):
    path = write_recipe("data:\n  batch_size: 32\n  batchsize: 64\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "data.batchsize: unknown key" in str(err.value)
    assert f"{path}:3:3" in str(err.value)


@pytest.mark.parametrize("text, needle", [
    ("data: {batch_size: 0}", "data.batch_size"),
    ("data: {batch_size: -4}", "Received: -4"),
    ("trainer: {epochs: 0}", "trainer.epochs"),
    ("optimizer: {learning_rate: 0}", "optimizer.learning_rate"),
    ("optimizer: {learning_rate: -0.1}", "Received: -0.1"),
    ("data: {batch_size: many}", "Received: 'many'"),
    ("trainer: {epochs: [1]}", "trainer.epochs"),
])
def test_out_of_range_and_wrong_type(write_recipe, text, needle):
    with pytest.raises(RecipeError, match="invalid recipe") as err:
        load_recipe(write_recipe(text))
    assert needle in str(err.value)


def test_unknown_strategy_lists_available(write_recipe):
    with pytest.raises(RecipeError) as err:
        load_recipe(write_recipe("strategy: {kind: horovod}"))
    message = str(err.value)
    assert "strategy.kind" in message and "'horovod'" in message
    assert "'mirrored'" in message and "'parameter_server'" in message


def test_unknown_model_lists_available(write_recipe):
    with pytest.raises(RecipeError) as err:
        load_recipe(write_recipe("model: {name: resnet}"))
    assert "unknown model 'resnet'" in str(err.value)
    assert "mnist_cnn" in str(err.value) and "linear" in str(err.value)


def test_unknown_model_param_is_named(write_recipe):
    with pytest.raises(RecipeError, match=r"model\.params\.dropuot"):
        load_recipe(write_recipe("model: {name: mnist_cnn, params: {dropuot: 0.5}}"))


def test_unknown_data_source(write_recipe):
    with pytest.raises(RecipeError, match=r"data\.source.*'mnist_csv'"):
        load_recipe(write_recipe("data: {source: mnist_csv}"))


@pytest.mark.parametrize("source", ["idx", "npz", "tfrecord"])
def test_file_sources_need_an_existing_path(write_recipe, tmp_path, source):
    with pytest.raises(RecipeError, match="data.source.path is required"):
        load_recipe(write_recipe(f"data: {{source: {source}}}"))
    missing = tmp_path / "nowhere"
    with pytest.raises(RecipeError, match=f"data.source.path does not exist.*{missing}"):
        load_recipe(write_recipe(f"data: {{source: {{kind: {source}, path: '{missing}'}}}}"))


def test_custom_builder_by_import_path(write_recipe):
    text = "model: {name: 'kerasdist.models.seed:linear', loss: mse, params: {units: 1}}"
    assert load_recipe(write_recipe(text)).model.name == "kerasdist.models.seed:linear"
    with pytest.raises(RecipeError, match="model.loss is required"):
        load_recipe(write_recipe("model: {name: 'kerasdist.models.seed:linear'}"))
    with pytest.raises(RecipeError, match="cannot import module 'no_such_pkg.models'"):
        load_recipe(write_recipe("model: {name: 'no_such_pkg.models:build', loss: mse}"))


def test_overrides_apply_and_are_validated(write_recipe):
    path = write_recipe(GOOD)
    recipe = load_recipe(path, ["trainer.epochs=3", "data.eval_split=null", "model.params={}"])
    assert recipe.trainer.epochs == 3 and recipe.data.eval_split is None
    assert recipe.model.params == {}
    with pytest.raises(RecipeError, match="trainer.epochs"):
        load_recipe(path, ["trainer.epochs=0"])
    with pytest.raises(RecipeError, match="trainer.epohcs: unknown key"):
        load_recipe(path, ["trainer.epohcs=3"])
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        load_recipe(path, ["trainer.epochs"])


def test_override_into_scalar_is_refused():
    with pytest.raises(RecipeError, match="'data.batch_size' is not a section"):
        apply_overrides({"data": {"batch_size": 3}}, ["data.batch_size.x=1"])


def test_cluster_must_fit_strategy():
    with pytest.raises(RecipeError, match="cluster.ps must be >= 1"):
        validate_recipe({"strategy": {"kind": "parameter_server"},
                         "cluster": {"kind": "local", "workers": 2, "ps": 0}})
    with pytest.raises(RecipeError, match="needs cluster.kind"):
        validate_recipe({"strategy": {"kind": "multi_worker"}})
    with pytest.raises(RecipeError, match="logical_cpus"):
        validate_recipe({"strategy": {"kind": "mirrored", "devices": ["/cpu:0"],
                                      "logical_cpus": 2}})


def test_dump_round_trips_and_schema_lists_sections():
    recipe = validate_recipe({"trainer": {"epochs": 2}})
    import yaml

    assert validate_recipe(yaml.safe_load(dump_recipe(recipe))) == recipe
    schema = json_schema()
    assert set(schema["properties"]) == {"model", "data", "optimizer", "strategy", "cluster",
                                         "trainer", "output", "callbacks"}
    json.dumps(schema)


def test_json_schema_accepts_every_shipped_recipe_and_each_kinds_own_strategy_fields():
    """Editors validate recipes with `kerasdist schema`: before, `strategy` listed only `kind`
    (with no other key allowed), so every shipped recipe with a strategy field was flagged."""
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    validator = jsonschema.Draft202012Validator(json_schema())
    for path in sorted(Path(__file__).resolve().parents[2].glob("recipes/*.yaml")):
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path.name}: {errors}"

    def ok(strategy):
        return validator.is_valid({"strategy": strategy})

    assert ok({"kind": "mirrored", "logical_cpus": 2}) and ok({}) and ok({"device": "/cpu:0"})
    assert not ok({"kind": "default", "logical_cpus": 2})  # a field of another kind
    assert not ok({"logical_cpus": 2})                       # kind left out: the default kind
    assert not ok({"kind": "mirrored", "typo": 1}) and not ok({"kind": "nope"})


def _cluster(strategy: str, **cluster) -> Recipe:
    return validate_recipe({"strategy": {"kind": strategy}, "cluster": cluster})


def test_threads_per_task_auto_divides_the_cores_among_the_tasks_of_a_local_cluster():
    # 2 workers on 2 cores: 1 each; PS adds the ps tasks and the coordinator.
    assert _cluster("multi_worker", kind="local", workers=2).intra_op_threads(cores=2) == 1
    assert _cluster("multi_worker", kind="local", workers=2).intra_op_threads(cores=16) == 8
    ps = _cluster("parameter_server", kind="local", workers=2, ps=1)
    assert ps.intra_op_threads(cores=16) == 16 // 4 and ps.intra_op_threads(cores=2) == 1
    # One task, or tasks on other machines: TensorFlow's default (0).
    assert _cluster("multi_worker", kind="local", workers=1).intra_op_threads(cores=2) == 0
    assert _cluster("multi_worker", kind="tf_config").intra_op_threads(cores=2) == 0
    assert _cluster("default").intra_op_threads(cores=2) == 0
    assert _cluster("multi_worker", kind="ray", workers=2).intra_op_threads(cores=4) == 2
    assert _cluster("multi_worker", kind="ray", workers=2,
                    address="10.0.0.1:6379").intra_op_threads(cores=4) == 0
    # An explicit number is kept as given.
    assert _cluster("multi_worker", kind="local", workers=2,
                    threads_per_task=3).intra_op_threads(cores=2) == 3


@pytest.mark.parametrize("value", [-1, "many", 1.5])
def test_threads_per_task_refuses_other_values(value):
    with pytest.raises(RecipeError, match="cluster.threads_per_task"):
        _cluster("multi_worker", kind="local", workers=2, threads_per_task=value)


def test_local_tasks_receive_the_resolved_threads(tmp_path):
    from kerasdist.launch.peers import task_recipe

    recipe = validate_recipe({"strategy": {"kind": "multi_worker"},
                              "cluster": {"kind": "local", "workers": 2},
                              "output": {"run_dir": str(tmp_path / "run")}})
    (tmp_path / "run" / "logs").mkdir(parents=True)
    args = task_recipe(recipe, 2)
    task = json.loads(Path(args[1]).read_text())
    assert task["cluster"]["kind"] == "tf_config"
    assert task["cluster"]["threads_per_task"] == recipe.intra_op_threads() >= 1
    assert task["cluster"]["workers"] == 2


def test_min_workers_is_checked_against_workers_and_cluster_kind():
    assert _cluster("multi_worker", kind="local", workers=3, min_workers=2).cluster.min_workers == 2
    with pytest.raises(RecipeError, match=r"cluster.min_workers must be <= cluster.workers. "
                                          r"Received: min_workers=4, workers=3"):
        _cluster("multi_worker", kind="local", workers=3, min_workers=4)
    with pytest.raises(RecipeError, match=r"cluster.min_workers is not a field of cluster.kind "
                                          r"'tf_config'; it belongs to 'local', 'ray'. Received: "
                                          r"kind='tf_config', min_workers=1"):
        _cluster("multi_worker", kind="tf_config", workers=2, min_workers=1)
    with pytest.raises(RecipeError, match="min_workers"):
        _cluster("multi_worker", kind="local", workers=2, min_workers=0)
    assert _cluster("parameter_server", kind="local", workers=3, ps=1,
                    min_workers=2).cluster.min_workers == 2  # the coordinator runs as chief:0
    with pytest.raises(RecipeError, match=r"cluster.min_workers must be <= cluster.workers. "
                                          r"Received: min_workers=4, workers=3"):
        _cluster("parameter_server", kind="local", workers=3, ps=1, min_workers=4)


def test_an_elastic_parameter_server_recipe_runs_its_coordinator_as_chief_0(tmp_path):
    """cluster.min_workers below cluster.workers: every attempt's plan has ps, worker servers and
    the coordinator as member task chief:0 (--overwrite on the first attempt only); without it
    the plan is the servers alone (the coordinator runs in the launching process)."""
    from kerasdist.launch.coordinator import elastic, launch_spec

    def recipe_of(**cluster):
        return validate_recipe({"strategy": {"kind": "parameter_server"},
                                "cluster": {"kind": "local", "workers": 3, "ps": 1, **cluster},
                                "output": {"run_dir": str(tmp_path / "run")}})

    recipe = recipe_of(min_workers=2)
    spec = launch_spec(recipe, overwrite=True)
    assert elastic(recipe) and (spec.workers, spec.fewest) == (3, 2)
    first, shrunk = spec.plan(3, 1), spec.plan(2, 2)
    assert [(p.name, p.server) for p in first] == [("ps:0", True), ("worker:0", True),
                                                   ("worker:1", True), ("worker:2", True),
                                                   ("chief:0", False)]
    assert first[-1].argv[-1] == "--overwrite" and "--overwrite" not in shrunk[-1].argv
    assert [p.name for p in shrunk] == ["ps:0", "worker:0", "worker:1", "chief:0"]
    assert len(shrunk[-1].tf_config.cluster["worker"]) == 2
    fixed = recipe_of()
    assert not elastic(fixed)
    assert [p.name for p in launch_spec(fixed).plan(3, 1)] == ["ps:0", "worker:0", "worker:1",
                                                               "worker:2"]


def test_a_shrunk_cluster_keeps_the_global_batch_and_refuses_a_count_it_does_not_divide():
    from kerasdist.errors import TaskFailedError
    from kerasdist.launch.peers import check_workers

    recipe = validate_recipe({"strategy": {"kind": "multi_worker"}, "data": {"batch_size": 48},
                              "cluster": {"kind": "local", "workers": 4, "min_workers": 2}})
    check = check_workers(recipe)
    for workers in (4, 3, 2):
        check(workers)  # 12, 16, 24 examples per replica
    odd = validate_recipe({"strategy": {"kind": "multi_worker"}, "data": {"batch_size": 40},
                           "cluster": {"kind": "local", "workers": 4, "min_workers": 2}})
    with pytest.raises(TaskFailedError, match=r"cannot go on with 3 workers: data.batch_size=40 "
                                              r"\(the global batch.*cluster.min_workers=2"):
        check_workers(odd)(3)
    accumulating = validate_recipe({
        "strategy": {"kind": "multi_worker"}, "data": {"batch_size": 48},
        "trainer": {"gradient_accumulation_steps": 4},
        "cluster": {"kind": "local", "workers": 3, "min_workers": 2}})
    check_workers(accumulating)(3)  # 16 per replica, 4 micro-batches of 4
    check_workers(accumulating)(2)  # 24 per replica, 4 micro-batches of 6
    with pytest.raises(TaskFailedError, match="of 5 micro-batches"):
        check_workers(validate_recipe({
            "strategy": {"kind": "multi_worker"}, "data": {"batch_size": 45},
            "trainer": {"gradient_accumulation_steps": 5},
            "cluster": {"kind": "local", "workers": 3, "min_workers": 2}}))(2)


def test_validate_prints_only_the_chosen_source_kinds_data_fields(tmp_path):
    """Issue 41, item 1: ``kerasdist validate`` shows the common ``data`` fields and, under
    ``data.source``, the chosen kind's fields only; the printed form validates to the same recipe."""
    import yaml

    from kerasdist.config.data_configs import KIND_FIELDS, DataConfig

    assert not KIND_FIELDS & set(DataConfig.model_fields)  # the kinds' fields left data
    (tmp_path / "t.csv").write_text("a,y\n1,0\n", encoding="utf-8")
    recipe = validate_recipe({"data": {"source": {"kind": "csv", "path": str(tmp_path),
                                                  "label": "y"},
                                       "train_split": "t", "eval_split": None}})
    data = yaml.safe_load(dump_recipe(recipe))["data"]
    assert set(data) == set(DataConfig.model_fields)
    assert set(data["source"]) == {"kind", "path", "label", "numeric", "categorical",
                                   "label_dtype"}
    assert validate_recipe({**yaml.safe_load(dump_recipe(recipe))}) == recipe
    embedded = yaml.safe_load(dump_recipe(validate_recipe({})))["data"]
    assert embedded["source"] == {"kind": "embedded"}


def test_a_field_of_another_cluster_kind_is_refused_naming_the_kinds_it_belongs_to():
    for cluster, field, owners in (
            ({"kind": "local", "workers": 2, "port_base": 2222}, "port_base", "'slurm', 'jobset'"),
            ({"kind": "slurm", "min_workers": 1}, "min_workers", "'local', 'ray'"),
            ({"kind": "this_process", "workers": 2}, "workers", "'local', 'tf_config'")):
        with pytest.raises(RecipeError, match=rf"cluster.{field} is not a field of cluster.kind "
                                              rf"'{cluster['kind']}'; it belongs to {owners}"):
            validate_recipe({"strategy": {"kind": "multi_worker" if cluster["kind"] != "this_process"
                                          else "default"}, "cluster": cluster})
    with pytest.raises(RecipeError, match=r"unknown cluster kind 'pbs'. Available: 'jobset', "
                                          r"'local', 'ray', 'slurm', 'tf_config', 'this_process'"):
        validate_recipe({"cluster": {"kind": "pbs"}})


def test_set_cluster_kind_leaves_out_the_fields_the_new_kind_lacks(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("strategy: {kind: parameter_server}\ncluster: {kind: local, workers: 3, ps: 2, "
                    "max_restarts: 1, allow_oversubscription: true, start_timeout_s: 9}\n")
    slurm = load_recipe(path, ["cluster.kind=slurm", "cluster.preemption_signal=term"])
    assert (slurm.cluster.workers, slurm.cluster.ps, slurm.cluster.max_restarts,
            slurm.cluster.preemption_signal) == (3, 2, 1, "TERM")
    assert load_recipe(path, ["cluster.kind=tf_config"]).cluster.traits.roles_from_environment
    with pytest.raises(RecipeError, match="cluster.port_base is not a field of cluster.kind 'local'"):
        load_recipe(path, ["cluster.port_base=2222"])  # given by --set for the file's own kind


def test_each_cluster_kind_declares_its_traits():
    from kerasdist.config.cluster_configs import cluster_config_classes

    traits = {kind: cls.traits for kind, cls in cluster_config_classes().items()}
    assert {k for k, t in traits.items() if t.starts_tasks} == {"local", "ray"}
    assert {k for k, t in traits.items() if t.entry == "task"} == {"tf_config", "slurm", "jobset"}
    assert {k for k, t in traits.items() if t.requeues} == {"slurm"}
    assert {k for k, t in traits.items() if t.elastic} == {"local", "ray"}


@pytest.mark.parametrize("override,field", [("trainer.epochs=true", "epochs"),
                                            ("data.batch_size=false", "batch_size"),
                                            ("optimizer.learning_rate=true", "learning_rate"),
                                            ("trainer.verbose=true", "verbose")])
def test_a_boolean_is_not_taken_as_a_number(override, field):
    with pytest.raises(RecipeError, match=rf"\.{field}: must be a number or text, not a boolean "
                                          rf"\(true/false\). Received: {field}=(true|false)"):
        load_recipe("recipes/mnist_cnn.yaml", [override])
    assert load_recipe("recipes/mnist_cnn.yaml", ["output.tensorboard=false"]).output.tensorboard \
        is False  # a boolean field still takes one

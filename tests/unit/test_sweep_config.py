"""``kerasdist sweep``'s bad input (issue 44): every check exits 2 naming the field and the value,
before any trial starts (no trial folder, no storage written); ``--dry-run`` and ``--status``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.errors import RecipeError
from kerasdist.sweep.plan import load_sweep, machine_cores, schema_problem

pytest.importorskip("optuna")

RECIPE = {
    "model": {"name": "linear"},
    "data": {"source": {"kind": "synthetic_linear", "num_examples": 128}, "train_split": "train",
             "eval_split": "test", "batch_size": 16, "shuffle_seed": 1},
    "optimizer": {"name": "sgd", "learning_rate": 0.05},
    "trainer": {"epochs": 2, "steps_per_epoch": 2},
    "output": {"run_dir": "runs/unused", "tensorboard": False, "save_model": False},
}


def write_sweep(tmp_path: Path, **changes) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    sweep = {"recipe": str(recipe), "set": {"trainer.epochs": 2},
             "space": {"optimizer.learning_rate": {"type": "float", "low": 0.001, "high": 0.1,
                                                   "log": True}},
             "objective": {"metric": "val_loss", "direction": "minimize"},
             "trials": 2, "output": {"dir": str(tmp_path / "out")}}
    for key, value in changes.items():
        if value is None:
            sweep.pop(key, None)
        else:
            sweep[key] = value
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _refused(tmp_path, capsys, needles, *, mode=()) -> str:
    """Run the sweep (not a dry run unless ``mode``): exit 2, nothing written."""
    path = tmp_path / "sweep.yaml"
    assert main(["sweep", str(path), *mode]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    out = tmp_path / "out"
    assert not out.exists() or not list(out.glob("trial-*")), list(out.iterdir())
    return err


BAD = [
    ({"space": {"optimizer.learnin_rate": {"type": "float", "low": 0.1, "high": 1}}},
     ["space.optimizer.learnin_rate", "not in the recipe schema", "learning_rate"]),
    ({"set": {"trainer.epoch": 3}}, ["set.trainer.epoch", "not in the recipe schema"]),
    ({"set": {"trainer.epochs.x": 3}}, ["set.trainer.epochs.x", "is a value, not a section"]),
    ({"space": {"optimizer.learning_rate": {"type": "float", "low": 0.1, "high": 0.1}}},
     ["space.optimizer.learning_rate", "low must be below high", "low=0.1, high=0.1"]),
    ({"space": {"data.batch_size": {"type": "int", "low": 64, "high": 8}}},
     ["space.data.batch_size", "low=64, high=8"]),
    ({"space": {"optimizer.learning_rate": {"type": "float", "low": 0, "high": 1, "log": True}}},
     ["log-scale", "low=0"]),
    ({"objective": {"metric": "val_accuracy", "direction": "maximize"}},
     ["objective.metric 'val_accuracy'", "val_loss"]),
    ({"objective": {"metric": "val_loss", "direction": "up"}}, ["objective.direction"]),
    ({"space": {"data.batch_size": {"type": "categorical", "choices": [16, 0]}}},
     ["space.data.batch_size = 0", "data.batch_size"]),
    ({"space": {"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
      "sampler": {"name": "grid"}}, ["sampler 'grid'", "space.optimizer.learning_rate"]),
    ({"space": {"data.batch_size": {"type": "int", "low": 8, "high": 32, "step": 8}},
      "sampler": {"name": "grid"}, "trials": 5}, ["trials=5", "4 points of the grid"]),
    ({"set": {"optimizer.learning_rate": 0.1}}, ["both fixed (set) and searched (space)"]),
    ({"trials": 0}, ["trials"]),
    ({"sampler": {"name": "bayes"}}, ["sampler.name"]),
    ({"space": {"data.batch_size": {"type": "int", "low": 1, "high": 3, "step": 5}}},
     ["space.data.batch_size: step must not exceed high - low", "low=1, high=3, step=5"]),
    ({"space": {"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.02,
                                            "step": 0.05}}},
     ["space.optimizer.learning_rate: step must not exceed", "step=0.05"]),
    ({"trials": True}, ["sweep.yaml: trials: must be a number or text, not a boolean",
                        "Received: trials=true"]),
    ({"space": {"data.batch_size": {"type": "int", "low": True, "high": 32}}},
     ["sweep.yaml: space.data.batch_size.low: must be a number", "Received: low=true"]),
]


@pytest.mark.parametrize("changes,needles", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_sweeps_exit_2_naming_the_field_before_any_trial(tmp_path, capsys, changes, needles):
    write_sweep(tmp_path, **changes)
    _refused(tmp_path, capsys, needles)
    assert not (tmp_path / "out").exists()  # not even the storage


def test_parallel_past_the_cores_is_refused_unless_allowed(tmp_path, capsys):
    too_many = machine_cores() + 1
    write_sweep(tmp_path, parallel=too_many)
    _refused(tmp_path, capsys, [f"parallel={too_many}", "this machine has"])
    write_sweep(tmp_path, parallel=too_many, allow_oversubscription=True)
    assert main(["sweep", str(tmp_path / "sweep.yaml"), "--dry-run"]) == 0


def test_a_two_worker_trial_takes_two_cores(tmp_path, capsys):
    RECIPE_MW = {**RECIPE, "strategy": {"kind": "multi_worker"},
                 "cluster": {"kind": "local", "workers": 2}}
    path = write_sweep(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(RECIPE_MW))
    assert load_sweep(path).cores_per_trial == 2


def test_one_trial_of_more_tasks_than_cores_runs_alone_but_not_two(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("kerasdist.sweep.plan.machine_cores", lambda: 2)
    ps = {**RECIPE, "strategy": {"kind": "parameter_server"},
          "cluster": {"kind": "local", "workers": 2, "ps": 1}}
    path = write_sweep(tmp_path, parallel=1)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(ps))
    assert load_sweep(path).cores_per_trial == 4  # 2 workers, 1 ps, the coordinator
    path = write_sweep(tmp_path, parallel=2)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(ps))
    assert main(["sweep", str(path), "--dry-run"]) == EXIT_BAD_INPUT
    assert "parallel=2 trials of 4 core(s)" in capsys.readouterr().err


@pytest.mark.parametrize("storage,needle", [
    ("sqlite:////nonexistent-kerasdist/sub/study.db", "does not exist"),
    ("nosuchdb://somewhere/x", "Optuna cannot open"),
])
def test_a_storage_that_cannot_be_opened_exits_2(tmp_path, capsys, storage, needle):
    write_sweep(tmp_path, output={"dir": str(tmp_path / "out"), "storage": storage})
    _refused(tmp_path, capsys, ["output.storage", needle, storage])
    assert not (tmp_path / "out").exists()  # not even the lock of output.dir
    _refused(tmp_path, capsys, ["output.storage", needle, storage], mode=("--dry-run",))


def test_paths_below_free_form_mappings_and_optional_sections_are_accepted(tmp_path):
    recipe = load_sweep(write_sweep(tmp_path)).base
    assert schema_problem(recipe, "model.params.dropout") is None
    assert schema_problem(recipe, "optimizer.params.beta_1") is None
    assert schema_problem(recipe, "output.tracking.uri") is None  # None in the recipe
    assert schema_problem(recipe, "trainer.checkpoint.every_steps") is None
    assert "not in the recipe schema" in schema_problem(recipe, "output.tracking.urls")
    assert "not in the recipe schema" in schema_problem(recipe, "strategy.logical_cpus")


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    write_sweep(tmp_path, space={
        "optimizer.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
        "data.batch_size": {"type": "categorical", "choices": [8, 16]}},
        sampler={"name": "random", "seed": 3}, trials=5, parallel=1)
    assert main(["sweep", str(tmp_path / "sweep.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "valid sweep" in out and "trial-0000" in out and "trial-0002" in out, out
    assert "data.batch_size=" in out and "5 to finish" in out
    assert not (tmp_path / "out").exists()


def test_status_before_any_run_exits_2(tmp_path, capsys):
    write_sweep(tmp_path)
    _refused(tmp_path, capsys, ["no sweep has run yet"], mode=("--status",))


def test_the_trial_recipe_is_the_base_with_set_params_gate_and_its_own_run_dir(tmp_path):
    from kerasdist.config.loader import validate_recipe
    from kerasdist.sweep.study import trial_recipe

    plan = load_sweep(write_sweep(tmp_path, set={"trainer.epochs": 3}))
    raw = trial_recipe(plan, 7, {"optimizer.learning_rate": 0.02})
    recipe = validate_recipe(raw)
    assert recipe.trainer.epochs == 3 and recipe.optimizer.learning_rate == 0.02
    assert recipe.output.run_dir == tmp_path / "out" / "trial-0007" / "run"
    assert recipe.callbacks[-1].class_name == "kerasdist.sweep.gate:SweepPruneGate"
    assert recipe.cluster.threads_per_task >= 1  # 'auto' resolved for the trials sharing cores
    assert RECIPE["optimizer"]["learning_rate"] == 0.05  # the base mapping is not changed


def test_the_shipped_sweep_is_valid(monkeypatch):
    repo = Path(__file__).parents[2]
    monkeypatch.chdir(repo)
    monkeypatch.setattr("kerasdist.sweep.plan.machine_cores", lambda: 2)
    plan = load_sweep("recipes/sweeps/mnist_cnn.yaml")
    assert plan.config.trials == 20 and plan.base.trainer.epochs == 3
    assert set(plan.config.space) == {"optimizer.learning_rate", "model.params.dropout",
                                      "data.batch_size"}
    text = (repo / "docs" / "sweep.md").read_text()
    body = (repo / "recipes" / "sweeps" / "mnist_cnn.yaml").read_text()
    assert body.split("\nrecipe:", 1)[1] in text  # the docs show the file as it is


def test_a_field_of_a_source_given_by_name_alone_can_be_searched(tmp_path):
    from kerasdist.sweep.study import trial_recipe

    path = write_sweep(tmp_path, space={
        "data.source.noise_std": {"type": "float", "low": 0.1, "high": 0.5}})
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(
        {**RECIPE, "data": {**RECIPE["data"], "source": "synthetic_linear"}}))
    plan = load_sweep(path)
    raw = trial_recipe(plan, 0, {"data.source.noise_std": 0.2})
    assert raw["data"]["source"] == {"kind": "synthetic_linear", "noise_std": 0.2}


@pytest.mark.parametrize("where", ["/proc/kerasdist-sweep/out", "a-file/out"])
def test_an_output_dir_that_cannot_be_created_exits_2(tmp_path, capsys, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    write_sweep(tmp_path, output={"dir": where})
    for mode in (("--dry-run",), ()):
        _refused(tmp_path, capsys, ["output.dir: cannot create or write", where], mode=mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "recipe.yaml", "sweep.yaml"]


def _made_by(path: Path) -> Path:
    """A study made by the sweep at ``path`` (as its first run makes it); its storage file."""
    from kerasdist.sweep.storage import open_study

    open_study(load_sweep(path))
    return path.parent / "out" / "study.db"


def test_dry_run_refuses_what_the_run_refuses_and_writes_nothing(tmp_path, capsys):
    # a changed space on an existing study
    db = _made_by(write_sweep(tmp_path))
    before = db.read_bytes(), db.stat().st_mtime_ns
    write_sweep(tmp_path, space={"optimizer.learning_rate": {"type": "float", "low": 0.002,
                                                             "high": 0.1, "log": True}})
    needles = ["output.storage: study 'kerasdist-sweep' was made by another sweep", "space"]
    _refused(tmp_path, capsys, needles, mode=("--dry-run",))
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    _refused(tmp_path, capsys, needles)
    # a storage file that is not an Optuna database
    other = tmp_path / "not-a-db.db"
    other.write_text("not a database")
    write_sweep(tmp_path, output={"dir": str(tmp_path / "new"), "storage": f"sqlite:///{other}"})
    for mode in (("--dry-run",), ()):
        assert main(["sweep", str(tmp_path / "sweep.yaml"), *mode]) == EXIT_BAD_INPUT
        assert "output.storage: Optuna cannot open" in capsys.readouterr().err
    assert other.read_text() == "not a database" and not (tmp_path / "new").exists()


def test_an_edited_base_recipe_is_refused_on_a_re_run(tmp_path, capsys):
    path = write_sweep(tmp_path)
    _made_by(path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "trainer": {"epochs": 2, "steps_per_epoch": 3}}))
    needles = ["output.storage", "recipe_sha256 differ", f"the base recipe '{recipe}' was edited"]
    _refused(tmp_path, capsys, needles, mode=("--dry-run",))
    _refused(tmp_path, capsys, needles)
    recipe.write_text("# a comment, another layout\n" + yaml.safe_dump(RECIPE, indent=4))
    assert main(["sweep", str(path), "--dry-run"]) == 0  # the same values


def test_a_driver_mark_counts_while_its_pid_lives_here_or_its_heartbeat_is_fresh(tmp_path):
    import socket
    import subprocess
    import time

    from kerasdist.sweep.storage import DRIVER_ATTR, check_no_other_driver, open_study

    plan = load_sweep(write_sweep(tmp_path))
    study = open_study(plan)
    alive = subprocess.Popen(["sleep", "60"])
    marks = [(alive.pid, socket.gethostname(), 0, True), (1, "elsewhere", 0, True),
             (1, "elsewhere", 600, False)]  # silent for 10 minutes: gone
    try:
        for pid, host, age, refused in marks:
            study.set_user_attr(DRIVER_ATTR, {"pid": pid, "host": host, "dir": "d",
                                              "heartbeat": time.time() - age})
            if refused:
                with pytest.raises(RecipeError, match=f"pid {pid} on {host}"):
                    check_no_other_driver(plan, study)
            else:
                check_no_other_driver(plan, study)
    finally:
        alive.kill()
        alive.wait()
    study.set_user_attr(DRIVER_ATTR, {"pid": alive.pid, "host": socket.gethostname(),
                                      "dir": "d", "heartbeat": time.time()})
    check_no_other_driver(plan, study)  # its pid is gone

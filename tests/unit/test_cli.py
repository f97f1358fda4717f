"""The CLI: commands, exit codes, and that bad input writes nothing and trains nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

LINEAR = """
model: {{name: linear}}
data: {{source: synthetic_linear, train_split: train, eval_split: test, batch_size: 50,
        num_examples: 200}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: 1, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


def test_validate_prints_resolved_recipe(write_recipe, capsys):
    path = write_recipe("trainer: {epochs: 2}")
    assert main(["validate", str(path), "--set", "data.batch_size=16"]) == 0
    out = capsys.readouterr().out
    assert "valid recipe" in out and "batch_size: 16" in out and "epochs: 2" in out


def test_validate_json(write_recipe, capsys):
    assert main(["validate", str(write_recipe("{}")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["batch_size"] == 128


def test_schema_is_json(capsys):
    assert main(["schema"]) == 0
    assert "properties" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("text, needle", [
    ("model: [", "malformed YAML"),
    ("data: {batchsize: 3}", "data.batchsize: unknown key"),
    ("strategy: {kind: nope}", "strategy.kind"),
])
def test_bad_recipes_exit_2_with_message(write_recipe, capsys, tmp_path, text, needle):
    run_dir = tmp_path / "run"
    path = write_recipe(text + f"\noutput: {{run_dir: '{run_dir}'}}\n" if "[" not in text else text)
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not run_dir.exists()


def test_missing_recipe_file(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == EXIT_BAD_INPUT
    assert "cannot read recipe file" in capsys.readouterr().err


def test_missing_data_file_writes_nothing(write_recipe, tmp_path, capsys):
    (tmp_path / "idx").mkdir()
    run_dir = tmp_path / "run"
    path = write_recipe(f"data: {{source: idx, path: '{tmp_path / 'idx'}'}}\n"
                        f"output: {{run_dir: '{run_dir}'}}\n")
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    assert "t10k-images-idx3-ubyte" in capsys.readouterr().err
    assert not run_dir.exists()


def test_batch_not_divisible_by_replicas_writes_nothing(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir) + "strategy: {kind: mirrored, logical_cpus: 2}")
    assert main(["fit", str(path), "--set", "data.batch_size=51"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "divisible by the number of replicas (2)" in err and "batch_size=51" in err
    assert not run_dir.exists()


def test_run_dir_of_another_model_is_refused_unless_overwrite(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir))
    assert main(["fit", str(path)]) == 0
    metrics_before = (run_dir / "metrics.json").read_bytes()
    other = ["--set", "model.params.units=2"]
    assert main(["fit", str(path), *other]) == EXIT_BAD_INPUT
    assert "holds a checkpoint of a different model" in capsys.readouterr().err
    assert (run_dir / "metrics.json").read_bytes() == metrics_before
    assert main(["fit", str(path), *other, "--overwrite"]) == 0
    assert json.loads((run_dir / "run.json").read_text())["fingerprint"]["model"]["params"] == {
        "units": 2}


def test_python_dash_m_entry_point():
    done = subprocess.run([sys.executable, "-m", "kerasdist", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("kerasdist ")

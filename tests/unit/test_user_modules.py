"""Issue 42 item 1: a recipe's import paths resolve like ``python -m``: the working directory and
the recipe file's folder come first, in the CLI and in every task it starts (through the task's
own ``PYTHONPATH``); this process's ``sys.path`` and environment are left as they were; a module
not found is named with where kerasdist looked and how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

pytestmark = pytest.mark.timeout(240)

BUILDER = '''
import keras

def build():
    return keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
'''

RECIPE = """
model: {{name: '{module}:build', loss: mse}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.05}}
trainer: {{epochs: 1, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


def _user_files(folder, module, run_dir):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(BUILDER)
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(module=module, run_dir=run_dir))
    return recipe


def test_a_module_in_the_working_directory_is_found_and_sys_path_is_restored(
        tmp_path, monkeypatch):
    _user_files(tmp_path / "project", "kd42_cwd_models", tmp_path / "run")
    monkeypatch.chdir(tmp_path / "project")
    before = list(sys.path)
    assert main(["validate", "--import", "recipe.yaml"]) == 0
    assert sys.path == before
    assert main(["fit", "recipe.yaml"]) == 0
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert sys.path == before


def test_a_module_beside_the_recipe_is_found_from_another_directory(tmp_path, monkeypatch):
    recipe = _user_files(tmp_path / "project", "kd42_beside_models", tmp_path / "run")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["validate", "--import", str(recipe)]) == 0


def test_a_module_found_nowhere_says_where_it_looked_and_how_to_fix_it(tmp_path, monkeypatch,
                                                                        capsys):
    recipe = _user_files(tmp_path / "project", "kd42_present", tmp_path / "run")
    recipe.write_text(recipe.read_text().replace("kd42_present", "kd42_absent"))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "--import", str(recipe)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "model.name: cannot import module 'kd42_absent': no module 'kd42_absent' in the " \
           "working directory, the recipe's folder, PYTHONPATH or the installed packages" in err
    assert f"looked in {tmp_path}, {tmp_path / 'project'}" in err, err
    assert "add its folder to PYTHONPATH" in err and "Received: name='kd42_absent:build'" in err


def test_a_module_whose_own_import_fails_is_named_as_found(tmp_path, monkeypatch, capsys):
    recipe = _user_files(tmp_path / "project", "kd42_needs_dep", tmp_path / "run")
    (tmp_path / "project" / "kd42_needs_dep.py").write_text("import kd42_no_such_dependency\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "--import", str(recipe)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "module 'kd42_needs_dep' was found, but its own import of " \
           "'kd42_no_such_dependency' failed" in err, err


def test_every_task_started_gets_the_folders_in_its_own_pythonpath_only(tmp_path, monkeypatch):
    from kerasdist.importpath import user_code_on_path
    from kerasdist.launch.processes import LocalLauncher

    recipe = _user_files(tmp_path / "project", "kd42_task_models", tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/opt/theirs")
    printer = [sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"]
    with user_code_on_path(recipe), LocalLauncher(log_dir=tmp_path / "logs") as launcher:
        task = launcher.start_process("worker:0", printer)
        assert task.process.wait(timeout=60) == 0
    assert (tmp_path / "logs" / "worker-0.log").read_text().strip() == os.pathsep.join(
        [str(tmp_path), str(tmp_path / "project"), "/opt/theirs"])
    assert os.environ["PYTHONPATH"] == "/opt/theirs"  # this process's environment untouched


def test_the_console_script_finds_a_module_of_the_working_directory(tmp_path):
    """``kerasdist`` (the console script: ``sys.path[0]`` is its bin folder, not the working
    directory) as the issue's user ran it."""
    _user_files(tmp_path / "project", "kd42_script_models", tmp_path / "run")
    script = os.path.join(os.path.dirname(sys.executable), "kerasdist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([script, "validate", "--import", "recipe.yaml"],
                          cwd=tmp_path / "project", env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]

"""Issue 42 item 1 on a local cluster: a model builder in a module beside the recipe (neither on
``PYTHONPATH`` nor in the working directory) is imported by the launcher and by every task it
starts, which get the recipe's folder through their own ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys

import mwms_support as mw
import pytest
import yaml

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]

BUILDER = '''
import keras

def build():
    return keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
'''


def test_every_task_of_a_local_multi_worker_cluster_imports_a_module_beside_the_recipe(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "kd42_cluster_models.py").write_text(BUILDER)
    recipe = mw.linear_recipe(project, "run", trainer={"epochs": 1})
    raw = yaml.safe_load(recipe.read_text())
    raw["model"] = {"name": "kd42_cluster_models:build", "loss": "mse"}
    recipe.write_text(yaml.safe_dump(raw), encoding="utf-8")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **mw.QUIET}
    done = subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe)], cwd=elsewhere,
                          env=env, capture_output=True, text=True, timeout=400)
    logs = "".join(p.read_text() for p in sorted((project / "run" / "logs").glob("*.log"))) \
        if (project / "run" / "logs").is_dir() else ""
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:] + logs[-4000:]
    assert mw.metrics(project / "run")["global_steps"] > 0

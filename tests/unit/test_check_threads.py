"""The launching command's model check sizes TensorFlow's thread pools as training will: an exposed
local parameter-server run trains its coordinator in the process that checked, and TensorFlow
refuses a different intra-op thread count once its runtime runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    from kerasdist.config import validate_recipe
    from kerasdist.training.checks import check_recipe_here

    recipe = validate_recipe({
        "data": {"source": {"kind": "synthetic_linear", "num_examples": 256}, "batch_size": 32},
        "model": {"name": "linear"},
        "strategy": {"kind": "parameter_server"},
        "cluster": {"kind": "local", "workers": 2, "ps": 1, "threads_per_task": 1,
                    "allow_network_exposure": True},
        "output": {"run_dir": RUN_DIR}})
    check_recipe_here(recipe)  # builds the model here: TensorFlow's runtime starts
    # what the coordinator's session then does in the same process (training/session.py)
    tf.config.threading.set_intra_op_parallelism_threads(recipe.intra_op_threads())
    print("threads", tf.config.threading.get_intra_op_parallelism_threads())
""")


@pytest.mark.timeout(300)
def test_the_check_leaves_the_coordinator_free_to_set_its_threads(tmp_path):
    script = SCRIPT.replace("RUN_DIR", repr(str(tmp_path / "run")))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=280, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "threads 1" in done.stdout
    assert not (tmp_path / "run").exists()  # the check writes nothing

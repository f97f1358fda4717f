"""Issue 42 item 8: a fresh local multi_worker run leaves the model-against-data check to its
tasks (:mod:`kerasdist.launch.model_check`), so the launching process imports no TensorFlow
before they start; bad data still ends the run with the check's own one-line error (exit 2) and
leaves nothing written."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kerasdist.errors import EXIT_BAD_INPUT

pytestmark = [pytest.mark.multiprocess]


def _recipe(tmp_path, *, label=10, strategy="multi_worker", ps=0):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (256, 28, 28)).astype(np.uint8)
    y = np.arange(256) % 10
    y[5] = label
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y, x_test=x, y_test=y)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""
        model: {{name: mnist_cnn}}
        data: {{source: npz, path: '{tmp_path / "data.npz"}', train_split: train,
                eval_split: test, batch_size: 32}}
        strategy: {{kind: {strategy}}}
        cluster: {{kind: local, workers: 2, ps: {ps}, threads_per_task: 1}}
        trainer: {{epochs: 1, steps_per_epoch: 2}}
        output: {{run_dir: '{tmp_path / "run"}', tensorboard: false}}
    """), encoding="utf-8")
    return recipe


@pytest.mark.timeout(300)
def test_bad_labels_found_by_the_tasks_exit_2_with_one_clean_line_and_nothing_written(tmp_path):
    recipe = _recipe(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe)],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path,
                          env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == EXIT_BAD_INPUT, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kerasdist: error: data.train_split 'train'"), done.stderr[-3000:]
    assert "labels must be in [0, 10)" in last and "Received: label 10" in last
    assert "exited with code" not in last and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # the launch's logs and lock removed with it


def _tensorflow_after_preflight(recipe, *, model_check: bool) -> str:
    code = textwrap.dedent(f"""
        import sys
        from kerasdist.config.loader import load_recipe
        from kerasdist.launch.run import preflight
        preflight(load_recipe({str(recipe)!r}), overwrite=False, model_check={model_check})
        print("tensorflow" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(420)
def test_the_launching_process_imports_no_tensorflow_when_the_tasks_check(tmp_path):
    recipe = _recipe(tmp_path, label=3)
    assert _tensorflow_after_preflight(recipe, model_check=False) == "False"
    assert _tensorflow_after_preflight(recipe, model_check=True) == "True"  # the test can fail


def test_only_a_fresh_untracked_local_multi_worker_run_is_deferred(tmp_path):
    from kerasdist.config.loader import load_recipe
    from kerasdist.launch import model_check

    recipe = load_recipe(_recipe(tmp_path, label=3))
    assert model_check.deferred(recipe, tmp_path / "run")
    (tmp_path / "run").mkdir()
    assert model_check.deferred(recipe, tmp_path / "run")  # empty
    (tmp_path / "run" / "run.json").write_text("{}")
    assert not model_check.deferred(recipe, tmp_path / "run")  # a previous run: checked here
    ps = load_recipe(_recipe(tmp_path / "run", label=3, strategy="parameter_server", ps=1))
    assert not model_check.deferred(ps, tmp_path / "elsewhere")

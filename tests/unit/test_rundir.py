"""Run-directory safety (issue 11, points 4-6, 8, 10): nothing the user had is lost, one run per
directory, valid JSON, SIGTERM exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.errors import EXIT_FAILED, EXIT_INTERRUPTED
from kerasdist.training.rundir import LOCK_NAME

pytestmark = pytest.mark.timeout(180)

LINEAR = """
model: {{name: linear}}
data: {{source: synthetic_linear, train_split: train, eval_split: test, batch_size: 50,
        num_examples: 200}}
optimizer: {{name: sgd, learning_rate: {lr}}}
trainer: {{epochs: {epochs}, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


def _recipe(write_recipe, run_dir, lr=0.1, epochs=1):
    return str(write_recipe(LINEAR.format(run_dir=run_dir, lr=lr, epochs=epochs)))


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_folder_that_is_not_a_kerasdist_run_is_refused_and_overwrite_moves_it_aside(
        write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "model.keras").write_text("my own model")
    (run_dir / "metrics.json").write_text("my own metrics")
    recipe = _recipe(write_recipe, run_dir)
    assert main(["fit", recipe]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "not empty and holds no kerasdist run.json" in err and "model.keras" in err
    assert _tree(run_dir) == ["metrics.json", "model.keras"]  # untouched, no lock left behind
    assert main(["fit", recipe, "--overwrite"]) == 0
    assert "moved the previous run" in capsys.readouterr().out
    (old,) = tmp_path.glob("mine.old-*")
    assert (old / "model.keras").read_text() == "my own model"
    assert (run_dir / "run.json").is_file()
    assert (run_dir / LOCK_NAME).read_text() == ""  # released: no holder recorded


def test_overwrite_keeps_files_kerasdist_never_wrote(write_recipe, tmp_path):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    assert main(["fit", recipe]) == 0
    (run_dir / "checkpoints" / "notes.txt").write_text("keep me")
    assert main(["fit", recipe, "--overwrite"]) == 0
    (old,) = tmp_path.glob("run.old-*")
    assert (old / "checkpoints" / "notes.txt").read_text() == "keep me"
    assert not (run_dir / "checkpoints" / "notes.txt").exists()


def test_run_of_another_model_with_checkpoints_off_is_refused(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    off = ["--set", "trainer.checkpoint.enabled=false"]
    assert main(["fit", recipe, *off]) == 0
    model_before = (run_dir / "model.keras").read_bytes()
    assert main(["fit", recipe, *off, "--set", "model.params.units=2"]) == EXIT_BAD_INPUT
    assert "the run of a different model" in capsys.readouterr().err
    assert (run_dir / "model.keras").read_bytes() == model_before
    assert main(["fit", recipe, *off]) == 0  # the same model may run again


def test_bad_input_leaves_no_lock_and_no_folder(write_recipe, tmp_path):
    run_dir = tmp_path / "a" / "b"
    recipe = _recipe(write_recipe, run_dir)
    assert main(["fit", recipe, "--set", "data.batch_size=1000"]) == EXIT_BAD_INPUT
    assert not (tmp_path / "a").exists()


def _hold_lock(run_dir):
    """A live process that holds the run directory's lock as a kerasdist run would."""
    code = (
        "import fcntl, json, os, socket, sys, time\n"
        f"os.makedirs({str(run_dir)!r}, exist_ok=True)\n"
        f"fd = os.open({str(run_dir / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), "
        "'since': 'now', 'command': 'kerasdist fit other.yaml'}).encode())\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_second_run_on_a_locked_run_dir_exits_2_naming_the_holder(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    holder = _hold_lock(run_dir)
    try:
        assert main(["fit", recipe]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert f"in use by another run: pid {holder.pid}" in err and "other.yaml" in err
        assert not (run_dir / "run.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["fit", recipe]) == 0  # the holder died: its lock is taken over
    assert f"took over the lock on {run_dir} left by pid {holder.pid}" in capsys.readouterr().out


class _PoisonWeights:
    """A callback that makes every weight NaN when epoch ``at`` begins (as a diverging run does)."""

    def __new__(cls, at):
        import keras
        import numpy as np

        class Poison(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == at:
                    self.model.set_weights([np.full_like(w, np.nan) for w in
                                            self.model.get_weights()])

        return Poison()


def test_non_finite_loss_stops_with_exit_1_and_keeps_the_last_good_run(write_recipe, tmp_path,
                                                                        capsys):
    import kerasdist
    from kerasdist.errors import TrainingError, classify, exit_code

    run_dir = tmp_path / "run"
    assert main(["fit", _recipe(write_recipe, run_dir)]) == 0
    kept = {name: (run_dir / name).read_bytes() for name in ("model.keras", "metrics.json")}
    checkpoints = _tree(run_dir / "checkpoints")
    recipe = kerasdist.load_recipe(_recipe(write_recipe, run_dir, epochs=3))
    with pytest.raises(TrainingError, match="the training loss became nan") as caught:
        kerasdist.fit(recipe, callbacks=[_PoisonWeights(at=1)])
    assert exit_code(classify(caught.value)) == EXIT_FAILED
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    assert _tree(run_dir / "checkpoints") == checkpoints  # nothing saved after the NaN


def test_metrics_json_is_strict_json_with_null_for_non_finite(tmp_path):
    from kerasdist.training.outputs import write_json_atomic

    path = write_json_atomic(tmp_path / "m.json", {"a": [1.0, float("nan")], "b": float("inf")})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c)) == {
        "a": [1.0, None], "b": None}


def test_sigterm_during_a_single_process_run_exits_130(write_recipe, tmp_path):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir, epochs=2000)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", recipe, "--verbose", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "run.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, out[-2000:]
    assert "interrupted" in out
    assert list((run_dir / "checkpoints").glob("ckpt-*.index"))  # saved before exiting

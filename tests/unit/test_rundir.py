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
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
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
    # the same model from step 0 would replace the finished run: only with --overwrite
    assert main(["fit", recipe, *off]) == EXIT_BAD_INPUT
    assert "holds a finished run (model.keras, metrics.json)" in capsys.readouterr().err
    assert (run_dir / "model.keras").read_bytes() == model_before
    assert main(["fit", recipe, *off, "--overwrite"]) == 0


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
    from kerasdist._files import write_json_atomic

    path = write_json_atomic(tmp_path / "m.json", {"a": [1.0, float("nan")], "b": float("inf")})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c)) == {
        "a": [1.0, None], "b": None}


@pytest.mark.slow  # over 30 s: not in the fast subset
@pytest.mark.multiprocess
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


# --------------------------------------------------------------------- issue 20: RunDir owns it
def _fit(recipe, *extra):
    return main(["fit", recipe, *extra])


def test_symlinked_lock_is_refused_and_its_target_left_alone(write_recipe, tmp_path, capsys):
    """Point 1: the lock as a link to another file (truncated before) or a dangling link
    (whose target was created before): exit 2 naming the link, nothing written anywhere."""
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_NAME).symlink_to(target)
    assert _fit(_recipe(write_recipe, run_dir)) == EXIT_BAD_INPUT
    assert "is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "precious" and _tree(run_dir) == [LOCK_NAME]
    dangling = tmp_path / "run2"
    dangling.mkdir()
    (dangling / LOCK_NAME).symlink_to(tmp_path / "nowhere")
    assert _fit(_recipe(write_recipe, dangling)) == EXIT_BAD_INPUT
    assert not (tmp_path / "nowhere").exists() and _tree(dangling) == [LOCK_NAME]


def test_lock_is_never_followed_even_when_taken_directly(tmp_path):
    from kerasdist.errors import RunDirError
    from kerasdist.training.rundir_lock import RunDirLock

    (tmp_path / LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunDirError, match="is a symbolic link"):
        RunDirLock(tmp_path).__enter__()
    assert not (tmp_path / "elsewhere").exists()


def _finite_checkpoints(folder):
    import numpy as np
    import tensorflow as tf

    found = {}
    for index in sorted(folder.glob("ckpt-*.index")):
        reader = tf.train.load_checkpoint(str(index.with_suffix("")))
        found[index.stem] = all(
            np.isfinite(reader.get_tensor(name)).all()
            for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating)
    return found


MNIST_SGD = """
model: {{name: mnist_cnn}}
data: {{train_split: "test[:512]", eval_split: "test[512:640]", batch_size: 64}}
optimizer: {{name: sgd, learning_rate: 1000000.0}}
trainer: {{epochs: 1, steps_per_epoch: 3, verbose: 0, checkpoint: {{every_steps: 1}}}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


def test_diverging_run_never_saves_a_non_finite_checkpoint(write_recipe, tmp_path, capsys):
    """Point 2: the CNN with sgd at learning rate 1e6, a checkpoint every step: its weights become
    NaN/inf while the loss is still finite. The run stops with exit 1 at the first non-finite
    state, says so truthfully, and every checkpoint on disk is finite (the next run resumes from
    a finite one)."""
    run_dir = tmp_path / "run"
    recipe = str(write_recipe(MNIST_SGD.format(run_dir=run_dir)))
    assert _fit(recipe) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "is not finite" in err and "not saved: the newest checkpoint ckpt-" in err, err
    saved = _finite_checkpoints(run_dir / "checkpoints")
    assert saved and all(saved.values()), saved
    assert not (run_dir / "model.keras").exists()
    assert _fit(recipe) == EXIT_FAILED  # resumes the newest finite one, and diverges again
    assert "resuming from checkpoint" in capsys.readouterr().out
    assert all(_finite_checkpoints(run_dir / "checkpoints").values())


@pytest.mark.parametrize("asynchronous", ["false", pytest.param("true", marks=pytest.mark.slow)],
                         ids=["sync", "async"])
def test_sigint_saves_a_checkpoint_like_sigterm(write_recipe, tmp_path, asynchronous):
    """Point 3: Ctrl-C (SIGINT to the whole process group) during a one-epoch run: exit 130
    after a checkpoint at the step reached (there is no epoch end to save at); with
    ``trainer.checkpoint.async`` too (the background write is complete at the exit)."""
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", recipe, "--verbose", "2",
                             "--set", "trainer.steps_per_epoch=1000000",
                             "--set", f"trainer.checkpoint.async={asynchronous}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "run.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, out[-2000:]
    assert "preempted: checkpoint saved at global step" in out, out[-2000:]
    step = int(out.split("preempted: checkpoint saved at global step ")[1].split(";")[0])
    assert (run_dir / "checkpoints" / f"ckpt-{step}.index").is_file(), out[-2000:]


@pytest.mark.parametrize("damage", ["checkpoint files", "checkpoints folder"])
def test_finished_run_is_not_replaced_by_a_run_from_step_zero(write_recipe, tmp_path, capsys,
                                                              damage):
    """Point 4: the checkpoints of a finished run deleted (state-sha256.json, model.keras and
    metrics.json remain): exit 2, the finished run kept; --overwrite moves it aside."""
    import shutil

    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    assert _fit(recipe) == 0
    kept = {name: (run_dir / name).read_bytes() for name in ("model.keras", "metrics.json")}
    if damage == "checkpoints folder":
        shutil.rmtree(run_dir / "checkpoints")
    else:
        for path in (run_dir / "checkpoints").iterdir():
            if path.name != "state-sha256.json":
                path.unlink()
    assert _fit(recipe) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "holds a finished run (model.keras, metrics.json)" in err and "--overwrite" in err
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    assert _fit(recipe, "--overwrite") == 0
    (old,) = tmp_path.glob("run.old-*")
    assert {name: (old / name).read_bytes() for name in kept} == kept


def test_learning_rate_changed_on_resume_applies_from_the_resumed_step(write_recipe, tmp_path,
                                                                        capsys):
    """Point 5: --set optimizer.learning_rate on resume is applied (not the checkpoint's) and
    logged; the result equals a run that switched the rate at that step by hand."""
    import shutil

    import kerasdist

    first = tmp_path / "a"
    assert _fit(_recipe(write_recipe, first)) == 0  # 4 steps at lr 0.1
    second = tmp_path / "b"
    shutil.copytree(first, second)
    capsys.readouterr()
    assert _fit(_recipe(write_recipe, first, epochs=2)) == 0
    same = json.loads((first / "metrics.json").read_text())["weights_sha256"]
    assert "optimizer.learning_rate" not in capsys.readouterr().out
    result = kerasdist.fit(kerasdist.load_recipe(_recipe(write_recipe, second, lr=0.5, epochs=2)))
    assert "optimizer.learning_rate 0.1 -> 0.5 at step 4" in capsys.readouterr().out
    assert result.extra["start_step"] == 4 and result.extra["weights_sha256"] != same
    info = json.loads((second / "run.json").read_text())
    assert info["recipe"]["optimizer"]["learning_rate"] == 0.5


def test_changed_optimizer_kind_on_resume_is_refused_naming_the_field(write_recipe, tmp_path,
                                                                       capsys):
    """Point 5: another optimizer.name (or momentum slots appearing) cannot resume: exit 2."""
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    assert _fit(recipe) == 0
    before = _tree(run_dir)
    run_json = (run_dir / "run.json").read_bytes()
    assert _fit(recipe, "--set", "optimizer.name=adam", "--set", "trainer.epochs=2") == \
        EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "optimizer.name changed" in err and "Received: optimizer.name='adam'" in err
    assert _fit(recipe, "--set", "optimizer.momentum=0.9", "--set", "trainer.epochs=2") == \
        EXIT_BAD_INPUT
    assert "Received: optimizer.momentum=0.9" in capsys.readouterr().err
    assert _tree(run_dir) == before and (run_dir / "run.json").read_bytes() == run_json


@pytest.mark.parametrize("batch", [1000, 10**12])
def test_batch_larger_than_the_split_is_refused_before_anything_is_written(
        write_recipe, tmp_path, capsys, batch):
    """Point 6: with trainer.steps_per_epoch set too, a batch beyond the 200 examples is bad
    input (exit 2) before run.json or tensorboard/ exist."""
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir)
    assert _fit(recipe, "--set", f"data.batch_size={batch}", "--set",
                "trainer.steps_per_epoch=3") == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"Received: batch_size={batch}" in err and "Traceback" not in err
    assert not run_dir.exists()


def test_overwrite_of_the_current_directory_is_refused_cleanly(write_recipe, tmp_path, capsys,
                                                               monkeypatch):
    """Point 7: output.run_dir=. (and ..) with --overwrite: exit 2 naming it, nothing moved."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    here = _recipe(write_recipe, ".")
    assert _fit(here) == 0
    before = _tree(run_dir)
    for name in (".", ".."):
        assert _fit(_recipe(write_recipe, name), "--overwrite") == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "is the current directory or holds it" in err and "Traceback" not in err
        assert f"Received: run_dir='{name}'" in err
    assert _tree(run_dir) == before and not list(tmp_path.glob("*.old-*"))
    assert not (tmp_path / LOCK_NAME).exists()


def test_foreign_folders_get_no_lock_and_no_training(write_recipe, tmp_path, capsys):
    """Point 8: a folder holding only the user's logs/app.log is not a kerasdist run; a symlinked
    run dir is refused; neither gets a lock file."""
    mine = tmp_path / "mine"
    (mine / "logs").mkdir(parents=True)
    (mine / "logs" / "app.log").write_text("my log")
    assert _fit(_recipe(write_recipe, mine)) == EXIT_BAD_INPUT
    assert "logs/app.log" in capsys.readouterr().err
    assert _tree(mine) == ["logs", "logs/app.log"]
    target = tmp_path / "target"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(target)
    for extra in ((), ("--overwrite",)):
        assert _fit(_recipe(write_recipe, link), *extra) == EXIT_BAD_INPUT
        assert "is a symbolic link" in capsys.readouterr().err
        assert _tree(target) == ["notes.txt"] and link.is_symlink()


def test_launcher_logs_alone_are_still_a_fresh_run_dir(write_recipe, tmp_path):
    """What a local launcher leaves before run.json (its task recipe, logs and status files)
    does not make the folder foreign."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    for name in ("recipe.json", "worker-0.log", "worker-1.status.json"):
        (run_dir / "logs" / name).write_text("{}")
    assert _fit(_recipe(write_recipe, run_dir)) == 0


UNWRITABLE = r"""
import os, sys
from kerasdist.cli import main
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.exit(main(["fit", sys.argv[1], "--set", "trainer.epochs=2"]))
"""


def test_read_only_subfolders_are_refused_before_anything_is_written(unprivileged):
    """Point 9: the run dir writable but tensorboard/ and checkpoints/ read-only: exit 2 naming
    the folder, run.json not replaced (as root, the run is made by the unprivileged 'nobody',
    since root writes anywhere; the ``unprivileged`` fixture)."""
    base = unprivileged.base
    run_dir = base / "run"
    recipe = base / "recipe.yaml"
    recipe.write_text(LINEAR.format(run_dir=run_dir, lr=0.1, epochs=1).replace(
        "tensorboard: false", "tensorboard: true"))
    assert _fit(str(recipe)) == 0
    unprivileged.own(base)
    for name in ("tensorboard", "checkpoints"):
        (run_dir / name).chmod(0o555)
    run_json = (run_dir / "run.json").read_bytes()
    done = subprocess.run([*unprivileged.argv, sys.executable, "-c", UNWRITABLE, str(recipe)],
                          capture_output=True, text=True, timeout=300, cwd=base,
                          env={**os.environ, "HOME": str(base)})
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-3000:]
    assert "is not writable by this user" in done.stderr and "Traceback" not in done.stderr
    assert (run_dir / "run.json").read_bytes() == run_json

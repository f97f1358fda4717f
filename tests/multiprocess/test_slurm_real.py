"""kerasdist on a real Slurm (Debian's slurm-wlm + munge, started by kerasdist.testing.slurm):
the batch scripts of ``kerasdist export slurm`` submitted as written with ``sbatch``.

Skipped, naming why, where Slurm is not installed or not root (``.ci/run`` installs it on a
Debian machine). One representative run is in the README's suite (a parameter-server job that
ends when its chief ends, 1 node); the 3-node runs and the preemption runs are in the extended
tier. Run alone: ``python -m pytest -q -n 0 -m "extended or not extended"
tests/multiprocess/test_slurm_real.py``. Timeouts use pytest-timeout's signal method: the
test is failed by an exception, so the cluster's context manager still stops every daemon (the
thread method would end the process and leave them running).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kerasdist.testing.slurm import SlurmCluster, SlurmError, unavailable_reason

pytest_plugins = ["kerasdist.testing"]

REPO = Path(__file__).parents[2]
pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=unavailable_reason() or "")]
TASK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
USER_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}  # TensorFlow's log level untouched
KERASDIST = f"{sys.executable} -m kerasdist"


def _export(recipe: Path, tmp_path: Path, *args: str) -> Path:
    """``kerasdist export slurm recipe -o job.sh ARGS``, as a user runs it."""
    script = tmp_path / "job.sh"
    done = subprocess.run([sys.executable, "-m", "kerasdist", "export", "slurm", str(recipe),
                           "-o", str(script), "--kerasdist", KERASDIST, *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    return script


def _ps_recipe(tmp_path: Path, strategy_sync: dict | None = None, **trainer) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "mnist_cnn_ps.yaml").read_text())
    raw["cluster"].update(threads_per_task=1, port_base=_port_base())
    if strategy_sync:
        raw["strategy"]["sync"] = strategy_sync
    raw["trainer"].update(trainer)
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    path = tmp_path / "mnist_cnn_ps.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _port_base() -> int:
    """A port with the next 3 free (tasks on one node use port_base, port_base + 1, ...)."""
    import portpicker

    for _ in range(100):
        port = portpicker.pick_unused_port()
        if port < 65000 and all(portpicker.is_port_free(port + i) for i in range(1, 4)):
            return port
    raise AssertionError("no 4 consecutive free ports")


def _output(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("*-*.out")))


def after_summary(out: str) -> list[str]:
    """The lines after the end of kerasdist's run summary (its closing rule) in ``out``."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "kerasdist run summary")
    end = next(i for i in range(start, len(lines)) if lines[i] and set(lines[i]) == {"="})
    return lines[end + 1:]


def _run(slurm: SlurmCluster, script: Path, tmp_path: Path, timeout_s: float,
         env: dict = TASK_ENV) -> dict:
    job = slurm.sbatch(script, cwd=tmp_path, env=env)
    try:
        info = slurm.wait(job, timeout_s=timeout_s)
    except Exception:
        print(_output(tmp_path)[-6000:])
        raise
    info["elapsed"] = time.monotonic()
    return info


@pytest.mark.timeout(120, method="signal")
def test_the_fixture_runs_a_real_slurm_and_leaves_nothing(tmp_path):
    """The fixture's cluster answers srun and sbatch; after it, no daemon, job process or
    namespace of it is left."""
    from kerasdist.testing.hosts import leftovers

    with SlurmCluster(1, work_dir=tmp_path / "slurm") as slurm:
        out = slurm.command(["srun", "-n", "2", "printenv", "SLURM_PROCID"], timeout_s=60).stdout
        assert sorted(out.split()) == ["0", "1"]
        script = tmp_path / "sleep.sh"
        script.write_text("#!/bin/bash\nsleep 300\n")
        job = slurm.sbatch(script, cwd=tmp_path)
        assert slurm.wait(job, timeout_s=30, states={"RUNNING"})["JobState"] == "RUNNING"
        suffix = slurm.hosts.suffix if slurm.hosts else None
    assert slurm.stray_pids() == []
    if suffix:
        assert leftovers(suffix) == []


@pytest.mark.slow
@pytest.mark.timeout(900, method="signal")
def test_a_parameter_server_job_ends_when_its_chief_ends(tmp_path, slurm_cluster):
    """The exported script of a parameter-server recipe (chief, 1 ps, 2 workers on one node):
    the chief trains and releases the servers, every task exits 0 (srun's exit code is the
    largest of its tasks', the script's ``set -e`` makes it the job's), the job is COMPLETED
    (before kerasdist.launch.clusters.slurm the ps and workers served on and the job never ended).
    Run with TensorFlow's log level as a user has it: the job's output file ends with the run
    summary (before, about 400 lines of "Failed to remove function remotely" errors followed it:
    the chief's functions released after its servers left)."""
    recipe = _ps_recipe(tmp_path, epochs=1, steps_per_epoch=60)
    script = _export(recipe, tmp_path, "--nodes", "1")
    started = time.monotonic()
    info = _run(slurm_cluster, script, tmp_path, timeout_s=780, env=USER_ENV)
    out = _output(tmp_path)
    print(f"\njob {info['JobId']}: {info['JobState']} exit {info['ExitCode']} after "
          f"{time.monotonic() - started:.0f} s")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-6000:]
    assert "released 3 of 3 server task(s)" in out, out[-6000:]
    assert after_summary(out) == [], out[-3000:]
    assert not re.findall(r"^[EW]\d{4} .*", out, re.M), out[-3000:]
    result = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert result["global_steps"] == 60 and result["evaluation"]["accuracy"] > 0.8, result


def _linear_recipe(tmp_path: Path, *, workers: int, **trainer) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "linear_mwms.yaml").read_text())
    raw["cluster"].update(workers=workers, port_base=_port_base(), threads_per_task=1,
                          max_restarts=2)
    raw["trainer"].update(trainer)
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    path = tmp_path / "linear_mwms.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in (run_dir / "checkpoints").glob("ckpt-*.index")
                  if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name)))


def _wait_for_checkpoint(slurm: SlurmCluster, job: int, run_dir: Path, tmp_path: Path, *,
                         min_step: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        steps = [s for s in _checkpoint_steps(run_dir) if s >= min_step]
        if steps:
            return steps[0]
        try:
            state = slurm.job(job)["JobState"]
        except SlurmError:  # one failed scontrol under load: look again
            state = "RUNNING"
        assert state in ("PENDING", "RUNNING"), _output(tmp_path)[-6000:]
        time.sleep(0.5)
    raise AssertionError(f"no checkpoint >= {min_step} in {timeout_s} s\n{_output(tmp_path)[-6000:]}")


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(900, method="signal")
def test_the_multi_worker_recipe_on_three_nodes_reaches_its_target(tmp_path):
    """recipes/linear_mwms.yaml as 4 workers on 3 Slurm nodes (2 + 1 + 1, the first node's two
    on consecutive ports), exported and submitted as written: W within 0.1 of 2, b of 10."""
    import keras
    import numpy as np

    with SlurmCluster(3, work_dir=tmp_path / "slurm") as slurm:
        script = _export(_linear_recipe(tmp_path, workers=4), tmp_path, "--nodes", "3")
        started = time.monotonic()
        info = _run(slurm, script, tmp_path, timeout_s=780)
        elapsed = time.monotonic() - started
    out = _output(tmp_path)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-6000:]
    model = keras.saving.load_model(tmp_path / "run" / "model.keras", compile=False)
    kernel, bias = (float(np.ravel(w)[0]) for w in model.get_weights())
    print(f"\n4 workers on {info['NodeList']}: W={kernel:.4f} b={bias:.4f}, job {elapsed:.0f} s")
    assert abs(kernel - 2) < 0.1 and abs(bias - 10) < 0.1, out[-4000:]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400, method="signal")
def test_the_parameter_server_recipe_on_three_nodes_reaches_its_target(tmp_path):
    """recipes/mnist_cnn_ps.yaml whole (5 x 125 steps) on 3 Slurm nodes: chief and ps on the
    first, a worker on each other; held-out accuracy >= 0.975 (the recipe's target), every task
    exits 0 and the job is COMPLETED."""
    with SlurmCluster(3, work_dir=tmp_path / "slurm") as slurm:
        script = _export(_ps_recipe(tmp_path), tmp_path, "--nodes", "3")
        started = time.monotonic()
        info = _run(slurm, script, tmp_path, timeout_s=2280)  # ~24 min at load 30
        elapsed = time.monotonic() - started
    out = _output(tmp_path)
    result = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print(f"\nchief, ps, 2 workers on {info['NodeList']}: accuracy "
          f"{result['evaluation']['accuracy']:.4f}, {result['global_steps']} steps, job {elapsed:.0f} s")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-6000:]
    assert "released 3 of 3 server task(s)" in out, out[-6000:]
    assert result["global_steps"] == 625 and result["evaluation"]["accuracy"] >= 0.975, result


def _preempt_and_resume(slurm: SlurmCluster, script: Path, tmp_path: Path, *, total: int,
                        signal_command: list[str], timeout_s: float,
                        require_save: bool = True) -> tuple[dict, str, int]:
    """Submit, wait for a checkpoint at step >= 20, send ``signal_command`` + the job id, wait
    for the requeued job to finish. Returns its fields, the output and the resume step: the step
    saved on the signal (``require_save``), else the newest checkpoint the requeued job found."""
    run_dir = tmp_path / "run"
    job = slurm.sbatch(script, cwd=tmp_path, env=TASK_ENV)
    first = _wait_for_checkpoint(slurm, job, run_dir, tmp_path, min_step=20,
                                 timeout_s=timeout_s / 2)
    slurm.command([*signal_command, str(job)])
    info = slurm.wait(job, timeout_s=timeout_s)
    out = _output(tmp_path)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-8000:]
    assert info["Restarts"] == "1", (info, out[-8000:])
    saved = [int(s) for s in re.findall(r"checkpoint saved at global step (\d+)", out)]
    resumed = [int(s) for s in re.findall(r"resuming from checkpoint .*?\(global step (\d+)\)", out)]
    if require_save:
        assert len(saved) >= 1 and resumed == [saved[0]] and saved[0] < total, out[-8000:]
    else:  # no save promised: the newest complete checkpoint, at least the one seen before
        assert len(resumed) == 1 and first <= resumed[0] < total, out[-8000:]
        saved = resumed
    assert json.loads((run_dir / "metrics.json").read_text())["global_steps"] == total
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("run")) \
        == ["run"]
    return info, out, saved[0]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(900, method="signal")
@pytest.mark.parametrize("signal_name", ["USR1", "HUP"])
def test_usr1_saves_requeues_and_resumes_a_multi_worker_job_at_the_exact_step(tmp_path,
                                                                             slurm_cluster,
                                                                             signal_name):
    """SIGUSR1 (what --signal=USR1@300 sends before the time limit; here scancel --signal) to a
    2-worker job: both save at one agreed step, task 0 runs scontrol requeue, the requeued job
    (SLURM_RESTART_COUNT=1) resumes at that step and ends at exactly the recipe's step count.
    The same with ``cluster.preemption_signal: HUP`` (the script's --signal=HUP@300)."""
    recipe = _linear_recipe(tmp_path, workers=2, epochs=30)
    if signal_name != "USR1":
        raw = yaml.safe_load(recipe.read_text())
        raw["cluster"]["preemption_signal"] = signal_name
        recipe.write_text(yaml.safe_dump(raw), encoding="utf-8")
    script = _export(recipe, tmp_path, "--nodes", "1")
    assert f"#SBATCH --signal={signal_name}@300" in script.read_text().splitlines()
    info, out, step = _preempt_and_resume(slurm_cluster, script, tmp_path, total=30 * 31,
                                          signal_command=["scancel", f"--signal={signal_name}"],
                                          timeout_s=780)
    print(f"\n{signal_name}: saved and resumed at step {step}; restarts {info['Restarts']}")
    assert "requeued by kerasdist (restart 1 of at most 2)" in out, out[-6000:]
    assert "SLURM_RESTART_COUNT=1" in out, out[-6000:]
    assert f"SIG{signal_name} received" in out, out[-6000:]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400, method="signal")
@pytest.mark.parametrize("sync", [None, {"replicas_to_aggregate": 1}], ids=["async", "sync"])
def test_usr1_saves_requeues_and_resumes_a_parameter_server_job_at_the_exact_step(
        tmp_path, slurm_cluster, sync):
    """The same for a parameter-server job, asynchronous and synchronous (``strategy.sync``, one
    backup worker): the chief saves at the step the ps hold, requeues; ps and workers ignore
    SIGUSR1 (the chief saves their variables) and end with the requeue."""
    recipe = _ps_recipe(tmp_path, epochs=1, steps_per_epoch=300, checkpoint={"every_steps": 20},
                        strategy_sync=sync)
    script = _export(recipe, tmp_path, "--nodes", "1")
    info, out, step = _preempt_and_resume(slurm_cluster, script, tmp_path, total=300,
                                          signal_command=["scancel", "--signal=USR1"],
                                          timeout_s=2200)  # ~30 min at load 30
    print(f"\nsaved and resumed at step {step}; restarts {info['Restarts']}")
    assert "requeued by kerasdist (restart 1 of at most 2)" in out, out[-6000:]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(900, method="signal")
def test_a_users_parameter_server_script_under_this_task_ends_with_its_chief(tmp_path,
                                                                              slurm_cluster):
    """``srun kerasdist launch --this-task --ps 1 script.py`` (a tutorial-style script that knows
    nothing of kerasdist, tests/scripts/mnist_parameter_server.py, 1 epoch): the chief runs the
    script and releases the ps and workers, every task exits 0, the job is COMPLETED."""
    script = tmp_path / "job.sh"
    user_script = REPO / "tests" / "scripts" / "mnist_parameter_server.py"
    data = REPO / "kerasdist" / "data" / "sample"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=4\n#SBATCH --output=script-%j.out\n"
                      "set -euo pipefail\n"
                      f"srun --kill-on-bad-exit=1 {KERASDIST} launch --this-task --ps 1 "
                      f"{user_script} {data} {tmp_path / 'out'} 1\n")
    info = _run(slurm_cluster, script, tmp_path, timeout_s=780)
    out = _output(tmp_path)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-6000:]
    assert "released 3 of 3 server task(s)" in out, out[-6000:]
    (accuracy,) = re.findall(r"coordinator held-out accuracy: ([\d.]+)", out)
    print(f"\nthe user's script as chief: held-out accuracy {accuracy}")
    assert float(accuracy) >= 0.9, out[-4000:]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400, method="signal")
def test_scontrol_requeue_of_a_parameter_server_job_resumes_at_the_exact_step(tmp_path,
                                                                             slurm_cluster):
    """``scontrol requeue`` (Slurm's own requeue: SIGTERM to every task, SIGKILL after KillWait,
    30 s here) mid-run: the ps and workers serve on (for the chief's save); the requeued job
    resumes at the newest complete checkpoint and ends at exactly the recipe's step count. No save
    at the SIGTERM is required: at load ~20 the chief did not save within KillWait's 30 s (TF
    blocks its main thread; see docs/slurm.md), --signal=USR1@N is the warned path."""
    recipe = _ps_recipe(tmp_path, epochs=1, steps_per_epoch=300, checkpoint={"every_steps": 20})
    script = _export(recipe, tmp_path, "--nodes", "1")
    info, out, step = _preempt_and_resume(slurm_cluster, script, tmp_path, total=300,
                                          signal_command=["scontrol", "requeue"],
                                          timeout_s=2200, require_save=False)
    print(f"\nscontrol requeue: resumed at step {step}; restarts {info['Restarts']}")
    assert "serving on while chief:0 runs" in out, out[-6000:]


_COUNTER = """\
import pathlib, sys, time
state, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
step = int(state.read_text()) if state.exists() else 0
print(f"counter: starting at step {step}", flush=True)
while step < total:
    time.sleep(0.5)
    step += 1
    state.write_text(str(step))
print(f"counter: done at step {step}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(600, method="signal")
def test_launch_this_task_requeues_a_users_script_on_the_signal(tmp_path, slurm_cluster):
    """``srun kerasdist launch --this-task --max-restarts 1 script.py`` (one task; the script
    keeps its own step in a file, as a script with its own checkpoints does): SIGUSR1 mid-run
    stops the script, task 0 requeues the job, the requeued script resumes from its own state
    and finishes; the job is COMPLETED with one restart."""
    user_script = tmp_path / "counter.py"
    user_script.write_text(_COUNTER)
    state = tmp_path / "state"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH --requeue\n"
                      "#SBATCH --output=script-%j.out\n#SBATCH --open-mode=append\n"
                      "set -euo pipefail\n"
                      f"srun --kill-on-bad-exit=1 {KERASDIST} launch --this-task --max-restarts 1 "
                      f"{user_script} {state} 60\n")
    job = slurm_cluster.sbatch(script, cwd=tmp_path, env=TASK_ENV)
    deadline = time.monotonic() + 300
    while not (state.exists() and state.read_text() and int(state.read_text()) >= 5):
        assert time.monotonic() < deadline, _output(tmp_path)[-4000:]
        time.sleep(0.5)
    slurm_cluster.command(["scancel", "--signal=USR1", str(job)])
    info = slurm_cluster.wait(job, timeout_s=420)
    out = _output(tmp_path)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-6000:]
    assert info["Restarts"] == "1", (info, out[-6000:])
    assert "requeued by kerasdist (restart 1 of at most 1)" in out, out[-6000:]
    assert "SIGUSR1 received: stopping the script" in out, out[-6000:]
    starts = [int(s) for s in re.findall(r"counter: starting at step (\d+)", out)]
    print(f"\nthe script started at steps {starts}; restarts {info['Restarts']}")
    assert starts[0] == 0 and len(starts) == 2 and 5 <= starts[1] < 60, out[-6000:]
    assert state.read_text() == "60" and "counter: done at step 60" in out


REQUEUE_CASES = {  # what is done to the running job, its task 0's flags, the line, the job's end
    "Slurm requeues it": (["scontrol", "requeue"], ["--max-restarts", "1", "--preemption-signal",
                                                    "TERM"],
                          "Slurm is requeueing the job (restart 1 of at most 1)", None),
    "it is cancelled": (["scancel"], ["--max-restarts", "1", "--preemption-signal", "TERM"],
                        "not requeued: the job was cancelled", ("CANCELLED", "0")),
    "no restart is left": (["scancel", "--signal=USR1"], ["--max-restarts", "0"],
                           "not requeued: max_restarts reached (0)", ("FAILED", "0")),
}


@pytest.mark.slow
@pytest.mark.timeout(600, method="signal")
@pytest.mark.parametrize("case", list(REQUEUE_CASES))
def test_task_0_says_in_one_line_what_happens_to_a_stopped_job(tmp_path, slurm_cluster, case):
    """A one-task job (``launch --this-task`` of a script that keeps its step in a file; the
    same decision as a recipe's task 0, kerasdist.launch.clusters.slurm.requeue_decision) stopped
    three ways: Slurm's own requeue (before: "scontrol requeue N did not requeue it: Job is
    pending execution"), a cancel (before: kerasdist requeued the cancelled job) and a signal
    past --max-restarts. One line says what happens, and it happens."""
    command, flags, line, end = REQUEUE_CASES[case]
    user_script = tmp_path / "counter.py"
    user_script.write_text(_COUNTER)
    state = tmp_path / "state"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH --requeue\n"
                      "#SBATCH --output=script-%j.out\n#SBATCH --open-mode=append\n"
                      "set -euo pipefail\n"
                      f"srun --kill-on-bad-exit=1 {KERASDIST} launch --this-task {' '.join(flags)} "
                      f"{user_script} {state} 600\n")
    job = slurm_cluster.sbatch(script, cwd=tmp_path, env=TASK_ENV)
    deadline = time.monotonic() + 300
    while not (state.exists() and state.read_text() and int(state.read_text()) >= 3):
        assert time.monotonic() < deadline, _output(tmp_path)[-4000:]
        time.sleep(0.5)
    slurm_cluster.command([*command, str(job)])
    deadline = time.monotonic() + 120  # task 0's line on the requeue, whatever it says
    while not re.search(r"stopping the script[\s\S]*requeue", _output(tmp_path)):
        assert time.monotonic() < deadline, _output(tmp_path)[-4000:]
        time.sleep(0.5)
    if end is None:  # requeued by Slurm: pending again, its restart counted
        info = slurm_cluster.wait(job, timeout_s=120, states={"PENDING", "RUNNING"})
        assert info["Restarts"] == "1", (info, _output(tmp_path)[-4000:])
    else:
        info = slurm_cluster.wait(job, timeout_s=120)
        assert (info["JobState"], info["Restarts"]) == end, (info, _output(tmp_path)[-4000:])
    out = _output(tmp_path)
    said = re.findall(rf"Slurm job {job}: (.*)", out)
    print(f"\n{case}: {said}")
    assert len(said) == 1 and said[0].startswith(line), out[-4000:]

"""``cluster.preemption_signal`` (the signal Slurm sends before the time limit) and the requeue
cap (``SLURM_RESTART_COUNT`` against ``cluster.max_restarts``), without a Slurm: faked
``SLURM_*`` variables. The real runs are in ``tests/multiprocess/test_slurm_real.py``."""

from __future__ import annotations

import signal

import pytest
import yaml

from kerasdist import errors
from kerasdist.cli import main
from kerasdist.cluster.export_slurm import sbatch_script
from kerasdist.config import validate_recipe
from kerasdist.errors import ClusterError, RecipeError
from kerasdist.keras.preemption import preemption_signals
from kerasdist.launch.clusters import slurm


def _recipe(**cluster):
    return validate_recipe({"strategy": {"kind": "multi_worker"},
                            "cluster": {"kind": "slurm", "workers": 2, **cluster}})


@pytest.mark.parametrize("given, stored", [("USR1", "USR1"), ("sigterm", "TERM"),
                                           (" SIGHUP ", "HUP"), ("xcpu", "XCPU")])
def test_the_signal_is_a_name_with_or_without_sig_in_any_case(given, stored):
    assert _recipe(preemption_signal=given).cluster.preemption_signal == stored


def test_the_default_is_usr1():
    assert _recipe().cluster.preemption_signal == "USR1"


@pytest.mark.parametrize("bad", ["USR3", "KILL", "SIGSTOP", "USR2", "", "10"])
def test_an_unknown_or_uncatchable_signal_is_refused_naming_field_and_value(bad):
    with pytest.raises(RecipeError, match=rf"cluster.preemption_signal .*Received: '{bad}'"):
        _recipe(preemption_signal=bad)


def test_the_runtime_watches_the_recipes_signal_only_under_slurm():
    assert preemption_signals(_recipe(preemption_signal="HUP")) == \
        (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    assert preemption_signals(_recipe()) == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    assert preemption_signals(_recipe(preemption_signal="TERM")) == \
        (signal.SIGTERM, signal.SIGINT)  # watched already, once
    local = validate_recipe({"strategy": {"kind": "multi_worker"},
                             "cluster": {"kind": "local", "workers": 2}})
    assert preemption_signals(local) == (signal.SIGTERM, signal.SIGINT)


def test_the_export_writes_the_recipes_signal():
    text = sbatch_script(_recipe(preemption_signal="sigterm"), recipe_path="r.yaml")
    assert "#SBATCH --signal=TERM@300" in text.splitlines()
    assert "#SBATCH --signal=USR1@300" in sbatch_script(_recipe(), recipe_path="r.yaml")


def test_the_cli_export_takes_the_signal_from_set_and_passes_it_to_the_tasks(tmp_path):
    out = tmp_path / "job.sh"
    assert main(["export", "slurm", "recipes/mnist_cnn_mwms.yaml", "-o", str(out),
                 "--signal-s", "120", "--set", "cluster.preemption_signal=HUP"]) == 0
    text = out.read_text()
    assert "#SBATCH --signal=HUP@120" in text.splitlines()
    assert "cluster.preemption_signal=HUP" in text.splitlines()[-1]  # the tasks watch it too


def test_the_cli_refuses_an_unknown_signal_with_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "job.sh"
    assert main(["export", "slurm", "recipes/mnist_cnn_mwms.yaml", "-o", str(out),
                 "--set", "cluster.preemption_signal=USR9"]) == 2
    err = capsys.readouterr().err
    assert "cluster.preemption_signal" in err and "'USR9'" in err
    assert not out.exists()


class _Role:
    task_name = "worker:0"


def test_a_run_past_the_requeue_cap_is_refused_naming_both_numbers(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    with pytest.raises(ClusterError, match=r"requeued 3 time\(s\), more than the recipe allows "
                                           r"\(cluster.max_restarts=2\).*SLURM_RESTART_COUNT=3"):
        slurm.log_start(_Role(), 2)


def test_the_run_at_the_cap_trains_and_says_it_is_the_last(monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with caplog.at_level("INFO", logger="kerasdist"):
        slurm.log_start(_Role(), 2)
    assert "SLURM_RESTART_COUNT=2" in caplog.text and "the last run it allows" in caplog.text
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    caplog.clear()
    with caplog.at_level("INFO", logger="kerasdist"):
        slurm.log_start(_Role(), 2)
    assert "the last run" not in caplog.text


def test_fit_past_the_cap_exits_2_before_anything_trains(tmp_path, monkeypatch, capsys):
    """``kerasdist fit`` as task 0 of a Slurm step whose job was requeued twice, with
    cluster.max_restarts 1: exit 2 naming both numbers; no run directory is made."""
    raw = yaml.safe_load(open("recipes/linear_mwms.yaml"))
    raw["cluster"].update(kind="slurm", workers=2, max_restarts=1)
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    for name, value in (("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "2"),
                        ("SLURM_STEP_NODELIST", "n1"), ("SLURM_STEP_TASKS_PER_NODE", "2"),
                        ("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0"),
                        ("SLURM_RESTART_COUNT", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert main(["fit", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "cluster.max_restarts=1" in err and "SLURM_RESTART_COUNT=2" in err, err
    assert not (tmp_path / "run").exists()


def _this_task_step(tmp_path, monkeypatch, *, restarts: str = "0"):
    """Task 0 of a 1-task Slurm step (a multi-worker cluster of one), with stand-in ``scontrol``
    logging its arguments to ``calls``; a script that marks its start, then sends itself SIGUSR1
    (what --signal=USR1@N does) and would otherwise run on."""
    calls = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "scontrol $*" >> {calls}\n'
                        'if [ "$1" = show ]; then echo "JobId=7 Requeue=1 Restarts=0"; fi\n')
    scontrol.chmod(0o755)
    for name, value in (("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}"),
                        ("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "1"),
                        ("SLURM_STEP_NODELIST", "n1"), ("SLURM_STEP_TASKS_PER_NODE", "1"),
                        ("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0"),
                        ("SLURM_RESTART_COUNT", restarts)):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TF_CONFIG", "")  # launch --this-task sets it: restored at the end
    monkeypatch.delenv("TF_CONFIG")
    started = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text("import os, signal, sys, time\n"
                      f"open({str(started)!r}, 'w').close()\n"
                      "os.kill(os.getpid(), signal.SIGUSR1)\n"
                      "time.sleep(30)\nsys.exit(0)\n")
    return script, calls, started


def test_launch_this_task_stops_the_script_on_the_signal_and_task_0_requeues(tmp_path,
                                                                            monkeypatch):
    script, calls, started = _this_task_step(tmp_path, monkeypatch)
    code = main(["launch", "--this-task", "--max-restarts", "2", str(script)])
    assert code == 128 + signal.SIGUSR1 and started.exists()
    assert "scontrol requeue 7" in calls.read_text()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # restored


def test_launch_this_task_without_max_restarts_does_not_requeue(tmp_path, monkeypatch, capsys):
    script, calls, _ = _this_task_step(tmp_path, monkeypatch, restarts="5")  # no cap either
    assert main(["launch", "--this-task", str(script)]) == 128 + signal.SIGUSR1
    out = "".join(capsys.readouterr())
    assert not calls.exists() and "give --max-restarts" in out


def test_launch_this_task_past_the_cap_exits_2_before_the_script_runs(tmp_path, monkeypatch,
                                                                      capsys):
    script, _, started = _this_task_step(tmp_path, monkeypatch, restarts="3")
    assert main(["launch", "--this-task", "--max-restarts", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert "cluster.max_restarts=2" in err and "SLURM_RESTART_COUNT=3" in err, err
    assert not started.exists()


def test_launch_refuses_an_unknown_preemption_signal(tmp_path, monkeypatch, capsys):
    script, _, started = _this_task_step(tmp_path, monkeypatch)
    assert main(["launch", "--this-task", "--preemption-signal", "BOGUS", str(script)]) == 2
    assert "--preemption-signal" in capsys.readouterr().err and not started.exists()


# `scontrol show job -o` of a job seen by its task 0 after the signal, on Slurm 22.05 (the test
# suite's slurm-wlm): the fields the decision reads, as Slurm wrote them in each case
RUNNING = {"JobState": "RUNNING", "Reason": "None", "Requeue": "1", "Restarts": "0"}
SLURM_REQUEUES = {"JobState": "COMPLETING", "Reason": "None", "Requeue": "1", "Restarts": "1"}
CANCELLED = {"JobState": "COMPLETING", "Reason": "None", "Requeue": "1", "Restarts": "0"}
TIME_LIMIT = {"JobState": "COMPLETING", "Reason": "TimeLimit", "Requeue": "1", "Restarts": "0"}


@pytest.mark.parametrize("fields, count, expected", [
    (RUNNING, 0, (True, "requeued by kerasdist (restart 1 of at most 2)")),  # our signal
    (TIME_LIMIT, 0, (True, "requeued by kerasdist (restart 1 of at most 2)")),
    (RUNNING, 2, (False, "not requeued: max_restarts reached (2)")),
    ({**RUNNING, "Requeue": "0"}, 0,
     (False, "not requeued: the job does not allow requeue (submit it with sbatch --requeue)")),
    (SLURM_REQUEUES, 0, (False, "Slurm is requeueing the job (restart 1 of at most 2)")),
    ({**SLURM_REQUEUES, "Restarts": "3"}, 2,
     (False, "Slurm is requeueing the job (restart 3; past cluster.max_restarts=2, the requeued "
             "run will refuse to start)")),
    (CANCELLED, 0, (False, "not requeued: the job was cancelled (JobState=COMPLETING)")),
    (CANCELLED, 2, (False, "not requeued: the job was cancelled (JobState=COMPLETING)")),
    ({}, 0, (True, "requeued by kerasdist (restart 1 of at most 2)")),  # scontrol failed
])
def test_the_requeue_line_says_what_happens_to_the_job(fields, count, expected):
    """One truthful line per case: before, a job Slurm was requeueing itself (scontrol requeue,
    its preemption) got "scontrol requeue N did not requeue it: Job is pending execution", and a
    cancelled job (scancel) was requeued by kerasdist."""
    assert slurm.requeue_decision(fields, count=count, max_restarts=2) == expected


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_a_restart_count_that_is_not_a_whole_number_is_refused(monkeypatch, value):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", value)
    with pytest.raises(ClusterError, match=rf"SLURM_RESTART_COUNT must be a whole number >= 0\. "
                                           rf"Received: '{value}'") as refused:
        slurm.log_start(_Role(), 2)
    assert errors.exit_code(errors.classify(refused.value)) == 2  # bad input

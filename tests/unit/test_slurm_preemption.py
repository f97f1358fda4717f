"""``cluster.preemption_signal`` (the signal Slurm sends before the time limit) and the requeue
cap (``SLURM_RESTART_COUNT`` against ``cluster.max_restarts``), without a Slurm: faked
``SLURM_*`` variables. The real runs are in ``tests/multiprocess/test_slurm_real.py``."""

from __future__ import annotations

import signal

import pytest
import yaml

from kerasdist.cli import main
from kerasdist.cluster import slurm_job
from kerasdist.cluster.export_slurm import sbatch_script
from kerasdist.config import validate_recipe
from kerasdist.errors import ClusterError, RecipeError
from kerasdist.keras.preemption import preemption_signals


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
                             "cluster": {"kind": "local", "workers": 2,
                                         "preemption_signal": "HUP"}})
    assert signal.SIGHUP not in preemption_signals(local)


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
        slurm_job.log_start(_Role(), 2)


def test_the_run_at_the_cap_trains_and_says_it_is_the_last(monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with caplog.at_level("INFO", logger="kerasdist"):
        slurm_job.log_start(_Role(), 2)
    assert "SLURM_RESTART_COUNT=2" in caplog.text and "the last run it allows" in caplog.text
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    caplog.clear()
    with caplog.at_level("INFO", logger="kerasdist"):
        slurm_job.log_start(_Role(), 2)
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

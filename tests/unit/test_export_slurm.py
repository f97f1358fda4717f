"""``kerasdist export slurm``: the batch script's lines, its task layout and its refusals; the
Slurm step's task count against the recipe; the parameter-server release and requeue decisions
(no Slurm needed: ``scancel``/``scontrol`` are stand-in scripts). The scripts run on a real Slurm
in ``tests/multiprocess/test_slurm_real.py``."""

from __future__ import annotations

import os
import shlex
import stat

import pytest

from kerasdist.cli import build_parser, main
from kerasdist.cluster.export_slurm import SlurmOptions, sbatch_script
from kerasdist.config import validate_recipe
from kerasdist.errors import ClusterError, RecipeError
from kerasdist.launch.clusters import slurm
from kerasdist.launch.clusters.slurm import tf_config_from_slurm


def _srun(text: str) -> list[str]:
    (line,) = [line for line in text.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def test_parameter_server_script_asks_for_every_task_and_requeues(tmp_path, capsys):
    out = tmp_path / "job.sh"
    code = main(["export", "slurm", "recipes/mnist_cnn_ps.yaml", "-o", str(out), "--nodes", "3",
                 "--time", "01:00:00", "--partition", "gpu", "--cpus-per-task", "4",
                 "--set", "trainer.epochs=2"])
    assert code == 0 and "sbatch" in capsys.readouterr().out
    assert os.stat(out).st_mode & stat.S_IXUSR
    text = out.read_text()
    assert text.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks=4", "#SBATCH --requeue",
                 "#SBATCH --signal=USR1@300", "#SBATCH --open-mode=append",
                 "#SBATCH --time=01:00:00", "#SBATCH --partition=gpu",
                 "#SBATCH --cpus-per-task=4", "export PYTHONUNBUFFERED=1"):
        assert line in text.splitlines(), line
    srun = _srun(text)
    assert srun[:5] == ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--nodes=3", "kerasdist"]
    args = build_parser().parse_args(srun[5:])  # the tasks' command really parses
    assert args.command == "fit" and args.recipe == "recipes/mnist_cnn_ps.yaml"
    assert args.overrides == ["cluster.kind=slurm", "cluster.workers=2", "cluster.ps=1",
                              "trainer.epochs=2"]
    # every #SBATCH line comes before the first command (sbatch stops reading them there)
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert all(not line.startswith("#SBATCH") for line in lines[first_command:])


def test_multi_worker_script_defaults_one_node_per_worker():
    recipe = validate_recipe({"strategy": {"kind": "multi_worker"},
                              "cluster": {"kind": "local", "workers": 3}})
    text = sbatch_script(recipe, recipe_path="r.yaml",
                         options=SlurmOptions(signal_s=0, requeue=False,
                                              kerasdist="/opt/venv/bin/python -m kerasdist"))
    assert "#SBATCH --nodes=3" in text and "#SBATCH --ntasks=3" in text
    assert "--signal" not in text and "--requeue" not in text
    assert _srun(text)[4:8] == ["/opt/venv/bin/python", "-m", "kerasdist", "fit"]
    assert "cluster.ps=" not in text


@pytest.mark.parametrize("raw, options, match", [
    ({"strategy": {"kind": "default"}}, SlurmOptions(), "runs in one process"),
    ({"strategy": {"kind": "multi_worker"}, "cluster": {"kind": "local", "workers": 2}},
     SlurmOptions(nodes=3), "--nodes must be within 1..2"),
    ({"strategy": {"kind": "multi_worker"}, "cluster": {"kind": "local", "workers": 2}},
     SlurmOptions(signal_s=-1), "--signal-s must be >= 0"),
])
def test_bad_exports_are_refused_naming_the_value(raw, options, match):
    with pytest.raises(RecipeError, match=match):
        sbatch_script(validate_recipe(raw), recipe_path="r.yaml", options=options)


def test_the_cli_refuses_a_bad_export_with_exit_2(capsys):
    assert main(["export", "slurm", "recipes/mnist_cnn_mwms.yaml", "--nodes", "5"]) == 2
    assert "nodes=5" in capsys.readouterr().err


def _step(monkeypatch, procid: int, num_tasks: int):
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(num_tasks))
    monkeypatch.setenv("SLURM_STEP_NODELIST", "n1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", str(num_tasks))


def test_a_step_whose_task_count_differs_from_the_recipe_is_refused(monkeypatch):
    _step(monkeypatch, 0, 3)
    with pytest.raises(ClusterError, match=r"3 task\(s\) but the recipe needs 4 \(cluster.workers=2 "
                                           r"\+ cluster.ps=1 \+ 1 chief\)"):
        tf_config_from_slurm(needs_ps=True, num_ps=1, num_workers=2)
    with pytest.raises(ClusterError, match="SLURM_STEP_NUM_TASKS=3"):
        tf_config_from_slurm(needs_ps=False, num_workers=2)
    assert tf_config_from_slurm(needs_ps=False, num_workers=3).num("worker") == 3


def _fake_commands(tmp_path, monkeypatch, *, requeue_flag: str = "1") -> os.PathLike:
    """``scontrol`` and ``scancel`` stand-ins that log their arguments to ``calls``."""
    calls = tmp_path / "calls"
    for name, body in (("scontrol", f'if [ "$1" = show ]; then echo "JobId=7 Requeue={requeue_flag} '
                                    'Restarts=0"; fi'), ("scancel", "")):
        path = tmp_path / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    return calls


def test_task_0_requeues_a_preempted_job_until_the_cap(tmp_path, monkeypatch):
    calls = _fake_commands(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm.after_preemption(2) == "requeued by kerasdist (restart 2 of at most 2)"
    assert "scontrol requeue 7" in calls.read_text()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert slurm.after_preemption(2) == "not requeued: max_restarts reached (2)"


def test_a_job_without_requeue_is_not_requeued(tmp_path, monkeypatch):
    calls = _fake_commands(tmp_path, monkeypatch, requeue_flag="0")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert "sbatch --requeue" in slurm.after_preemption(3)
    assert "requeue 7" not in calls.read_text()


def test_a_missing_slurm_command_is_bad_input(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClusterError, match="scancel on PATH"):
        slurm.check_commands("scancel")

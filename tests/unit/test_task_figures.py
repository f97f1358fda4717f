"""``trainer.profile``'s bad input (exit 2 naming the field, nothing written), the slow-task line of
the run summary, and every task's figures from the parameter-server epoch logs."""

from __future__ import annotations

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.keras.callbacks import ThroughputMeter
from kerasdist.training.result import slow_tasks

pytestmark = pytest.mark.timeout(120)

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: 1, verbose: 0, {trainer}}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


@pytest.mark.parametrize("trainer, said", [
    ("profile: {steps: [5, 5]}", "1 <= A < B. Received: steps=[5, 5]"),
    ("profile: {steps: [0, 2]}", "1 <= A < B. Received: steps=[0, 2]"),
    ("steps_per_epoch: 4, profile: {steps: [2, 9]}", "after the run's 4 steps"),
    ("profile: {steps: [2, 9]}", "after the run's 4 steps (1 epochs of 4)"),  # from the data
])
def test_a_bad_profile_range_is_exit_2_naming_it_and_writes_nothing(
        write_recipe, tmp_path, capsys, trainer, said):
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir, trainer=trainer))
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "trainer.profile.steps" in err and said in err, err
    assert not run_dir.exists()


def test_the_summary_names_a_task_more_than_1_5x_below_the_median():
    tasks = {"worker-0": {"steps_per_sec": [10.0, 12.0]}, "worker-1": {"steps_per_sec": [11.0]},
             "worker-2": {"steps_per_sec": [4.0, 5.0]}}
    (line,) = slow_tasks(tasks)
    assert line.startswith("slow task          worker-2: 4.50 steps/s, 2.4x below the median")
    tasks["worker-2"]["steps_per_sec"] = [8.0]  # 11 / 8 < 1.5: not named
    assert slow_tasks(tasks) == [] and slow_tasks({"chief-0": {"steps_per_sec": [1.0]}}) == []


def test_parameter_server_logs_give_each_worker_its_steps_and_rate():
    meter = ThroughputMeter(8, task="chief-0")
    meter.on_train_begin()
    for epoch in (0, 1):
        meter.on_epoch_begin(epoch)
        meter._epoch = [0.0, 2.0, 0]  # the epoch's training: from 0 s to its last step at 2 s
        meter.on_epoch_end(epoch, {"loss": 1.0, "ps_steps_worker_0": 30.0,
                                   "ps_steps_worker_1": 10.0})
    assert meter.tasks == {"worker-0": {"steps": [30, 60], "steps_per_sec": [15.0, 15.0]},
                           "worker-1": {"steps": [10, 20], "steps_per_sec": [5.0, 5.0]}}

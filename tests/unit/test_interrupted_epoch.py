"""An epoch ended by a stop request (SIGINT, SIGTERM, preemption) is not a finished epoch: no
``on_epoch_end`` for it (no CSVLogger row, no History entry), no validation; the checkpoint at
the step reached is still written and the re-run resumes there, so after an interrupt and a
re-run every epoch has one row, from a whole epoch."""

from __future__ import annotations

import json

import pytest
from interrupted_epoch_support import MODULE, rows

from kerasdist.cli import main
from kerasdist.errors import EXIT_INTERRUPTED
from kerasdist.keras import state_digest

pytestmark = pytest.mark.timeout(240)

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: 3, verbose: 0, checkpoint: {{async: {asynchronous}}}}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
callbacks: [{{class_name: CSVLogger, config: {{filename: train.csv, append: true}}}},
            {{class_name: 'kd_n5_interrupt:InterruptAt', config: {{step: 6, record: '{record}',
                                                           once: '{record}.sent'}}}}]
"""


@pytest.mark.parametrize("asynchronous", ["false", "true"], ids=["sync", "async"])
def test_an_interrupted_epoch_gets_no_row_no_validation_and_the_rerun_writes_each_epoch_once(
        write_recipe, tmp_path, capsys, monkeypatch, asynchronous):
    """With ``trainer.checkpoint.async`` too: the stop's checkpoint is whole when ``fit`` returns
    130, and the re-run restores it, verified, at its exact step."""
    (tmp_path / "kd_n5_interrupt.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir, record = tmp_path / "run", tmp_path / "validations.jsonl"
    recipe = str(write_recipe(LINEAR.format(run_dir=run_dir, record=record,
                                         asynchronous=asynchronous)))
    assert main(["fit", recipe]) == EXIT_INTERRUPTED  # 4 steps per epoch: stopped in epoch 2
    assert "checkpoint saved at global step 6" in capsys.readouterr().err
    assert [epoch for epoch, _ in rows(run_dir / "train.csv")] == [0]
    assert [json.loads(line) for line in record.read_text().splitlines()] == [4]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-4.index", "ckpt-6.index"]
    assert sorted(state_digest.read(run_dir / "checkpoints")) == ["ckpt-4", "ckpt-6"]
    assert main(["fit", recipe]) == 0
    found = rows(run_dir / "train.csv")
    assert [epoch for epoch, _ in found] == [0, 1, 2], found
    assert all(row["val_loss"] for _, row in found)
    assert [json.loads(line) for line in record.read_text().splitlines()] == [4, 8, 12]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["start_step"] == 6 and metrics["global_steps"] == 12
    assert metrics["restore_verified"] is True

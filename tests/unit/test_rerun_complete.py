"""Issue 42 item 4: re-running a run that already trained every epoch says so in one line, with
how to start afresh; a resumed run whose ``callbacks`` changed is refused naming the field, as a
changed schedule is, and nothing is written."""

from __future__ import annotations

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

pytestmark = pytest.mark.timeout(240)

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: {epochs}, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
callbacks: {callbacks}
"""
EARLY = "[{{class_name: EarlyStopping, config: {{monitor: loss, patience: {patience}}}}}]"


def _recipe(write_recipe, run_dir, *, epochs, callbacks="[]"):
    return str(write_recipe(LINEAR.format(run_dir=run_dir, epochs=epochs, callbacks=callbacks)))


def _files(run_dir):
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}


def test_rerunning_a_complete_run_says_so_once_and_how_to_start_afresh(write_recipe, tmp_path,
                                                                      capsys):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir, epochs=2)
    assert main(["fit", recipe]) == 0
    assert "already holds a complete run" not in capsys.readouterr().err
    assert main(["fit", recipe]) == 0
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert err.count("already holds a complete run") == 1, err
    assert f"output.run_dir '{run_dir}' already holds a complete run (2 epoch(s), global step 8; " \
           "trainer.epochs=2): nothing to train" in err, err
    assert "To start afresh, add --overwrite" in err
    assert "throughput         - (nothing trained in this run)" in captured.out
    assert main(["fit", recipe, "--overwrite"]) == 0
    assert "already holds a complete run" not in capsys.readouterr().err


def test_a_changed_callback_on_resume_exits_2_naming_the_field_and_writes_nothing(
        write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=1,
                                callbacks=EARLY.format(patience=1))]) == 0
    before = _files(run_dir)
    capsys.readouterr()
    changed = _recipe(write_recipe, run_dir, epochs=2, callbacks=EARLY.format(patience=3))
    assert main(["fit", changed]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "callbacks.0: changed since the checkpoints" in err, err
    assert "'patience': 1" in err and "Received: callbacks.0={'class_name': 'EarlyStopping'" in err
    added = _recipe(write_recipe, run_dir, epochs=2, callbacks=(
        "[{class_name: EarlyStopping, config: {monitor: loss, patience: 1}}, TerminateOnNaN]"))
    assert main(["fit", added]) == EXIT_BAD_INPUT
    assert "callbacks.1: changed since" in capsys.readouterr().err
    complete = _recipe(write_recipe, run_dir, epochs=1, callbacks="[]")  # a finished run too
    assert main(["fit", complete]) == EXIT_BAD_INPUT
    assert "callbacks.0: changed since" in capsys.readouterr().err
    assert _files(run_dir) == before
    same = _recipe(write_recipe, run_dir, epochs=2, callbacks=EARLY.format(patience=1))
    assert main(["fit", same]) == 0


def test_a_resumed_run_keeps_the_csv_rows_of_the_epochs_before_the_interrupt(write_recipe,
                                                                              tmp_path):
    import csv

    run_dir = tmp_path / "run"
    logger = "[{class_name: CSVLogger, config: {filename: train.csv}}]"
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=1, callbacks=logger)]) == 0
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=3, callbacks=logger)]) == 0
    with open(run_dir / "train.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["epoch"] for row in rows] == ["0", "1", "2"], rows

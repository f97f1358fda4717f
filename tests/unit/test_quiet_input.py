"""Issue 42 item 5: Keras's "Your input ran out of data" warning, which Keras 3.15 gives at the
normal end of every evaluation input of unknown size (keras#23360), is not printed by a csv run;
it is kept where evaluation steps were asked for; and the probe fails once upstream fixes it."""

from __future__ import annotations

import warnings

import pytest
import yaml

from kerasdist._compat import keras_23360_exhausted_warning as quiet
from kerasdist.cli import main
from kerasdist.data.writers import write_csv_splits

pytestmark = pytest.mark.timeout(240)


def test_upstream_keras_23360_still_warns_at_the_end_of_an_input_of_unknown_size():
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    unsized = tf.data.Dataset.range(8).filter(lambda i: True).map(
        lambda i: (tf.cast([i], tf.float32), tf.cast([i], tf.float32))).batch(4)
    with pytest.warns(UserWarning, match=quiet.MESSAGE):
        model.evaluate(unsized, verbose=0)
    assert quiet.bug_present(), ("upstream fixed keras#23360 (no warning without steps): remove "
                                 "kerasdist/_compat/keras_23360_exhausted_warning.py")


def test_the_warning_is_kept_where_evaluation_steps_were_asked_for():
    with pytest.warns(UserWarning, match=quiet.MESSAGE):
        with quiet.quiet_end_of_input(steps_declared=True):
            warnings.warn("Your input ran out of data; interrupting training.", stacklevel=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet.quiet_end_of_input(steps_declared=False):
            warnings.warn("Your input ran out of data; interrupting training.", stacklevel=1)
            warnings.warn("another warning", stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]


def test_a_csv_run_prints_no_ran_out_of_data_warning(tmp_path, recwarn, capsys):
    rows = {split: [[f"{i}.5", f"{-i}", i % 2] for i in range(count)]
            for split, count in (("train", 90), ("test", 30))}
    write_csv_splits(tmp_path / "csv", ["a", "b", "y"], rows, files_per_split=3)
    recipe = {"model": {"name": "kerasdist.models.examples:tabular_mlp",
                        "params": {"num_features": 2, "num_classes": 2, "hidden": 4},
                        "loss": "sparse_categorical_crossentropy_from_logits",
                        "metrics": ["accuracy"]},
              "data": {"source": {"kind": "csv", "path": str(tmp_path / "csv"), "label": "y"},
                       "train_split": "train", "eval_split": "test", "batch_size": 10},
              "trainer": {"epochs": 2, "verbose": 0},
              "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["fit", str(tmp_path / "r.yaml")]) == 0
    printed = capsys.readouterr()
    assert "held-out accuracy" in printed.out  # it evaluated (validation and the final one)
    ran_out = [str(w.message) for w in recwarn if "ran out of data" in str(w.message)]
    assert not ran_out and "ran out of data" not in printed.err, ran_out

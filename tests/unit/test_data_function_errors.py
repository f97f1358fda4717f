"""Issue 41: an exception raised by a user's data function (its ``from_generator`` generator)
after the counting and sampling passes, mid-training, ends the run with exit code 2 and one line
naming the function, not TensorFlow's tracebacks."""

from __future__ import annotations

import textwrap

import yaml

from kerasdist._native_log import NoiseDropper
from kerasdist.cli import main

MODULE = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    def raising_late(split):
        def gen():
            for i in range(400):
                if i == 40:  # the check reads the first batch only (steps_per_epoch is set)
                    raise RuntimeError("the user's file went away")
                yield np.full((4,), i % 3, np.float32), np.int64(i % 2)
        spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(gen, output_signature=spec)

    def tabular(**kwargs):
        import keras
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(2)(inputs))
""")


def test_a_generator_that_raises_mid_training_exits_2_naming_the_function(tmp_path, monkeypatch,
                                                                        capsys):
    (tmp_path / "user_late_mod.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "user_late_mod:tabular",
                  "loss": "sparse_categorical_crossentropy_from_logits"},
        "data": {"source": {"kind": "python", "function": "user_late_mod:raising_late"},
                 "train_split": "train", "eval_split": None, "batch_size": 4,
                 "shuffle_buffer": 0},
        "trainer": {"epochs": 1, "steps_per_epoch": 20, "verbose": 0},
        "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}), encoding="utf-8")
    assert main(["fit", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert ("data.source.function 'user_late_mod:raising_late' failed while its split 'train' "
            "was read: RuntimeError: the user's file went away") in err, err
    assert "Traceback" not in err and "UnknownError" not in err, err


def test_the_native_warning_of_a_python_function_that_raised_is_dropped_with_its_traceback():
    """TensorFlow's executor writes the Python traceback twice (op_kernel.cc, local_rendezvous.cc)
    from C++; the console filter drops both, and keeps the lines around them."""
    text = (
        "before\n"
        "W0000 00:00:1795804476.387587   10354 op_kernel.cc:1845] UNKNOWN: RuntimeError: gone\n"
        "Traceback (most recent call last):\n\n"
        '  File "/x/script_ops.py", line 269, in __call__\n'
        "    ret = func(*args)\n"
        "          ^^^^^^^^^^^\n\n"
        "RuntimeError: gone\n\n\n"
        "W0000 00:00:1795804476.388018   10371 local_rendezvous.cc:412] Local rendezvous is "
        "aborting with status: UNKNOWN: RuntimeError: gone\n"
        "Traceback (most recent call last):\n\n"
        '  File "/x/gen.py", line 8, in gen\n'
        "RuntimeError: gone\n\n"
        "\t [[{{node PyFunc}}]]\n"
        "\t [[IteratorGetNext]]\n"
        "kerasdist: error: data.source.function 'm:f' failed\n"
        "W0000 00:00:1795804476.388018   10371 op_kernel.cc:1845] UNKNOWN: not a Python error\n")
    dropper = NoiseDropper()
    kept = [line for line in text.splitlines(keepends=True) if dropper.keep(line)]
    assert kept == ["before\n", "kerasdist: error: data.source.function 'm:f' failed\n",
                    "W0000 00:00:1795804476.388018   10371 op_kernel.cc:1845] UNKNOWN: not a "
                    "Python error\n"]

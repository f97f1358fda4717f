"""Recipes on streaming sources train end to end in one process, resume mid-epoch at the exact
step (the same weights, bit for bit, as an uninterrupted run), and bad data exits 2 before anything
is written."""

from __future__ import annotations

import csv
import json
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from kerasdist import fit
from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import validate_recipe
from kerasdist.data.writers import write_csv_splits, write_example_tfrecords, write_image_folder
from kerasdist.training.evaluator import Evaluator

pytestmark = pytest.mark.integration
MLP = "kerasdist.models.examples:tabular_mlp"
CNN = "kerasdist.models.examples:small_image_cnn"
LOGITS = "sparse_categorical_crossentropy_from_logits"


def _csv(folder, n=480):
    rng = np.random.default_rng(1)
    rows = {}
    for split, count in (("train", n), ("test", 160)):
        a, b = rng.normal(size=(2, count))
        color = rng.choice(["red", "green", "blue"], count)
        label = ((a + 1.5 * (color == "red")) > 0.5).astype(int)
        rows[split] = [[f"{10 * x + 3:.4f}", f"{y:.4f}", c, t]
                       for x, y, c, t in zip(a, b, color, label, strict=True)]
    write_csv_splits(folder, ["a", "b", "color", "y"], rows, files_per_split=3)
    return ({"source": {"kind": "csv", "path": str(folder), "label": "y", "categorical": ["color"]}},
            {"name": MLP, "params": {"num_features": 6, "dropout": 0.0}})


def _images(folder):
    rng = np.random.default_rng(2)
    for split, n in (("train", 96), ("test", 32)):
        labels = np.arange(n) % 4
        x = rng.integers(0, 60, (n, 12, 12), dtype=np.uint8)
        for k in range(4):  # class k: a bright quadrant k
            r, c = divmod(k, 2)
            x[labels == k, 6 * r:6 * r + 6, 6 * c:6 * c + 6] += 180
        write_image_folder(folder, split, x, labels, size=(16, 16), rgb=True)
    return ({"source": {"kind": "image_folder", "path": str(folder), "image_size": [16, 16]}},
            {"name": CNN, "params": {"image_size": [16, 16], "channels": 3, "num_classes": 4,
                                "dropout": 0.0}})


def _tfrecords(folder):
    spec = {"pixels": {"dtype": "string", "shape": [8, 8, 1], "encoding": "png"},
            "target": {"dtype": "int64"}}
    for split, n in (("train", 320), ("test", 24)):
        for k in range(2):
            examples = [{"pixels": tf.io.encode_png(np.full((8, 8, 1), 80 * (i % 3), np.uint8))
                         .numpy(), "target": i % 3} for i in range(k, n, 2)]
            write_example_tfrecords(folder / f"{split}-{k}.tfrecord", examples,
                                    {"pixels": "string", "target": "int64"})
    return ({"source": {"kind": "tfrecord", "path": str(folder), "features": spec, "label": "target"}},
            {"name": CNN, "params": {"image_size": [8, 8], "channels": 1, "num_classes": 3}})


def _sliced_tfrecords(folder):
    """The default (MNIST) layout in 2 files, trained and evaluated on slices of one split."""
    from kerasdist.data.readers import write_tfrecord

    labels = np.arange(384) % 3
    images = np.repeat((80 * labels).astype(np.uint8)[:, None, None], 8, 1).repeat(8, 2)
    for k in range(2):
        write_tfrecord(images[k::2], labels[k::2], folder / f"mixed-{k}.tfrecord")
    return ({"source": {"kind": "tfrecord", "path": str(folder)}, "train_split": "mixed[:75%]",
             "eval_split": "mixed[75%:]"},
            {"name": CNN, "params": {"image_size": [8, 8], "channels": 1, "num_classes": 3}})


def _python(folder, monkeypatch):
    (folder / "user_stream_data.py").write_text(textwrap.dedent("""
        import tensorflow as tf

        def make(split, input_context=None):
            n = 400 if split == "train" else 100
            x = tf.random.stateless_normal((n, 2), seed=(1, 2 if split == "train" else 3))
            y = tf.cast(x[:, 0] + x[:, 1] > 0, tf.int64)
            ds = tf.data.Dataset.from_tensor_slices((x, y))
            if input_context is not None:
                ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return ds

        def broken(split):
            raise RuntimeError("no such table")
    """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    return ({"source": {"kind": "python", "function": "user_stream_data:make"}},
            {"name": MLP, "params": {"num_features": 2, "dropout": 0.0}})


def _make(kind, tmp_path, monkeypatch):
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "python":
        return _python(folder, monkeypatch)
    return {"csv": _csv, "image_folder": _images, "tfrecord": _tfrecords,
            "tfrecord_slices": _sliced_tfrecords}[kind](folder)


def _recipe(tmp_path, data, model, **trainer):
    return validate_recipe({
        "model": {**model, "loss": LOGITS, "metrics": ["accuracy"]},
        "data": {"train_split": "train", "eval_split": "test", "batch_size": 16, **data},
        "trainer": {"epochs": 3, "verbose": 0, "deterministic": True, **trainer},
        "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind, gate", [
    ("csv", 0.85), pytest.param("image_folder", 0.9, marks=pytest.mark.slow),  # 37 s
    ("tfrecord", 0.9), ("tfrecord_slices", 0.9), ("python", 0.85)])
def test_each_streaming_source_trains_a_recipe(kind, gate, tmp_path, monkeypatch):
    data, model = _make(kind, tmp_path, monkeypatch)
    result = fit(_recipe(tmp_path, data, model))
    assert result.extra["global_steps"] == 3 * result.extra["steps_per_epoch"]
    assert result.evaluation["accuracy"] >= gate, result.evaluation
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["evaluation"]["accuracy"] == pytest.approx(result.evaluation["accuracy"])
    assert (tmp_path / "run" / "data" / "csv-schema.json").exists() == (kind == "csv")


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, at_step):
        super().__init__()
        self.at_step, self.step = at_step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy())
        if self.step == self.at_step:
            raise KeyboardInterrupt


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["csv", "image_folder"])
def test_a_run_interrupted_mid_epoch_resumes_at_its_exact_step(kind, tmp_path, monkeypatch):
    """Same weights (sha256) as the run that was never interrupted: the resumed stream neither
    repeats nor skips a batch, and the csv vocabulary comes from the run directory."""
    data, model = _make(kind, tmp_path, monkeypatch)
    trainer = {"epochs": 2, "checkpoint": {"every_steps": 2}}
    straight = fit(_recipe(tmp_path / "a", data, model, **trainer))
    steps = straight.extra["steps_per_epoch"]
    recipe = _recipe(tmp_path / "b", data, model, **trainer)
    with pytest.raises(KeyboardInterrupt):
        fit(recipe, callbacks=[_Interrupt(steps + 4)])  # mid-epoch 2, just after a backup
    resumed = fit(recipe)
    assert resumed.extra["start_step"] == steps + 4 and resumed.extra["restore_verified"] is True
    assert resumed.extra["weights_sha256"] == straight.extra["weights_sha256"]


@pytest.mark.timeout(240)
def test_the_sidecar_evaluator_uses_the_csv_vocabulary_the_run_saved(tmp_path, monkeypatch):
    """``kerasdist evaluate`` after the training files changed gets the run's own figures: it
    reads the vocabularies and column statistics from the run directory, not the files."""
    data, model = _csv(tmp_path / "csv")
    result = fit(_recipe(tmp_path, data, model))
    # rows added after the run: a colour that sorts first ('amber' would take id 1 and move
    # blue/green/red one id up) and other numbers (other mean and std)
    with open(tmp_path / "csv" / "train-000.csv", "a", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["90.0", "7.0", "amber", 0]] * 200)
    evaluated = Evaluator(tmp_path / "run").evaluate_saved_model()
    assert evaluated["accuracy"] == pytest.approx(result.evaluation["accuracy"], abs=1e-6)
    assert evaluated["loss"] == pytest.approx(result.evaluation["loss"], rel=1e-5)


def _write(tmp_path, data, model) -> str:
    recipe = {"model": {**model, "loss": LOGITS}, "data": {"train_split": "train",
              "eval_split": "test", "batch_size": 16, **data},
              "trainer": {"epochs": 1, "verbose": 0},
              "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return str(path)


def _bad(case, tmp_path, monkeypatch):
    if case == "spec":
        data, model = _tfrecords(tmp_path / "tfr")
        data["source"]["features"] = {**data["source"]["features"],
                                      "pixels": {"dtype": "string", "shape": [28, 28],
                                                 "encoding": "raw"}}
        return data, model, "train-0.tfrecord' (record 1)"
    if case == "label":
        data, model = _csv(tmp_path / "csv")
        data["source"]["label"] = "price"
        return data, model, "data.source.label: column 'price' is not in the header"
    if case == "empty":
        (tmp_path / "img" / "train").mkdir(parents=True)
        return ({"source": {"kind": "image_folder", "path": str(tmp_path / "img")}},
                {"name": CNN, "params": {}}, "holds no class folders")
    _, model = _python(tmp_path, monkeypatch)
    function = {"import": "no_such_module_q:make", "raises": "user_stream_data:broken"}[case]
    needle = {"import": "data.source.function: cannot import module 'no_such_module_q'",
              "raises": "raised RuntimeError for split 'train': no such table"}[case]
    return {"source": {"kind": "python", "function": function}}, model, needle


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", ["spec", "label", "empty", "import", "raises"])
def test_bad_streaming_data_exits_2_before_anything_is_written(case, tmp_path, capsys, monkeypatch):
    (tmp_path / "d").mkdir()
    data, model, needle = _bad(case, tmp_path / "d", monkeypatch)
    code = main(["fit", _write(tmp_path, data, model)])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


ENDLESS = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    def endless(split, input_context=None):
        '''An endless stream (cardinality UNKNOWN): y = 2 x + 1 for train, 64 examples for test.'''
        def gen():
            rng = np.random.default_rng(0 if split == "train" else 1)
            while True:
                x = rng.normal(size=(1,)).astype("float32")
                yield x, np.float32(2 * x[0] + 1)
        spec = (tf.TensorSpec((1,), tf.float32), tf.TensorSpec((), tf.float32))
        ds = tf.data.Dataset.from_generator(gen, output_signature=spec)
        return ds if split == "train" else ds.take(64)
""")


@pytest.mark.timeout(180)
def test_an_endless_python_source_trains_with_steps_per_epoch(tmp_path, monkeypatch, capsys):
    """Issue 39 point 3: an endless ``from_generator`` split is a normal thing to train on with
    ``trainer.steps_per_epoch``: no counting pass (it never ended before), the data checks read its
    first batches only."""
    (tmp_path / "endless_user_data.py").write_text(ENDLESS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "linear"}, "optimizer": {"name": "sgd", "learning_rate": 0.1},
        "data": {"source": {"kind": "python", "function": "endless_user_data:endless"},
                 "train_split": "train", "eval_split": "test", "batch_size": 16},
        "trainer": {"epochs": 2, "steps_per_epoch": 5, "verbose": 0},
        "output": {"run_dir": str(run_dir), "tensorboard": False}}))
    assert main(["fit", str(recipe)]) == 0, capsys.readouterr().err[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_steps"] == 10
    assert (run_dir / "model.keras").is_file()
    # without steps_per_epoch the split is counted, at most MAX_COUNTED_EXAMPLES: exit 2
    from kerasdist.data.sources import functions

    monkeypatch.setattr(functions, "MAX_COUNTED_EXAMPLES", 500)
    code = main(["fit", str(recipe), "--set", "trainer.steps_per_epoch=null",
                 "--set", f"output.run_dir={tmp_path / 'run2'}"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err[-2000:]
    assert "trainer.steps_per_epoch" in err and "endless_user_data:endless" in err
    assert not (tmp_path / "run2").exists()


@pytest.mark.timeout(240)
def test_a_csv_runs_inference_model_predicts_raw_rows_to_the_summarys_metric(tmp_path,
                                                                             monkeypatch):
    """Issue 41, item 3: the csv preprocessing (standardization with the training split's
    statistics, one-hot vocabularies) is saved as Keras layers in front of the trained model:
    ``inference_model.keras`` takes the raw test csv's columns and scores the summary's
    held-out accuracy."""
    data, model = _make("csv", tmp_path, monkeypatch)
    result = fit(_recipe(tmp_path, data, model))
    served = keras.models.load_model(tmp_path / "run" / "inference_model.keras")
    columns: dict[str, list] = {}
    for path in sorted((tmp_path / "csv").glob("test-*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                for key, value in row.items():
                    columns.setdefault(key, []).append(value)
    labels = np.asarray(columns.pop("y"), np.int64)
    raw = {"a": np.asarray(columns["a"], np.float32)[:, None],
           "b": np.asarray(columns["b"], np.float32)[:, None],
           "color": tf.constant([[c] for c in columns["color"]])}  # Keras takes no str arrays
    predicted = served.predict(raw, batch_size=64, verbose=0).argmax(axis=-1)
    accuracy = float((predicted == labels).mean())
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())["evaluation"]
    assert len(labels) == 160 and accuracy == pytest.approx(written["accuracy"], abs=1e-6)
    assert accuracy == pytest.approx(result.evaluation["accuracy"], abs=1e-6) and accuracy > 0.85

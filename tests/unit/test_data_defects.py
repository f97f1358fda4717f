"""Issue 41, item 4: the data defects a red-team run found (silently wrong data, crashes where exit
code 2 was promised, messages that did not locate the problem), each pinned by a test."""

from __future__ import annotations

import csv
import logging
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from kerasdist.config import validate_recipe
from kerasdist.data.writers import write_example_tfrecords
from kerasdist.errors import DataError

COLORS = ("red", "green", "blue")


def _ctx():
    return tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                      num_replicas_in_sync=1)


def _recipe(tmp_path, data, **trainer):
    data = {"train_split": "train", "eval_split": "test", "batch_size": 8, "shuffle_buffer": 0,
            **data}
    return validate_recipe({"data": data, "trainer": trainer,
                            "output": {"run_dir": str(tmp_path / "run")}})


def _source(data, **fields):
    """``data`` with ``fields`` set in its ``source`` mapping (a kind's own fields live there)."""
    return {**data, "source": {**data["source"], **fields}}


def _build(recipe):
    from kerasdist.data.inputs import build_data

    return build_data(recipe, replicas=1)


def _all(ds):
    xs, ys = [], []
    for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
    return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------------------------------------------ csv
def _rows(n):
    return [[f"{i}.5", f"{-3 * i}", COLORS[i % 3], i % 2] for i in range(n)]


def _write(path, header, rows, *, bom=False):
    with open(path, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _csv(folder, *, test_header=("a", "b", "color", "y"), bom=False):
    folder.mkdir(parents=True, exist_ok=True)
    header = ["a", "b", "color", "y"]
    _write(folder / "train-000.csv", header, _rows(40), bom=bom)
    order = [header.index(c) for c in test_header if c in header]
    _write(folder / "test-000.csv", list(test_header),
           [[row[k] for k in order] + (["9"] if len(test_header) > 4 else [])
            for row in _rows(16)], bom=bom)
    return {"source": {"kind": "csv", "path": str(folder), "label": "y", "categorical": ["color"]}}


def test_csv_eval_columns_in_another_order_are_matched_by_name(tmp_path):
    same = _build(_recipe(tmp_path, _csv(tmp_path / "same")))
    other = _build(_recipe(tmp_path / "o", _csv(tmp_path / "other",
                                                test_header=("y", "color", "b", "a"))))
    expected, reordered = _all(same.eval_fn(_ctx())), _all(other.eval_fn(_ctx()))
    np.testing.assert_allclose(reordered[0], expected[0], rtol=1e-6)
    assert reordered[1].tolist() == expected[1].tolist()


@pytest.mark.parametrize("header, needle", [
    (("a", "color", "y"), "has no column 'b', which the training split's"),
    (("a", "b", "color", "y", "extra"), "has a column 'extra' which the training split's"),
])
def test_csv_missing_or_extra_column_is_refused_naming_file_and_column(tmp_path, header, needle):
    with pytest.raises(DataError) as raised:
        _build(_recipe(tmp_path, _csv(tmp_path / "csv", test_header=header)))
    assert needle in str(raised.value) and "test-000.csv" in str(raised.value)


def test_csv_with_a_utf8_bom_reads_its_label_column(tmp_path):
    built = _build(_recipe(tmp_path, _source(_csv(tmp_path / "csv", bom=True), label="a",
                                             categorical=["color"], label_dtype="float32")))
    x, y = _all(built.eval_fn(_ctx()))
    assert x.shape == (16, 2 + 4) and y[:3].tolist() == [0.5, 1.5, 2.5]


@pytest.mark.parametrize("value, dtype, needles", [
    ("cat", "int64", ["column 'y' of '", "train-000.csv' line 7 is not an integer class id",
                      "Received: 'cat'"]),
    ("0.25", "int64", ["line 7", "Set data.source.label_dtype: float32", "Received: '0.25'"]),
    ("nan", "float32", ["line 7 is not a finite number", "Received: 'nan'"]),
])
def test_csv_bad_label_names_file_line_column_and_value(tmp_path, value, dtype, needles):
    data = _csv(tmp_path / "csv")
    path = tmp_path / "csv" / "train-000.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[6] = lines[6].rsplit(",", 1)[0] + "," + value
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as raised:
        _build(_recipe(tmp_path, _source(data, label_dtype=dtype)))
    assert all(n in str(raised.value) for n in needles), str(raised.value)


def test_csv_bad_value_in_the_eval_split_is_named_before_training(tmp_path):
    data = _csv(tmp_path / "csv")
    path = tmp_path / "csv" / "test-000.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[3] = "x1," + lines[3].split(",", 1)[1]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"column 'a' of '.*test-000.csv' line 4 .* "
                       r"Received: 'x1'"):
        _build(_recipe(tmp_path, data))


def test_csv_statistics_are_stable_and_a_huge_value_is_refused(tmp_path):
    folder = tmp_path / "csv"
    folder.mkdir()
    values = 1e9 + np.arange(40.0)  # a sum of squares cancels: its std came out wrong
    _write(folder / "train-000.csv", ["a", "y"], [[repr(float(v)), i % 2] for i, v in enumerate(values)])
    _write(folder / "test-000.csv", ["a", "y"], [[repr(float(values[0])), 0]])
    built = _build(_recipe(tmp_path, {"source": {"kind": "csv", "path": str(folder), "label": "y"},
                                      "batch_size": 4}))
    import json

    schema = json.loads(built.artifacts["data/csv-schema.json"])
    assert schema["mean"][0] == pytest.approx(values.mean(), rel=1e-15)
    assert schema["std"][0] == pytest.approx(values.std(), rel=1e-9)
    _write(folder / "train-000.csv", ["a", "y"], [["1.0", 0], ["1e200", 1]] * 8)
    with pytest.raises(DataError, match=r"column 'a' of '.*train-000.csv' line 3 is not a finite "
                       r"number \(as float32.*Received: '1e200'"):
        _build(_recipe(tmp_path / "again", {"source": {"kind": "csv", "path": str(folder),
                                                       "label": "y"}, "batch_size": 4}))


# --------------------------------------------------------------------------------- image_folder
def _png(path, image):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_png(image).numpy())


def _tricky_folder(root):
    """Classes 'a' and 'b', a hidden folder beside them, images in a class's sub-folder, an
    upper-case extension and a file that is no image."""
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        for k in range(6):
            _png(root / split / "a" / f"{k}.png", rng.integers(0, 255, (6, 5, 3), dtype=np.uint8))
            _png(root / split / "b" / "deeper" / f"{k}.PNG",
                 rng.integers(0, 255, (6, 5, 3), dtype=np.uint8))
        _png(root / split / ".ipynb_checkpoints" / "0.png",
             rng.integers(0, 255, (6, 5, 3), dtype=np.uint8))
        (root / split / "a" / "notes.txt").write_text("not an image")


def test_image_folder_reads_what_keras_image_dataset_from_directory_reads(tmp_path):
    import keras

    _tricky_folder(tmp_path / "img")
    built = _build(_recipe(tmp_path, {"source": {"kind": "image_folder", "path": str(tmp_path / "img"),
                                                 "image_size": [6, 5], "channels": 3},
                                      "normalize": False}))
    ours = _all(built.eval_fn(_ctx()))
    theirs = keras.utils.image_dataset_from_directory(
        tmp_path / "img" / "test", image_size=(6, 5), shuffle=False, batch_size=4)
    assert theirs.class_names == ["a", "b"]
    reference = _all(theirs)

    def keyed(x, y):
        return sorted((int(label), np.round(image, 3).tobytes()) for image, label in zip(x, y, strict=True))

    assert len(ours[1]) == 12 and keyed(*ours) == keyed(*reference)


def test_image_size_and_channels_default_to_the_first_image_and_mixed_sizes_are_refused(
        tmp_path, caplog):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for k in range(8):
            _png(tmp_path / "img" / split / str(k % 2) / f"{k}.png",
                 rng.integers(0, 255, (8, 8, 1), dtype=np.uint8))
    data = {"source": {"kind": "image_folder", "path": str(tmp_path / "img")}}
    with caplog.at_level(logging.INFO, logger="kerasdist"):
        built = _build(_recipe(tmp_path, data, steps_per_epoch=1))
    x, _ = _all(built.eval_fn(_ctx()))
    assert x.shape == (8, 8, 8, 1)
    assert "data.source.image_size [8, 8] and data.source.channels 1 taken from the first training image" \
        in caplog.text
    _png(tmp_path / "img" / "test" / "0" / "big.png", np.zeros((9, 8, 1), np.uint8))
    with pytest.raises(DataError, match=r"big.png' is 9x8, other images 8x8 .* need "
                       "data.source.image_size"):
        _build(_recipe(tmp_path, data))
    resized = _build(_recipe(tmp_path, _source(data, image_size=[4, 4])))
    assert _all(resized.eval_fn(_ctx()))[0].shape == (9, 4, 4, 1)


# ----------------------------------------------------------------------------- dtypes, python
PY_MODULE = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    def strings(split):
        return tf.data.Dataset.from_tensor_slices((["a b", "c d"] * 8, [0, 1] * 8))

    def string_labels(split):
        return tf.data.Dataset.from_tensor_slices((np.ones((16, 4), "float32"), ["x", "y"] * 8))

    def raising(split):
        def gen():
            for i in range(40):
                if i == 20:
                    raise RuntimeError("the user's file went away")
                yield np.ones(4, "float32"), np.int64(i % 2)
        spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(gen, output_signature=spec)
""")


def _python(tmp_path, monkeypatch, function, **extra):
    (tmp_path / "user_defect_mod.py").write_text(PY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return _recipe(tmp_path, {"source": {"kind": "python", "function": f"user_defect_mod:{function}"},
                              "batch_size": 4, **extra})


def _dense_model(width=4):
    import keras

    inputs = keras.Input((width,))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs))


@pytest.mark.parametrize("function, needle", [
    ("strings", "data.train_split 'train' of data.source 'python': examples are strings"),
    ("string_labels", "data.train_split 'train' of data.source 'python': labels are strings"),
])
def test_string_features_or_labels_are_refused_naming_the_field(tmp_path, monkeypatch, function,
                                                                 needle):
    from kerasdist.training.checks import check_inputs

    recipe = _python(tmp_path, monkeypatch, function)
    with pytest.raises(DataError) as raised:
        check_inputs(recipe, _dense_model())
    assert needle in str(raised.value), str(raised.value)


def test_an_error_raised_by_a_user_generator_is_a_data_error(tmp_path, monkeypatch):
    recipe = _python(tmp_path, monkeypatch, "raising")
    with pytest.raises(DataError, match=r"data.source.function 'user_defect_mod:raising'.*"
                       "the user's file went away"):
        _build(recipe)
    from kerasdist.training.checks import check_inputs

    with pytest.raises(DataError, match="the user's file went away"):
        check_inputs(recipe, _dense_model())


# ------------------------------------------------------------------------------------ tfrecord
def _records(folder, *, width=13, n=20):
    examples = [{"x": np.arange(width, dtype=np.float32) + i, "label": i % 2} for i in range(n)]
    for split in ("train", "test"):
        write_example_tfrecords(folder / f"{split}.tfrecord", examples,
                                {"x": "float32", "label": "int64"})
    return {"source": {"kind": "tfrecord", "path": str(folder),
                       "features": {"x": {"dtype": "float32", "shape": [12]},
                                    "label": {"dtype": "int64"}}}}


def test_a_spec_of_another_size_than_the_records_says_both_sizes(tmp_path):
    with pytest.raises(DataError) as raised:
        _build(_recipe(tmp_path, _records(tmp_path / "tfr")))
    text = str(raised.value)
    assert "feature 'x'" in text and "13 values" in text and "shape [12] (12 values)" in text, text


def test_a_truncated_tfrecord_is_named_with_its_file(tmp_path):
    data = _records(tmp_path / "tfr", width=12)
    path = tmp_path / "tfr" / "train.tfrecord"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(DataError) as raised:
        _build(_recipe(tmp_path, data))
    assert str(path) in str(raised.value) and "truncated or corrupt" in str(raised.value)
    text = str(raised.value).split(f"'{path}'")[1]  # no TF op name or stray quote (issue 52 N20)
    assert "[Op:" not in text and "name:" not in text and "'" not in text.split("Received")[0], text


def test_a_truncated_tfrecord_of_the_default_layout_is_named_with_its_file(tmp_path):
    from kerasdist.data.readers import write_tfrecord

    x, y = np.zeros((20, 28, 28), np.uint8), np.arange(20) % 10
    for split in ("train", "test"):
        write_tfrecord(x, y, tmp_path / "tfr" / f"{split}.tfrecord")
    path = tmp_path / "tfr" / "test.tfrecord"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(DataError) as raised:
        _build(_recipe(tmp_path, {"source": {"kind": "tfrecord", "path": str(tmp_path / "tfr")}}))
    assert str(path) in str(raised.value), str(raised.value)


# ---------------------------------------------------------------------------------------- paths
def test_a_relative_path_that_does_not_exist_names_the_directory_searched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"data.source.path does not exist \(a relative path is resolved "
                       rf"against the working directory, {tmp_path}\)"):
        _recipe(tmp_path, {"source": {"kind": "csv", "path": "no/such/folder", "label": "y"}})
    (tmp_path / "csvs").mkdir()
    with pytest.raises(DataError, match=rf"no files for split 'train' .* in 'csvs' \(relative to "
                       rf"the working directory {tmp_path}\)"):
        _build(_recipe(tmp_path, {"source": {"kind": "csv", "path": "csvs", "label": "y"}}))


def test_a_csv_split_is_read_once_by_the_checks_before_training(tmp_path, monkeypatch):
    """The launch preflight, the data checks and the stream's build each open the csv source;
    each split's pre-pass (every numeric cell parsed) runs once in the process, not once each
    (three times for the training split before this was cached)."""
    from kerasdist.data.inputs import examples_per_worker
    from kerasdist.data.sources import csv as csv_source
    from kerasdist.training.checks import check_inputs

    parsed = []
    real = csv_source._float
    monkeypatch.setattr(csv_source, "_float", lambda *a, **k: parsed.append(1) or real(*a, **k))
    recipe = _recipe(tmp_path, _source(_csv(tmp_path / "csv"), numeric=["a", "b"]))
    examples_per_worker(recipe)
    check_inputs(recipe, _dense_model(width=2 + 4))
    _build(recipe)
    assert len(parsed) == 2 * (40 + 16)  # two numeric columns, 40 training + 16 test rows, once
    (tmp_path / "csv" / "test-000.csv").write_text("a,b,color,y\n1,2,red,0\n", encoding="utf-8")
    _build(recipe)  # a file rewritten is read again
    assert len(parsed) == 2 * (40 + 16) + 2


@pytest.mark.parametrize("content", [b"not an npz at all\n", b"\x93NUMPY\x01\x00v\x00"])
def test_a_file_that_is_not_an_npz_archive_is_named_so(tmp_path, content):
    """Not numpy's pickle warning, which nudges towards allow_pickle (issue 52 N18)."""
    from kerasdist.data.readers import load_npz_split

    path = tmp_path / "mnist.npz"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"is not an npz archive \(a zip of .npy arrays") as err:
        load_npz_split(path, "train")
    assert "pickle" not in str(err.value)
    good = tmp_path / "good.npz"
    np.savez(good, x_train=np.zeros((2, 3)), y_train=np.array([0, 1]))
    assert load_npz_split(good, "train")[0].shape == (2, 3)

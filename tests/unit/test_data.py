"""Data sources and pipelines: real files in every supported format, splits, bad paths."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from kerasdist.config import DataConfig
from kerasdist.data import build_datasets, embedded_dir, load_split, make_dataset_fn, write_tfrecord
from kerasdist.data.readers import read_idx
from kerasdist.errors import DataError


@pytest.fixture(scope="module")
def digits():
    return load_split(DataConfig(), "test")


def test_embedded_sample_is_the_real_mnist_test_set(digits):
    x, y = digits
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert y.shape == (10000,) and y.dtype == np.int64
    assert y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the well-known first test labels
    assert np.bincount(y).tolist()[:2] == [980, 1135]
    assert (embedded_dir() / "README.md").read_text().count("CC BY-SA 3.0") == 1


def test_tfds_style_splits(digits):
    config = DataConfig()
    train_x, _ = load_split(config, "test[:80%]")
    eval_x, eval_y = load_split(config, "test[80%:]")
    assert len(train_x) == 8000 and len(eval_x) == 2000
    np.testing.assert_array_equal(eval_y, digits[1][8000:])
    both, _ = load_split(config, "test[:10]+test[-10:]")
    np.testing.assert_array_equal(both, np.concatenate([digits[0][:10], digits[0][-10:]]))


@pytest.mark.parametrize("split, needle", [("train", "only the MNIST 'test' split"),
                                           ("test[:300%]", "bad split string"),
                                           ("test[5:5]", "selects no examples")])
def test_bad_splits(split, needle):
    with pytest.raises(DataError, match=needle):
        load_split(DataConfig(), split)


@pytest.mark.parametrize("gz", [True, False])
def test_idx_folder_gzipped_or_not(tmp_path, digits, gz):
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        src = embedded_dir() / f"{name}.gz"
        if gz:
            shutil.copy(src, tmp_path / f"{name}.gz")
        else:
            (tmp_path / name).write_bytes(gzip.decompress(src.read_bytes()))
    x, y = load_split(DataConfig(source={"kind": "idx", "path": tmp_path}), "test[:100]")
    np.testing.assert_array_equal(x, digits[0][:100])
    np.testing.assert_array_equal(y, digits[1][:100])


def test_idx_missing_files_and_corrupt(tmp_path):
    with pytest.raises(DataError, match="has no 't10k-images-idx3-ubyte'"):
        load_split(DataConfig(source={"kind": "idx", "path": tmp_path}), "test")
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(DataError, match="bad magic"):
        read_idx(bad)


def test_npz_keras_layout(tmp_path, digits):
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=digits[0][:50], y_train=digits[1][:50],
             x_test=digits[0][50:80], y_test=digits[1][50:80])
    x, y = load_split(DataConfig(source={"kind": "npz", "path": path}), "train[10:20]")
    np.testing.assert_array_equal(y, digits[1][10:20])
    x, _ = load_split(DataConfig(source={"kind": "npz", "path": path}), "test")
    assert len(x) == 30
    with pytest.raises(DataError, match="no x_validation"):
        load_split(DataConfig(source={"kind": "npz", "path": path}), "validation")


def test_tfrecord_seed_schema_round_trip(tmp_path, digits):
    write_tfrecord(digits[0][:64], digits[1][:64], tmp_path / "train.tfrecords")
    x, y = load_split(DataConfig(source={"kind": "tfrecord", "path": tmp_path}), "train[:40]")
    np.testing.assert_array_equal(x, digits[0][:40])
    np.testing.assert_array_equal(y, digits[1][:40])
    with pytest.raises(DataError, match="no 'test\\*.tfrecord\\*' files"):
        load_split(DataConfig(source={"kind": "tfrecord", "path": tmp_path}), "test")


def test_synthetic_linear_is_seeded_and_follows_the_seed_law():
    config = DataConfig(source={"kind": "synthetic_linear", "num_examples": 5000})
    x, y = load_split(config, "train")
    x2, _ = load_split(config, "train")
    np.testing.assert_array_equal(x, x2)
    slope, intercept = np.polyfit(x[:, 0], y[:, 0], 1)
    assert abs(slope - 2) < 0.05 and abs(intercept - 10) < 0.05
    assert abs(np.std(y[:, 0] - (2 * x[:, 0] + 10)) - 0.33) < 0.02
    other, _ = load_split(DataConfig(source="synthetic_linear", shuffle_seed=7), "train")
    assert not np.array_equal(other, x[:1000])


def test_dataset_fn_batches_globally_or_per_replica_and_shards(digits):
    import tensorflow as tf

    x, y = digits[0][:256], digits[1][:256]
    fn = make_dataset_fn(x, y, global_batch_size=64, training=True, seed=1)
    images, labels = next(iter(fn()))
    assert images.shape == (64, 28, 28, 1) and images.dtype == tf.float32
    assert float(tf.reduce_max(images)) <= 1.0
    ctx0 = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                      num_replicas_in_sync=2)
    ctx1 = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                      num_replicas_in_sync=2)
    seen0 = np.concatenate([b[1].numpy() for b in fn(ctx0)])
    seen1 = np.concatenate([b[1].numpy() for b in fn(ctx1)])
    assert len(seen0) == len(seen1) == 128  # per-replica batch 32, 4 full batches per shard
    assert sorted(np.concatenate([seen0, seen1]).tolist()) == sorted(y.tolist())


def test_eval_pipeline_keeps_order_and_remainder(digits):
    fn = make_dataset_fn(digits[0][:100], digits[1][:100], global_batch_size=64, training=False)
    labels = np.concatenate([b[1].numpy() for b in fn()])
    np.testing.assert_array_equal(labels, digits[1][:100])


def test_train_split_smaller_than_a_batch():
    with pytest.raises(DataError, match="fewer than one global batch"):
        build_datasets(DataConfig(train_split="test[:10]", batch_size=32))


def test_tfds_source_calls_tfds_load_with_split_and_data_dir(monkeypatch, tmp_path):
    """The online path: tfds.load gets the recipe's name, split and data_dir (no download here)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    calls = []

    def fake_load(name, *, split, as_supervised, batch_size, data_dir):
        calls.append((name, split, as_supervised, batch_size, data_dir))
        images = tf.zeros((3, 28, 28, 1), tf.uint8)
        return images, tf.constant([1, 2, 3], tf.int64)

    monkeypatch.setattr(tfds, "load", fake_load)
    x, y = load_split(DataConfig(source={"kind": "tfds", "data_dir": tmp_path}), "train[:10%]")
    assert calls == [("mnist", "train[:10%]", True, -1, str(tmp_path))]
    assert x.shape == (3, 28, 28) and y.tolist() == [1, 2, 3]


def test_tfds_offline_error_points_to_embedded(monkeypatch):
    import tensorflow_datasets as tfds

    def offline(*args, **kwargs):
        raise ConnectionError("Failed to establish a new connection")

    monkeypatch.setattr(tfds, "load", offline)
    with pytest.raises(DataError, match="Offline\\? Use data.source: embedded"):
        load_split(DataConfig(source="tfds"), "train")


# ------------------------------------------- bad data never reaches the graph (training/checks.py)
def _npz(tmp_path, x, y, name="bad.npz"):
    path = tmp_path / name
    np.savez(path, x_train=x, y_train=y, x_test=x, y_test=y)
    return path


def _recipe(path, **data):
    from kerasdist.config import Recipe

    return Recipe(data=dict(source={"kind": "npz", "path": str(path)}, train_split="train",
                            eval_split="test", batch_size=8, **data))


@pytest.fixture(scope="module")
def cnn():
    from kerasdist.models import mnist_cnn

    return mnist_cnn()


def _images(n=16, side=28):
    return np.random.default_rng(0).integers(0, 256, (n, side, side), dtype=np.uint8)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("label, needle", [
    (10, r"labels must be in \[0, 10\) for a model with 10 output units; 1 of 16 are not "
         r"\(first at example 3\)\. Received: label 10"),
    (255, r"Received: label 255"),
    (-1, r"Received: label -1"),
])
def test_labels_out_of_range_are_refused_naming_split_and_value(tmp_path, cnn, label, needle):
    from kerasdist.training.checks import check_inputs

    y = np.arange(16) % 10
    y[3] = label
    path = _npz(tmp_path, _images(), y)
    with pytest.raises(DataError, match=needle) as err:
        check_inputs(_recipe(path), cnn)
    assert "data.train_split 'train'" in str(err.value) and str(path) in str(err.value)


@pytest.mark.timeout(120)
def test_nan_labels_are_refused_at_load_and_when_already_cast(tmp_path, cnn):
    from kerasdist.training.checks import check_inputs

    y = (np.arange(16) % 10).astype(np.float32)
    y[5] = np.nan
    path = _npz(tmp_path, _images(), y)
    with pytest.raises(DataError, match=r"y_train: labels must be whole class numbers.*index 5"):
        load_split(DataConfig(source={"kind": "npz", "path": path}), "train")
    with np.errstate(invalid="ignore"):
        cast = y.astype(np.int64)  # what the loaders used to make of it: int64 min
    with pytest.raises(DataError, match="a NaN label cast to int64"):
        check_inputs(_recipe(path), cnn, splits={"train": (_images(), cast), "test": (_images(), cast)})


@pytest.mark.timeout(120)
def test_wrong_image_size_and_nan_images_are_refused(tmp_path, cnn):
    from kerasdist.training.checks import check_inputs

    y = np.arange(16) % 10
    path = _npz(tmp_path, _images(side=32), y)
    with pytest.raises(DataError, match=r"examples of shape \(32, 32\) \(fed as \(32, 32, 1\)\) do "
                                        r"not fit the input \(28, 28, 1\) of model 'mnist_cnn'"):
        check_inputs(_recipe(path), cnn)
    x = _images().astype(np.float32)
    x[2, 4, 4] = np.nan
    path = _npz(tmp_path, x, y, name="nan.npz")
    with pytest.raises(DataError, match=r"examples hold 1 NaN/inf value\(s\) \(first in example 2\)"):
        check_inputs(_recipe(path), cnn)


@pytest.mark.timeout(120)
def test_eval_split_is_checked_too_and_good_data_passes(tmp_path, cnn):
    from kerasdist.training.checks import check_inputs

    good = (_images(), np.arange(16) % 10)
    path = _npz(tmp_path, *good)
    check_inputs(_recipe(path), cnn)
    bad = (_images(), np.full(16, 12))
    with pytest.raises(DataError, match=r"data.eval_split 'test'.*Received: label 12"):
        check_inputs(_recipe(path), cnn, splits={"train": good, "test": bad})
    check_inputs(_recipe(path, normalize=False), cnn)
    from kerasdist.config import Recipe

    check_inputs(Recipe(), cnn)


@pytest.mark.timeout(120)
def test_tfrecord_source_is_checked_on_a_bounded_sample(tmp_path, cnn):
    from kerasdist.training import checks

    write_tfrecord(_images(8, side=32), np.arange(8) % 10, tmp_path / "tf" / "train-0.tfrecord")
    recipe = _recipe(tmp_path / "tf").model_copy(update={"data": DataConfig(
        source={"kind": "tfrecord", "path": tmp_path / "tf"}, train_split="train", eval_split=None,
        batch_size=4)})
    with pytest.raises(DataError, match=r"shape \(32, 32\)"):
        checks.check_inputs(recipe, cnn)


@pytest.mark.timeout(120)
def test_linear_model_data_passes_and_nan_targets_are_refused():
    from kerasdist.config import Recipe
    from kerasdist.models import linear
    from kerasdist.training.checks import check_inputs

    recipe = Recipe(model={"name": "linear"}, data={"source": "synthetic_linear",
                                                     "train_split": "train", "eval_split": "test"})
    check_inputs(recipe, linear())
    x = np.ones((4, 1), np.float32)
    y = np.array([[1.0], [np.inf], [2.0], [3.0]], np.float32)
    with pytest.raises(DataError, match="labels hold 1 NaN/inf"):
        check_inputs(recipe, linear(), splits={"train": (x, y), "test": (x, y)})

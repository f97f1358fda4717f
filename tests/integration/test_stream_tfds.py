"""Source ``tfds`` on a tiny dataset built locally by this module (no download): any TFDS dataset
by name, with ``data.source.input`` and ``data.source.label`` naming its features, streamed and resumable."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kerasdist import fit
from kerasdist.config import validate_recipe
from kerasdist.data.inputs import build_streaming
from kerasdist.errors import DataError

tfds = pytest.importorskip("tensorflow_datasets")
pytestmark = pytest.mark.integration


class KerasdistTinyPoints(tfds.core.GeneratorBasedBuilder):
    """2-d points, class = whether their coordinates sum above 0 (built offline in data_dir)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "point": tfds.features.Tensor(shape=(2,), dtype=np.float32),
            "side": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(320, 0), "test": self._generate_examples(80, 1)}

    def _generate_examples(self, n, seed):
        rng = np.random.default_rng(seed)
        for i in range(n):
            point = rng.normal(size=2).astype(np.float32)
            yield i, {"point": point, "side": int(point.sum() > 0)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tfds")
    builder = KerasdistTinyPoints(data_dir=str(folder))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return folder


def _recipe(tmp_path, data_dir, source=(), **data):
    """The recipe, ``source`` updating ``data.source``, ``data`` the other ``data`` fields."""
    return validate_recipe({
        "model": {"name": "kerasdist.models.examples:tabular_mlp",
                  "params": {"num_features": 2, "dropout": 0.0},
                  "loss": "sparse_categorical_crossentropy_from_logits", "metrics": ["accuracy"]},
        "data": {"source": {"kind": "tfds", "name": "kerasdist_tiny_points",
                            "data_dir": str(data_dir), "input": "point", "label": "side",
                            **dict(source)},
                 "train_split": "train", "eval_split": "test", "batch_size": 16, **data},
        "trainer": {"epochs": 3, "verbose": 0},
        "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}})


@pytest.mark.timeout(180)
def test_a_tfds_dataset_by_name_trains_with_named_input_and_label(tmp_path, data_dir):
    result = fit(_recipe(tmp_path, data_dir))
    assert result.extra["steps_per_epoch"] == 320 // 16
    assert result.evaluation["accuracy"] >= 0.85, result.evaluation


@pytest.mark.timeout(120)
def test_a_resumed_tfds_stream_continues_where_it_stopped(tmp_path, data_dir):
    built = build_streaming(_recipe(tmp_path, data_dir, train_split="train[:50%]"), pipelines=1)
    ctx = tf.distribute.InputContext()
    whole = [b[0].numpy() for b in built.train_fn(ctx, 0).take(6)]
    resumed = [b[0].numpy() for b in built.train_fn(ctx, 4).take(2)]
    np.testing.assert_array_equal(np.concatenate(resumed), np.concatenate(whole[4:]))


def test_a_missing_tfds_feature_is_named(tmp_path, data_dir):
    with pytest.raises(DataError, match=r"data.source.label: 'kerasdist_tiny_points' has no feature "
                       r"'label' \(features: point, side\). Received: 'label'"):
        build_streaming(_recipe(tmp_path, data_dir, source={"label": None}), pipelines=1)

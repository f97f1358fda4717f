"""Model builders: the seed CNN's exact layout, the linear model, the registry."""

from __future__ import annotations

import pytest

from kerasdist.config import ModelConfig
from kerasdist.errors import RecipeError
from kerasdist.models import available, build, linear, mnist_cnn


def test_registry_lists_seed_models():
    assert {"mnist_cnn", "linear"} <= set(available())


def test_seed_cnn_layout():
    model = mnist_cnn()
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert [(c.filters, c.kernel_size, c.padding) for c in convs] == [
        (32, (5, 5), "same"), (64, (5, 5), "same")]
    dense = [layer for layer in model.layers if layer.__class__.__name__ == "Dense"]
    assert [d.units for d in dense] == [1024, 10]
    assert model.output_shape == (None, 10)
    assert model.count_params() == 3_274_634
    assert any(layer.__class__.__name__ == "Dropout" for layer in model.layers)


def test_cnn_rejects_bad_dropout():
    with pytest.raises(ValueError, match="dropout"):
        mnist_cnn(dropout=1.5)


def test_linear_model_has_one_weight_one_bias():
    model = linear()
    assert [tuple(w.shape) for w in model.weights] == [(1, 1), (1,)]


def test_build_from_config_and_import_path():
    assert build(ModelConfig(name="mnist_cnn", params={"dropout": 0.1})).layers[-2].rate == 0.1
    model = build(ModelConfig(name="kerasdist.models.seed:linear", loss="mse"))
    assert model.count_params() == 2
    with pytest.raises(RecipeError, match="has no callable 'nope'"):
        build(ModelConfig(name="kerasdist.models.seed:nope", loss="mse"))

"""``trainer.precision`` (kerasdist.keras.precision): Keras dtype policies applied when the recipe's
model is built; float32 variables and output; loss scaling for float16; bad values refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from kerasdist.config import validate_recipe
from kerasdist.errors import RecipeError
from kerasdist.training.model import build_compiled_model


def _recipe(precision: str):
    return validate_recipe({"model": {"name": "mnist_cnn", "params": {"dropout": 0.0}},
                            "data": {"batch_size": 8}, "trainer": {"precision": precision}})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("precision, compute", [("mixed_bfloat16", "bfloat16"),
                                                ("mixed_float16", "float16"),
                                                ("float32", "float32")])
def test_policy_applied_variables_float32_output_float32_loss_finite(precision, compute):
    keras.utils.set_random_seed(0)
    model = build_compiled_model(_recipe(precision))
    assert keras.config.dtype_policy().name == "float32"  # the global policy is restored
    conv = model.layers[0]
    assert conv.dtype_policy.name == precision and conv.compute_dtype == compute
    assert {v.dtype for v in model.weights} == {"float32"}
    assert model.layers[-1].compute_dtype == "float32"  # logits layer kept float32
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (precision == "mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.random((16, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 16)
    assert conv(x).dtype == compute and model(x).dtype == "float32"
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False).history
    assert all(np.isfinite(history["loss"])) and history["loss"][1] < history["loss"][0]
    assert int(model.optimizer.iterations.numpy()) == 4


def test_bad_precision_is_refused_by_the_schema():
    with pytest.raises(RecipeError, match="precision"):
        validate_recipe({"trainer": {"precision": "float16"}})

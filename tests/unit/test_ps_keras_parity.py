"""Parameter-server Keras parity pieces that need no cluster: nested custom-step logs, the
class_weight mapping, and the up-front refusals (each failed or was missing on main before issue
18; the conformance matrix checks them end to end on a real 1 ps + 2 workers cluster)."""

from __future__ import annotations

import numpy as np
import pytest

from kerasdist.errors import UnsupportedFeatureError


class _Model:
    def __init__(self, results):
        self._results = results

    def get_metrics_result(self):
        return self._results


def test_nested_custom_step_logs_are_flattened_like_keras():
    from kerasdist.keras import ps_loop

    model = _Model({"loss": np.float32(0.5), "compile_metrics": {"accuracy": np.float32(0.75)}})
    logs = ps_loop.metrics_logs(model, {"loss": 0.4, "compile_metrics": {"accuracy": 0.7}})
    assert logs == {"loss": 0.5, "accuracy": 0.75}


def test_class_weight_becomes_per_example_weights():
    import tensorflow as tf

    from kerasdist.keras import ps_class_weight, ps_input

    base = ps_input.PSInput(
        lambda ctx: tf.data.Dataset.from_tensor_slices(
            (np.zeros((4, 2), np.float32), np.array([0, 1, 2, 1]))).batch(4), 1, "dataset")
    weighted = ps_class_weight.with_class_weight(base, {0: 0.0, 1: 2.0, 2: 0.5})
    _, _, weights = next(iter(weighted.dataset_fn(None)))
    np.testing.assert_allclose(weights.numpy(), [0.0, 2.0, 0.5, 2.0])
    with pytest.raises(ValueError, match="class_weight"):
        ps_class_weight.with_class_weight(base, {"a": 1.0})


@pytest.mark.parametrize("option", [{"use_ema": True}, {"gradient_accumulation_steps": 2}])
def test_async_unsafe_optimizer_options_are_refused(option):
    import keras

    from kerasdist.keras import ps_fit

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(**option), "mse")
    with pytest.raises(UnsupportedFeatureError, match=f"{next(iter(option))}.*ParameterServer"):
        ps_fit.refuse_unsupported(model, training=True)
    ps_fit.refuse_unsupported(model, training=False)  # evaluate/predict of such a model is fine


def test_adamax_on_an_embedding_is_refused_with_two_or_more_workers():
    """Its dense rewrite of the infinity-norm slot races between workers on sparse rows
    (conformance ``sparse_adamax`` under parameter_server: loss 1.10 -> 5.3 with 2 workers,
    Keras's own losses with 1)."""
    import keras

    from kerasdist.keras import ps_fit

    def build(optimizer, embedding=True):
        layers = ([keras.layers.Embedding(10, 2), keras.layers.GlobalAveragePooling1D()]
                  if embedding else [keras.layers.Dense(2)])
        model = keras.Sequential([keras.Input((3,)), *layers, keras.layers.Dense(1)])
        model.compile(optimizer, "mse")
        return model

    with pytest.raises(UnsupportedFeatureError, match="Adamax.*Embedding.*workers=2"):
        ps_fit.refuse_unsupported(build(keras.optimizers.Adamax()), training=True, workers=2)
    ps_fit.refuse_unsupported(build(keras.optimizers.Adamax()), training=True, workers=1)
    ps_fit.refuse_unsupported(build(keras.optimizers.Adamax()), training=False, workers=2)
    ps_fit.refuse_unsupported(build(keras.optimizers.Adam()), training=True, workers=2)
    ps_fit.refuse_unsupported(build(keras.optimizers.Adamax(), embedding=False), training=True,
                              workers=2)


def test_lookup_layers_are_refused_naming_them():
    import keras

    from kerasdist.keras import ps_fit

    lookup = keras.layers.StringLookup(vocabulary=["a", "b"])
    inputs = keras.Input((1,), dtype="string")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.ops.cast(lookup(inputs), "float32")))
    with pytest.raises(UnsupportedFeatureError, match="StringLookup"):
        ps_fit.refuse_unsupported(model, training=False)

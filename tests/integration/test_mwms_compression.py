"""Gradient compression of the multi-worker all-reduce, checked under MirroredStrategy (2 CPUs).

The hook is the same ``_all_reduce_sum_gradients`` call for any strategy with replicas, so two
logical CPUs in this process exercise it without starting workers.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist.errors import RecipeError
from kerasdist.keras.compression import HOOK, compress_gradients

pytestmark = pytest.mark.integration


def _train(strategy, compression: str, calls: list):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        optimizer = compress_gradients(keras.optimizers.SGD(0.05), compression)
        if compression != "none":
            hook = getattr(optimizer, HOOK)
            setattr(optimizer, HOOK, lambda gv: calls.append(1) or hook(gv))
        model.compile(optimizer, "mse")
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 1.0
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0, shuffle=False)
    return model, history.history["loss"]


def check_bf16_all_reduce(tmp_path) -> None:
    """Runs in a fresh process (see the test below): two MirroredStrategy instances in a process
    that already ran other MirroredStrategy tests collide on collective keys."""
    calls: list = []
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # one: shared collective keys
    reference, ref_loss = _train(strategy, "none", calls)
    compressed, loss = _train(strategy, "bf16", calls)
    assert calls, "the compressed all-reduce was not used"
    assert loss[-1] < loss[0] / 4
    np.testing.assert_allclose(loss, ref_loss, rtol=0.05)
    for a, b in zip(compressed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=0.05)
    compressed.save(tmp_path / "m.keras")
    assert type(keras.saving.load_model(tmp_path / "m.keras").optimizer) is keras.optimizers.SGD


@pytest.mark.timeout(180)
def test_bf16_all_reduce_trains_like_float32_and_saves_normally(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, pathlib, tensorflow as tf\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_mwms_compression import check_bf16_all_reduce\n"
        f"check_bf16_all_reduce(pathlib.Path({str(tmp_path)!r}))\n"
        "print('CHECK-OK')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=170)
    assert done.returncode == 0 and "CHECK-OK" in done.stdout, done.stderr[-3000:]


def test_missing_hook_is_an_error_not_a_silent_no_op():
    class Plain:
        pass

    with pytest.raises(RecipeError, match="Received: gradient_compression='fp16'"):
        compress_gradients(Plain(), "fp16")
    assert compress_gradients(Plain(), "none") is not None

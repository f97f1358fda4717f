"""Gradient accumulation under MultiWorkerMirroredStrategy with 2 real worker processes: k = 2
micro-batches per worker and update end on the weights of the unaccumulated run on the same global
batches, with the optimizer stepping once per global batch."""

from __future__ import annotations

import mwms_support as mw
import numpy as np
import pytest

# The extended tier (115 s in the README suite, 2026-11-27): the suite keeps accumulation under
# a sync strategy on two replicas against the unaccumulated run (tests/integration/
# test_accumulation.py, mirrored) and Keras's own accumulation under multi_worker (the core matrix).
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended]


def _run(tmp_path, name: str, steps: int):
    recipe = mw.linear_recipe(tmp_path, name, trainer={
        "epochs": 1, "steps_per_epoch": 12, "gradient_accumulation_steps": steps,
        "checkpoint": {"every_steps": 6}})
    process = mw.launch(recipe)
    out = mw.finish(process, timeout_s=200)
    assert process.returncode == 0, out[-6000:]
    return tmp_path / name


@pytest.mark.timeout(450)
def test_two_workers_accumulating_end_on_the_unaccumulated_weights(tmp_path):
    accumulated = _run(tmp_path, "k2", 2)  # global batch 32: 16 per worker as 2 x 8
    plain = _run(tmp_path, "k1", 1)
    chief_log = (accumulated / "logs" / "worker-0.log").read_text(errors="replace")
    assert "gradient accumulation: 2 micro-batch(es) of 8 examples per replica" in chief_log
    result = mw.metrics(accumulated)
    assert result["num_replicas"] == 2
    assert result["global_steps"] == 12 == mw.metrics(plain)["global_steps"]  # updates
    assert mw.checkpoint_steps(accumulated) == [6, 12]
    for a, b in zip(mw.final_weights(accumulated), mw.final_weights(plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

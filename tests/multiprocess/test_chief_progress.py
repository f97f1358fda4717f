"""Issue 42 item 2 on a local 2-worker multi_worker cluster: the console shows the chief's
progress while it trains (Keras's one line an epoch, kerasdist's notices; Keras writes no
"Epoch 1/1" header for one epoch) without TensorFlow's start-up noise, and the summary once;
``fit --quiet`` keeps the progress in the logs only."""

from __future__ import annotations

import mwms_support as mw
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_the_chiefs_progress_reaches_the_console_and_quiet_keeps_it_in_the_logs(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "run", trainer={"epochs": 1})
    out = mw.finish(mw.launch(recipe), timeout_s=280)
    assert "64/64 - " in out and " - loss: " in out, out[-4000:]  # Keras's epoch line
    assert "kerasdist[worker:0]: training from global step 0 of 64" in out, out[-4000:]
    assert out.count("kerasdist run summary") == 1, out[-4000:]
    assert "oneDNN" not in out and "cudart_stub" not in out, out[-4000:]
    assert "[worker:1]" not in out and "kerasdist[worker:1]" not in out  # one task speaks
    quiet = mw.finish(mw.launch(recipe, "--quiet", "--set", "trainer.epochs=2"), timeout_s=280)
    assert "Epoch 2/2" not in quiet and "kerasdist run summary" in quiet, quiet[-4000:]
    assert "Epoch 2/2" in (tmp_path / "run" / "logs" / "worker-0.log").read_text()

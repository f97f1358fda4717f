"""Issue 42 item 5 on a local 2-worker multi_worker cluster: no task prints Keras's "Your input
ran out of data" warning (its held-out split, distributed with ``distribute_datasets_from_function``,
has no size Keras can read; keras#23360), and every step still runs."""

from __future__ import annotations

import mwms_support as mw
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]


def test_a_multi_worker_run_prints_no_ran_out_of_data_warning(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "run", trainer={"epochs": 2})
    out = mw.finish(mw.launch(recipe), timeout_s=400)
    logs = {p.name: p.read_text() for p in sorted((tmp_path / "run" / "logs").glob("*.log"))}
    assert any("done at global step" in text for text in logs.values()), out[-3000:]
    metrics = mw.metrics(tmp_path / "run")
    assert metrics["global_steps"] == 2 * metrics["steps_per_epoch"]
    for name, text in {"console": out, **logs}.items():
        assert "ran out of data" not in text, f"{name}:\n{text[-3000:]}"

"""``strategy.variable_partitioning`` in a recipe, with real processes: the seed CNN's large Dense
kernel and its Adam slots are split over 2 ps tasks (each ps reports its shards in metrics.json),
and the run's checkpoint continues on 3 ps at its global step with a verified restore (the state
digest of every weight, slot and the step equals the one recorded when it was saved).

On the main branch before the sharded-variable mend the first run failed at its first step
(``'ShardedVariable' object has no attribute 'handle'``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kerasdist.keras import state_digest

pytestmark = [pytest.mark.multiprocess, pytest.mark.extended]
REPO = Path(__file__).parents[2]
STEPS = 8  # global steps per epoch


def _fit(run_dir: Path, *, ps: int, epochs: int) -> dict:
    sets = [f"cluster.ps={ps}", "strategy.variable_partitioning=min_size",
            f"trainer.epochs={epochs}", f"trainer.steps_per_epoch={STEPS}",
            "data.eval_split=test[9000:9512]", "output.tensorboard=false",
            f"output.run_dir={run_dir}"]
    command = [sys.executable, "-m", "kerasdist", "fit", str(REPO / "recipes" / "mnist_cnn_ps.yaml"),
               *[a for s in sets for a in ("--set", s)]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((run_dir / "metrics.json").read_text())


def _split(placement: list[dict]) -> dict[str, list[tuple[int, int, list[int]]]]:
    """``{path: [(ps task, shard index, shape), ...]}`` of the split variables."""
    found: dict[str, list] = {}
    for entry in placement:
        for shard in entry["shards"]:
            found.setdefault(shard["path"], []).append(
                (entry["task"], shard["shard"], shard["shape"]))
    return {path: sorted(shards, key=lambda s: s[1]) for path, shards in found.items()}


@pytest.mark.timeout(600)
def test_sharded_recipe_trains_on_2_ps_and_continues_on_3(tmp_path):
    run_dir = tmp_path / "run"
    first = _fit(run_dir, ps=2, epochs=1)
    figures = first["parameter_server"]
    assert figures["num_ps"] == 2 and figures["global_step"] == STEPS
    split = _split(figures["ps_placement"])
    kernel = split["mnist_cnn/dense/kernel"]  # 3136 x 1024 float32 = 12.25 MiB
    assert [(task_shard[1], task_shard[2]) for task_shard in kernel] == [(0, [1568, 1024]),
                                                                          (1, [1568, 1024])]
    assert {task for task, _, _ in kernel} == {0, 1}
    for slot in ("adam/mnist_cnn_dense_kernel_momentum", "adam/mnist_cnn_dense_kernel_velocity"):
        assert split[slot] == kernel  # shard i of each slot on the ps of the kernel's shard i
    sizes = [entry["bytes"] for entry in figures["ps_placement"]]
    assert max(sizes) < 0.6 * sum(sizes)  # each of the 2 ps holds about half
    assert first["evaluation"]["accuracy"] > 0.5  # 8 steps from chance (0.1)

    saved = state_digest.read(run_dir / "checkpoints")[f"ckpt-{STEPS}"]
    second = _fit(run_dir, ps=3, epochs=2)
    assert second["start_step"] == STEPS and second["restore_verified"] is True
    assert second["restored_state_sha256"] == saved
    assert second["parameter_server"]["num_ps"] == 3
    assert second["parameter_server"]["global_step"] == 2 * STEPS
    assert len(_split(second["parameter_server"]["ps_placement"])["mnist_cnn/dense/kernel"]) == 3

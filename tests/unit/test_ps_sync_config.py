"""``strategy.sync`` of ``parameter_server``: the recipe field, and bad input refused with exit
code 2 before anything is written or started, naming the field and the value."""

from __future__ import annotations

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import load_recipe
from kerasdist.strategies import registry

PS = """
strategy: {{kind: parameter_server{extra}}}
cluster: {{kind: local, workers: 2, ps: 1}}
data: {{batch_size: 64}}
output: {{run_dir: '{run_dir}'}}
"""


def _recipe(write_recipe, tmp_path, extra=""):
    return write_recipe(PS.format(extra=extra, run_dir=tmp_path / "run"))


def test_sync_is_read_from_the_recipe_and_from_set(write_recipe, tmp_path):
    path = _recipe(write_recipe, tmp_path)
    assert load_recipe(path).strategy.sync is None
    recipe = load_recipe(path, ["strategy.sync.replicas_to_aggregate=1"])
    assert recipe.strategy.sync.replicas_to_aggregate == 1
    strategy = registry.for_recipe(recipe)
    assert strategy.compile_kwargs(recipe.strategy) == {"steps_per_execution": 1}
    assert strategy.replicas_before_start(recipe) == 2
    every = load_recipe(_recipe(write_recipe, tmp_path, ", sync: {}"))
    assert every.strategy.sync.replicas_to_aggregate is None  # all workers
    assert main(["validate", str(path), "--set", "strategy.sync.replicas_to_aggregate=2"]) == 0


@pytest.mark.parametrize("sets, needle", [
    (["strategy.sync.replicas_to_aggregate=0"], "strategy.sync.replicas_to_aggregate"),
    (["strategy.sync.replicas_to_aggregate=3"],
     "between 1 and the number of workers (2). Received: replicas_to_aggregate=3"),
    (["strategy.sync.replicas_to_aggregate=2", "strategy.steps_per_execution=4"],
     "strategy.steps_per_execution must be 1 with strategy.sync"),
    (["strategy.sync.replicas_to_aggregate=2", "trainer.gradient_accumulation_steps=2"],
     "gradient_accumulation_steps is not supported by strategy 'parameter_server'"),
    (["strategy.sync.replicas_to_aggregate=2", "data.batch_size=63"], "batch_size"),
    (["strategy.kind=multi_worker", "strategy.sync.replicas_to_aggregate=2"], "strategy.sync"),
    (["strategy.sync.replicas_to_aggregate=2", "cluster.min_workers=1"],
     "must be <= cluster.min_workers (1): an attempt on the fewest workers must still aggregate "
     "K gradients per step. Received: replicas_to_aggregate=2"),
])
def test_bad_sync_input_exits_2_naming_the_field(write_recipe, tmp_path, capsys, sets, needle):
    path = _recipe(write_recipe, tmp_path)
    args = [arg for item in sets for arg in ("--set", item)]
    assert main(["validate", str(path), *args]) == EXIT_BAD_INPUT
    assert main(["fit", str(path), *args]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()

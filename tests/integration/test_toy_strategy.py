"""A strategy kind registered from a test module runs end to end through ``kerasdist.fit``.

The toy kind lives only here: a config class with its traits and a :class:`Strategy` subclass that
builds a ``OneDeviceStrategy`` on the second logical CPU. Nothing in kerasdist is edited; the
lifecycle, checkpoints, outputs and summary are kerasdist's own.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

import pytest

import kerasdist
from kerasdist import strategies
from kerasdist.config.schema import StrategyConfigBase, StrategyTraits
from kerasdist.errors import RecipeError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


class ToyConfig(StrategyConfigBase):
    traits: ClassVar[StrategyTraits] = StrategyTraits(topology="single")
    kind: Literal["toy_one_device"] = "toy_one_device"
    device: str = "/cpu:1"


class ToyStrategy(strategies.Strategy):
    kind = "toy_one_device"
    config_class = ToyConfig
    built_on: list = []

    def build(self, config, *, cluster_resolver=None):
        import tensorflow as tf

        self.built_on.append(config.device)
        return tf.distribute.OneDeviceStrategy(config.device)

    def describe(self, tf_strategy) -> str:
        return f"toy strategy on {tf_strategy.extended.worker_devices[0]}"


def _recipe(run_dir, **strategy):
    return kerasdist.config.validate_recipe({
        "model": {"name": "linear"},
        "data": {"source": {"kind": "synthetic_linear", "num_examples": 512},
                 "train_split": "train", "eval_split": "test", "batch_size": 32},
        "optimizer": {"name": "sgd", "learning_rate": 0.1},
        "strategy": {"kind": "toy_one_device", **strategy},
        "trainer": {"epochs": 2, "verbose": 0},
        "output": {"run_dir": str(run_dir)},
    })


def test_unregistered_kind_is_refused_with_the_list():
    with pytest.raises(RecipeError, match="unknown strategy 'toy_unregistered'"):
        kerasdist.config.validate_recipe({"strategy": {"kind": "toy_unregistered"}})


def test_toy_strategy_registered_from_a_test_runs_end_to_end(tmp_path, capsys):
    strategies.register(ToyStrategy)
    assert "toy_one_device" in strategies.available()
    result = kerasdist.fit(_recipe(tmp_path / "run"))
    assert ToyStrategy.built_on == ["/cpu:1"]
    assert "toy strategy on" in capsys.readouterr().out
    steps_per_epoch = 512 // 32  # the synthetic train split has num_examples examples
    assert result.strategy == "toy_one_device"
    assert result.extra["global_steps"] == 2 * steps_per_epoch
    assert result.evaluation["loss"] < 0.5  # noise variance 0.33**2
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["strategy"] == "toy_one_device"
    assert info["recipe"]["strategy"] == {"kind": "toy_one_device", "device": "/cpu:1"}
    # The same checkpoint schema as the built-in kinds: a default run continues it exactly.
    again = kerasdist.fit(_recipe(tmp_path / "run").model_copy(update={
        "strategy": kerasdist.config.DefaultStrategyConfig(),
        "trainer": kerasdist.config.TrainerConfig(epochs=3, verbose=0)}))
    assert again.extra["start_step"] == 2 * steps_per_epoch
    assert again.extra["global_steps"] == 3 * steps_per_epoch

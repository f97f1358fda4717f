"""``trainer.checkpoint.async``: read and written back under its YAML name; refused (exit 2,
naming the field and value, nothing written) under the strategy that cannot honour it."""

from __future__ import annotations

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import validate_recipe
from kerasdist.config.loader import dump_recipe


def test_async_is_read_and_written_back_by_its_yaml_name():
    assert validate_recipe({}).trainer.checkpoint.async_ is False
    recipe = validate_recipe({"trainer": {"checkpoint": {"async": True}}})
    assert recipe.trainer.checkpoint.async_ is True
    assert "async: true" in dump_recipe(recipe)


@pytest.mark.parametrize("command", ["validate", "fit"])
def test_async_under_parameter_server_is_exit_2_naming_field_and_value(write_recipe, tmp_path,
                                                                       capsys, command):
    run_dir = tmp_path / "run"
    recipe = write_recipe("strategy: {kind: parameter_server}\n"
                          "cluster: {kind: local, workers: 2, ps: 1}\n"
                          f"output: {{run_dir: {run_dir}}}\n"
                          "trainer: {checkpoint: {async: true}}\n")
    assert main([command, str(recipe)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "trainer.checkpoint.async is not supported under strategy 'parameter_server'" in err
    assert "Received: async=true" in err
    assert not run_dir.exists()

"""Keras's ``OrbaxCheckpoint`` coordinates its saves across processes on JAX only: a recipe that
puts it in ``callbacks`` under a strategy of several processes is refused when it is loaded
(exit 2, naming the callback and what to use), before anything starts; one process may use it."""

from __future__ import annotations

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import validate_recipe

CLUSTERS = {"multi_worker": "{kind: local, workers: 2}",
            "parameter_server": "{kind: local, workers: 2, ps: 1}"}


@pytest.mark.parametrize("kind", sorted(CLUSTERS))
@pytest.mark.parametrize("callback, name", [
    ("OrbaxCheckpoint", "OrbaxCheckpoint"),
    ("'keras.callbacks:OrbaxCheckpoint'", "keras.callbacks:OrbaxCheckpoint"),
    ("{class_name: OrbaxCheckpoint, config: {directory: ckpt}}", "OrbaxCheckpoint")])
def test_orbax_checkpoint_under_several_processes_is_exit_2_naming_it(write_recipe, tmp_path,
                                                                      capsys, kind, callback, name):
    recipe = write_recipe(f"strategy: {{kind: {kind}}}\ncluster: {CLUSTERS[kind]}\n"
                          f"output: {{run_dir: {tmp_path / 'run'}}}\n"
                          f"callbacks: [TerminateOnNaN, {callback}]\n")
    assert main(["validate", str(recipe)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"callbacks.1: {name} is not accepted under strategy '{kind}'" in err
    assert "Use trainer.checkpoint" in err and "ModelCheckpoint (written by the chief only)" in err


def test_fit_refuses_it_before_anything_is_written(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    recipe = write_recipe(f"strategy: {{kind: multi_worker}}\ncluster: {CLUSTERS['multi_worker']}\n"
                          f"output: {{run_dir: {run_dir}}}\ncallbacks: [OrbaxCheckpoint]\n")
    assert main(["fit", str(recipe)]) == EXIT_BAD_INPUT
    assert "Received: 'OrbaxCheckpoint'" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.parametrize("kind", ["default", "mirrored"])
def test_one_process_may_use_it(kind):
    recipe = validate_recipe({"strategy": {"kind": kind}, "callbacks": [
        {"class_name": "OrbaxCheckpoint", "config": {"directory": "ckpt"}}]})
    assert recipe.callbacks[0].class_name == "OrbaxCheckpoint"

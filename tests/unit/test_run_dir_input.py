"""``output.run_dir`` input a user gets wrong: '~' (YAML null, never expanded) and the current
directory, which --overwrite cannot move aside (issue 52 N19)."""

from __future__ import annotations

import pytest

from kerasdist.cli import main
from kerasdist.config import load_recipe
from kerasdist.errors import EXIT_BAD_INPUT, RecipeError

RECIPE = "recipes/mnist_cnn.yaml"


def test_a_tilde_run_dir_is_refused_saying_it_is_not_expanded():
    with pytest.raises(RecipeError, match=r"it is null \(in YAML and --set, '~' and 'null' mean no "
                                          r"value, not the home directory"):
        load_recipe(RECIPE, ["output.run_dir=~"])
    with pytest.raises(RecipeError, match=r"starts with '~', which kerasdist does not expand.*"
                                          r"Received: run_dir='~/runs'"):
        load_recipe(RECIPE, ["output.run_dir=~/runs"])


def test_the_current_directory_as_run_dir_does_not_suggest_overwrite(tmp_path, monkeypatch,
                                                                     capsys):
    from pathlib import Path

    recipe = Path(RECIPE).resolve()
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    assert main(["fit", str(recipe), "--set", "output.run_dir=."]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "current directory or holds it, so --overwrite cannot move it aside" in err
    assert "pass --overwrite" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written

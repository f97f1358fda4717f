"""``kerasdist.fit``'s first argument: a Recipe, a recipe path, or a mapping (issue 33, item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kerasdist
from kerasdist import Recipe, RecipeError


@pytest.fixture
def ran(monkeypatch):
    """Replace the run itself: what ``kerasdist.fit`` hands to ``run_recipe``."""
    import kerasdist.launch

    calls = []
    monkeypatch.setattr(kerasdist.launch, "run_recipe",
                        lambda recipe, **kwargs: calls.append(recipe) or "result")
    return calls


def test_fit_takes_a_recipe_path_as_str_or_path(write_recipe, ran):
    path = write_recipe("trainer: {epochs: 2}")
    assert kerasdist.fit(str(path)) == "result"
    assert kerasdist.fit(Path(path)) == "result"
    assert all(isinstance(r, Recipe) and r.trainer.epochs == 2 for r in ran)


def test_fit_takes_a_mapping_and_validates_it(ran):
    assert kerasdist.fit({"trainer": {"epochs": 3}}) == "result"
    assert ran[0].trainer.epochs == 3
    with pytest.raises(RecipeError, match="trainer.epochs.*Received: 0"):
        kerasdist.fit({"trainer": {"epochs": 0}})


def test_fit_of_a_missing_path_is_a_recipe_error(tmp_path, ran):
    with pytest.raises(RecipeError, match="nope.yaml"):
        kerasdist.fit(str(tmp_path / "nope.yaml"))
    assert not ran


@pytest.mark.parametrize("bad", [None, 3, ["recipe.yaml"]])
def test_fit_of_anything_else_is_a_type_error_saying_what_to_pass(bad, ran):
    with pytest.raises(TypeError, match=r"kerasdist.fit takes a Recipe .*Received: "):
        kerasdist.fit(bad)
    assert not ran

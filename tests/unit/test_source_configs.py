"""Issue 41, item 1: ``data.source`` is a discriminated union of per-kind configs; the flat form
of earlier releases is lifted to it with one deprecation note naming the new form."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from kerasdist.cli import main
from kerasdist.config import load_recipe, validate_recipe
from kerasdist.config.source_configs import SourceConfigBase, source_config_classes
from kerasdist.errors import RecipeDeprecationWarning, RecipeError

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def _flat(raw: dict) -> dict:
    """A new-form recipe written in the flat form of 0.2 (the kind's fields beside source)."""
    data = dict(raw.get("data", {}))
    source = data.pop("source", "embedded")
    if isinstance(source, dict):
        source = dict(source)
        data = {**data, "source": source.pop("kind"), **source}
    return {**raw, "data": data}


def _deprecations(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RecipeDeprecationWarning)]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipe_and_its_flat_form_validate_to_the_same_recipe(path, monkeypatch):
    monkeypatch.chdir(path.parents[1])  # relative data paths, as the recipes are run
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    with warnings.catch_warnings(record=True) as new_form:
        warnings.simplefilter("always")
        recipe = validate_recipe(raw)
    assert _deprecations(new_form) == []
    flat = _flat(raw)
    with warnings.catch_warnings(record=True) as flat_form:
        warnings.simplefilter("always")
        lifted = validate_recipe(flat)
    assert lifted == recipe
    notes = _deprecations(flat_form)
    has_fields = set(flat["data"]) - set(raw["data"])
    assert len(notes) == (1 if has_fields else 0), notes
    if notes:
        assert f"data.source: {{kind: {recipe.data.kind}" in notes[0]
        assert "deprecated" in notes[0]


@pytest.mark.filterwarnings("default::kerasdist.errors.RecipeDeprecationWarning")  # as released
def test_the_cli_prints_one_deprecation_line_and_trains_the_flat_form(tmp_path, capsys):
    recipe = tmp_path / "flat.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "linear"},
        "data": {"source": "synthetic_linear", "num_examples": 64, "noise_std": 0.1,
                 "train_split": "train", "eval_split": None, "batch_size": 16},
        "trainer": {"epochs": 1, "verbose": 0},
        "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}, sort_keys=False),
        encoding="utf-8")
    assert main(["validate", str(recipe)]) == 0
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if "deprecated" in ln]
    assert len(lines) == 1 and lines[0].startswith("kerasdist: deprecated: data: the flat form")
    assert "data.source: {kind: synthetic_linear, num_examples: 64, noise_std: 0.1}" in lines[0]
    printed = yaml.safe_load(captured.out)
    assert printed["data"]["source"] == {"kind": "synthetic_linear", "num_examples": 64,
                                         "noise_std": 0.1}
    assert main(["fit", str(recipe)]) == 0
    import json

    info = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert info["recipe"]["data"]["source"]["kind"] == "synthetic_linear"  # stored in the new form
    assert (tmp_path / "run" / "metrics.json").exists()


def test_validate_shows_only_the_chosen_kinds_fields(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  source: {kind: synthetic_clicks, num_users: 8}\n",
                      encoding="utf-8")
    assert main(["validate", str(recipe)]) == 0
    source = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["data"]["source"]
    assert source == {"kind": "synthetic_clicks", "num_examples": 1000, "num_users": 8,
                      "num_items": 1048576}


@pytest.mark.parametrize(("data", "needles"), [
    ("{source: {kind: synthetic_linear, num_examples: -3}}",
     ["data.source.num_examples", "greater than 0", "Received: -3"]),
    ("{source: {kind: embedded, path: /tmp}}",
     ["data.source.path", "unknown key"]),
    ("{source: {kind: csvv, path: /tmp}}",
     ["data.source.kind", "unknown value 'csvv'", "'csv'"]),
    ("{source: {path: /tmp}}",
     ["data.source.kind is required", "Received: source={'path': '/tmp'}"]),
    ("{source: {kind: image_folder, path: /tmp, channels: 2}}",
     ["data.source.channels", "Received: 2"]),
    ("{source: {kind: python, function: 'not an import path'}}",
     ["data.source.function must be an import path", "Received: function='not an import path'"]),
])
def test_bad_source_input_names_the_field_and_value_and_exits_2(tmp_path, capsys, data, needles):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"data: {data}\n", encoding="utf-8")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    with pytest.raises(RecipeError):
        load_recipe(recipe)


def test_flat_fields_beside_a_source_mapping_are_moved_into_it(tmp_path):
    """``--set data.num_examples=...`` on a new-form recipe: one release, with the note."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  source: {kind: synthetic_linear, num_examples: 10}\n",
                      encoding="utf-8")
    with pytest.warns(RecipeDeprecationWarning, match="data.num_examples"):
        loaded = load_recipe(recipe, ["data.num_examples=50"])
    assert loaded.data.source.num_examples == 50
    assert load_recipe(recipe, ["data.source.num_examples=60"]).data.source.num_examples == 60


def test_a_flat_field_of_another_kind_is_ignored_as_before_and_named():
    with pytest.warns(RecipeDeprecationWarning, match=r"ignored.*: path"):
        recipe = validate_recipe({"data": {"source": "embedded", "path": "/nowhere"}})
    assert recipe.data.source.kind == "embedded"


def test_every_kind_is_one_config_class_with_traits_and_a_registered_module():
    from kerasdist.data import sources

    classes = source_config_classes()
    assert set(classes) == set(sources.available())
    for kind, cls in classes.items():
        assert issubclass(cls, SourceConfigBase) and cls.model_fields["kind"].default == kind
        assert cls.__doc__ and cls.traits is not None

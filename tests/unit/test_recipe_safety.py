"""A recipe is code and untrusted text: YAML limits, import paths only when asked, builders checked.

Each case ends in a bad-input error (exit code 2) naming the file or field and the value."""

from __future__ import annotations

import sys

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import ModelConfig, Recipe, apply_overrides, load_recipe
from kerasdist.errors import RecipeError
from kerasdist.models import registry

pytestmark = pytest.mark.timeout(120)


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs" recipe: 9 levels of 9 aliases, 9**9 strings once expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    lines.append(f"model: {{name: mnist_cnn, params: {{x: *a{levels - 1}}}}}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, needle", [
    (alias_bomb(), "expands to more than"),
    ("model: {params: {x: " + "[" * 5000 + "]" * 5000 + "}}\n", "nested deeper than"),
    ("a: &a [*a]\n", "recursive alias"),
    ("trainer: {epochs: " + "9" * 6000 + "}\n", "a value cannot be read"),
    ('model: {name: "a\x00"}\n', "malformed YAML"),
])
def test_hostile_yaml_is_refused_naming_the_file(write_recipe, text, needle):
    path = write_recipe(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_non_utf8_recipe_names_the_file_and_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes('model: {name: "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(RecipeError, match=r"latin1.yaml' is not UTF-8 text: byte 0xe9 at offset 18"):
        load_recipe(path)


def test_oversized_recipe_is_refused_before_parsing(write_recipe):
    path = write_recipe("# " + "x" * (5 << 20) + "\n")
    with pytest.raises(RecipeError, match="larger than"):
        load_recipe(path)


def test_set_value_has_the_same_limits(write_recipe):
    with pytest.raises(RecipeError, match=r"--set model.params.x.*nested deeper"):
        load_recipe(write_recipe("{}"), ["model.params.x=" + "[" * 5000 + "]" * 5000])


def test_no_overrides_means_no_copy():
    raw = {"model": {"params": {"x": [1, 2]}}}
    assert apply_overrides(raw, []) is raw
    assert apply_overrides(raw, ["trainer.epochs=2"]) is not raw


def test_aliases_under_the_limit_still_load(write_recipe):
    recipe = load_recipe(write_recipe("data: {batch_size: &b 32, shuffle_buffer: *b}\n"))
    assert recipe.data.shuffle_buffer == 32


# ------------------------------------------------------------------------ import paths (point A)
@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``kd_user_builder`` that records its import in a marker file."""
    marker = tmp_path / "imported.txt"
    (tmp_path / "kd_user_builder.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "def build(units=1):\n"
        "    import keras\n"
        "    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(units)])\n"
        "def compiled():\n"
        "    model = build()\n"
        "    model.compile(optimizer='sgd', loss='mse')\n"
        "    return model\n"
        "def number():\n"
        "    return 3\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop("kd_user_builder", None)


def test_validate_does_not_import_without_flag(user_module, write_recipe, capsys):
    path = write_recipe("model: {name: 'kd_user_builder:build', loss: mse, params: {nope: 1}}\n")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "checked for syntax only, not imported" in out and "--import" in out
    assert not user_module.exists()
    assert main(["validate", str(path), "--import"]) == EXIT_BAD_INPUT
    assert "model.params.nope" in capsys.readouterr().err
    assert user_module.exists()


def test_validate_json_note_goes_to_stderr(user_module, write_recipe, capsys):
    import json

    path = write_recipe("model: {name: 'kd_user_builder:build', loss: mse}\n")
    assert main(["validate", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model"]["name"] == "kd_user_builder:build"
    assert "not imported" in captured.err and not user_module.exists()


@pytest.mark.parametrize("name", ["os.:system", "os:sys tem", "1os:system", "os:"])
def test_import_path_syntax_is_checked_without_import(name):
    with registry.no_imports(), pytest.raises(RecipeError, match="not an import path"):
        registry.check(ModelConfig(name=name, loss="mse"))


def test_builtin_callables_are_refused_as_builders(write_recipe, capsys, tmp_path):
    path = write_recipe("model: {name: 'os:system', loss: mse, params: {command: 'touch "
                        f"{tmp_path / 'ran'}'}}}}\noutput: {{run_dir: '{tmp_path / 'run'}'}}\n")
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    assert "'os:system' is a built-in callable" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run").exists()


def test_module_that_fails_on_import_is_bad_input(tmp_path, monkeypatch):
    (tmp_path / "kd_broken_mod.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RecipeError, match="importing module 'kd_broken_mod' raised RuntimeError"):
        registry.resolve("kd_broken_mod:build", loss="mse")


@pytest.mark.parametrize("builder, needle", [
    ("kd_user_builder:compiled", "Received: a model compiled with optimizer SGD"),
    ("kd_user_builder:number", "must return an uncompiled keras.Model. Received: int"),
])
def test_builder_must_return_an_uncompiled_model(user_module, builder, needle):
    from kerasdist.training.model import build_compiled_model

    recipe = Recipe(model=ModelConfig(name=builder, loss="mse"))
    with pytest.raises(RecipeError, match=needle):
        build_compiled_model(recipe)


@pytest.mark.parametrize("model, needle", [
    (ModelConfig(params={"dropout": 2.0}), r"model.params: builder 'mnist_cnn' refused .*dropout"),
    (ModelConfig(metrics=["accuracy", "nope"]), r"model.metrics.1: unknown metric .*'nope'"),
    (ModelConfig(loss="nope"), r"model.loss: .*loss='nope'"),
])
def test_model_errors_are_recipe_errors(model, needle):
    from kerasdist.training.model import build_compiled_model

    with pytest.raises(RecipeError, match=needle):
        build_compiled_model(Recipe(model=model))


DUPLICATE = """model: {name: mnist_cnn}
data:
  batch_size: 32
  source: embedded
  batch_size: 64
"""


def test_duplicate_key_is_refused_naming_both_lines(write_recipe, capsys):
    """Issue 20: PyYAML keeps the last of two equal keys silently; a recipe is refused instead."""
    path = write_recipe(DUPLICATE)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert f"{path}:5:3" in message and "duplicate key 'batch_size'" in message
    assert "first on line 3, again on line 5" in message
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    assert "duplicate key 'batch_size'" in capsys.readouterr().err


def test_duplicate_key_in_a_set_value_is_refused(write_recipe):
    with pytest.raises(RecipeError, match=r"--set model.params.*duplicate key 'a' \(first on "
                                          r"line 1, again on line 1\)"):
        load_recipe(write_recipe("{}"), ["model.params={a: 1, a: 2}"])


def test_merge_keys_may_still_be_overridden():
    """``<<: *base`` then an explicit key is YAML's way to override, not a duplicate."""
    from kerasdist.config.loader import parse_yaml

    parsed = parse_yaml("base: &base {epochs: 1, seed: 7}\ntrainer: {<<: *base, epochs: 3}\n",
                        source="merge.yaml")
    assert parsed["trainer"] == {"epochs": 3, "seed": 7}

"""``kerasdist init``: the shipped templates stay the repository's recipes, every template's files
are written where its recipes read them, and bad input (an unknown template, a file in the way,
a DIR that is a file or not writable) exits 2 naming it with nothing written. The templates'
training runs: tests/multiprocess/test_init_templates.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kerasdist.cli import main
from kerasdist.cli_init import TEMPLATE_ROOT, TEMPLATES, InitError, init

ROOT = Path(__file__).resolve().parents[2]


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_every_template_recipe_is_the_repository_recipe_with_the_recipes_folder_dropped():
    """One source: recipes/X.yaml, with 'recipes/' removed from the paths it names, is
    kerasdist/templates/X.yaml. When recipes/ changes, copy it again:
    sed 's#recipes/##g' recipes/X.yaml > kerasdist/templates/X.yaml"""
    shipped = sorted(TEMPLATE_ROOT.rglob("*.yaml"))
    assert len(shipped) == 7
    for path in shipped:
        rel = path.relative_to(TEMPLATE_ROOT).as_posix()
        source = (ROOT / "recipes" / rel).read_text()
        assert path.read_text() == source.replace("recipes/", ""), (
            f"kerasdist/templates/{rel} differs from recipes/{rel}: "
            f"sed 's#recipes/##g' recipes/{rel} > kerasdist/templates/{rel}")


def test_every_template_file_is_used_and_every_named_file_ships():
    named = {p.relative_to(TEMPLATE_ROOT).as_posix() for t in TEMPLATES.values() for f in t.files
             for p in ([TEMPLATE_ROOT / f] if (TEMPLATE_ROOT / f).is_file()
                       else (TEMPLATE_ROOT / f).rglob("*"))}
    assert named == set(_tree(TEMPLATE_ROOT))


def test_the_shipped_table_is_what_make_recipe_data_writes(tmp_path):
    pytest.importorskip("sklearn")  # the .[recipes] extra
    spec = importlib.util.spec_from_file_location("make_recipe_data", ROOT / "tools" / "make_recipe_data.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.write_breast_cancer(tmp_path)
    shipped = {k: v for k, v in _tree(TEMPLATE_ROOT / "data" / "breast_cancer").items()
               if k.endswith(".csv")}
    assert shipped == _tree(tmp_path / "breast_cancer")


@pytest.mark.parametrize("name", ["mnist", "csv", "sweep"])
def test_a_template_writes_its_files_and_its_recipes_find_their_data(tmp_path, name, capsys):
    folder = tmp_path / "new" / "starter"  # created with its parent
    assert main(["init", name, str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"next: cd {folder} && {TEMPLATES[name].run}" in out
    written = _tree(folder)
    for rel, data in written.items():
        assert data == (TEMPLATE_ROOT / rel).read_bytes()
    recipes = [r for r in written if r.endswith(".yaml") and not r.startswith("sweeps/")]
    assert recipes and TEMPLATES[name].run.split()[-1] in written
    from kerasdist.config import load_recipe

    for rel in recipes:
        recipe = load_recipe(folder / rel)
        path = getattr(recipe.data.source, "path", None)
        if path:  # the csv files, relative to the folder the recipe runs from
            assert list(folder.glob(str(path).format(split="train"))), path
    if name == "sweep":
        assert yaml.safe_load(written["sweeps/mnist_cnn.yaml"])["recipe"] == "mnist_cnn.yaml"


def test_list_names_every_template_on_one_line_each(capsys):
    assert main(["init", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(TEMPLATES)


def test_an_unknown_template_exits_2_listing_the_known_ones(tmp_path, capsys):
    assert main(["init", "mnsit", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown template 'mnsit'" in err and "mnist, csv, images, sweep" in err
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_exits_2_naming_it_and_nothing_is_written(tmp_path, capsys):
    (tmp_path / "mnist_cnn_ps.yaml").write_text("mine\n")
    (tmp_path / "mnist_cnn_mwms.yaml").mkdir()
    assert main(["init", "mnist", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has mnist_cnn_mwms.yaml, mnist_cnn_ps.yaml already" in err and "wrote nothing" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnist_cnn_mwms.yaml", "mnist_cnn_ps.yaml"]
    assert (tmp_path / "mnist_cnn_ps.yaml").read_text() == "mine\n"


def test_a_file_where_a_data_folder_goes_is_in_the_way(tmp_path):
    (tmp_path / "data").write_text("")
    with pytest.raises(InitError, match="has data already"):
        init("csv", tmp_path)
    with pytest.raises(InitError, match="has data already"):
        init("images", tmp_path)  # refused before any PNG is written
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


def test_a_generated_folder_that_exists_is_in_the_way(tmp_path):
    (tmp_path / "data" / "mnist_rgb32").mkdir(parents=True)
    with pytest.raises(InitError, match=r"has data/mnist_rgb32 already"):
        init("images", tmp_path)
    assert not (tmp_path / "mnist_rgb_image_folder.yaml").exists()


@pytest.mark.parametrize("below", ["", "sub/folder"])
def test_a_dir_that_is_a_file_exits_2_naming_it(tmp_path, capsys, below):
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / below if below else tmp_path / "afile"
    assert main(["init", "mnist", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"'{tmp_path / 'afile'}' is a file, not a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_an_unwritable_dir_exits_2_naming_it(unprivileged):
    """As root (CI) the command runs as 'nobody' (the ``unprivileged`` fixture): root writes
    anywhere."""
    locked = unprivileged.base / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    done = subprocess.run([*unprivileged.argv, sys.executable, "-m", "kerasdist", "init", "mnist",
                           str(locked / "new")], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 2, done.stderr
    assert f"'{locked}' is not writable by this user" in done.stderr
    assert list(locked.iterdir()) == []

"""Bad input through the real command line: exit code 2, the file or field named, nothing written.

Hostile recipe files run as ``python -m kerasdist`` subprocesses (they must fail fast and in bounded
memory: a pytest timeout, not a timing assertion, guards that); model and data problems run through
``kerasdist.cli.main`` in this process (TensorFlow already loaded).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

pytestmark = pytest.mark.integration


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nmodel: {{params: {{x: *a{levels - 1}}}}}\n"


HOSTILE = {
    "bomb": (_bomb().encode(), "expands to more than 100000 YAML nodes"),
    "deep": (b"model: {params: {x: " + b"[" * 5000 + b"]" * 5000 + b"}}\n", "nested deeper than"),
    "latin1": ('model: {name: "caf\xe9"}\n'.encode("latin-1"), "is not UTF-8 text"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["validate", "fit"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_recipe_file_exits_2_naming_it(tmp_path, command, case):
    data, needle = HOSTILE[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "kerasdist", command, str(path)],
                          capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    assert needle in done.stderr and str(path) in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no runs/ written


def _npz(tmp_path, *, side=28, label=None, nan=False, n=64):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, side, side)).astype(np.float32 if nan else np.uint8)
    if nan:
        x[3, 0, 0] = np.nan
    y = np.arange(n) % 10
    if label is not None:
        y[5] = label
    path = tmp_path / "data.npz"
    np.savez(path, x_train=x, y_train=y, x_test=x, y_test=y)
    return path


def _fit(tmp_path, capsys, model="{}", **data):
    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    npz = _npz(tmp_path, **data)
    recipe.write_text(f"model: {model}\n"
                      f"data: {{source: {{kind: npz, path: '{npz}'}}, train_split: train, "
                      f"eval_split: test, batch_size: 32}}\n"
                      f"trainer: {{epochs: 1, steps_per_epoch: 1, verbose: 0}}\n"
                      f"output: {{run_dir: '{run_dir}', tensorboard: false}}\n", encoding="utf-8")
    code = main(["fit", str(recipe)])
    return code, capsys.readouterr().err, run_dir


@pytest.mark.timeout(180)
@pytest.mark.parametrize("model, needle", [
    ("{params: {dropout: 2.0}}", "model.params: builder 'mnist_cnn' refused its parameters"),
    ("{metrics: [accuracy, nope]}", "model.metrics.1: unknown metric"),
])
def test_model_errors_exit_2_before_run_json(tmp_path, capsys, model, needle):
    code, err, run_dir = _fit(tmp_path, capsys, model=model)
    assert code == EXIT_BAD_INPUT and needle in err and "Traceback" not in err
    assert not (run_dir / "run.json").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("data, needle", [
    ({"label": 10}, "labels must be in [0, 10)"),
    ({"label": 255}, "Received: label 255"),
    ({"side": 32}, "do not fit the input (28, 28, 1)"),
    ({"nan": True}, "NaN/inf"),
])
def test_bad_data_exits_2_before_run_json(tmp_path, capsys, data, needle):
    code, err, run_dir = _fit(tmp_path, capsys, **data)
    assert code == EXIT_BAD_INPUT and needle in err and "Traceback" not in err
    assert not (run_dir / "run.json").exists()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("data, needle", [
    ({"label": 255}, "Received: label 255"),
    ({"side": 32}, "do not fit the input (28, 28, 1)"),
    ({"nan": True}, "NaN/inf"),
])
def test_validate_check_data_reports_bad_data(tmp_path, capsys, data, needle):
    npz = _npz(tmp_path, **data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"data: {{source: {{kind: npz, path: '{npz}'}}, train_split: train, "
                      f"eval_split: test, batch_size: 32}}\noutput: {{run_dir: '{tmp_path / 'run'}'}}\n",
                      encoding="utf-8")
    assert main(["validate", str(recipe), "--check-data"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert needle in err and str(npz) in err and not (tmp_path / "run").exists()

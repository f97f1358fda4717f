"""Edges of the csv source: ``--overwrite`` on a finished run (the run's vocabularies and
statistics, ``data/csv-schema.json``, are written into the new run directory, not lost with the
old one moved aside); a column whose variance float32 cannot hold (refused before training,
issue 52 N9, instead of failing at the end while saving the inference model)."""

from __future__ import annotations

import json

import pytest

from kerasdist.cli import main
from kerasdist.errors import EXIT_BAD_INPUT

pytestmark = pytest.mark.integration


def test_overwrite_of_a_finished_csv_run_trains_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "csv", "."]) == 0
    fit = ["fit", "breast_cancer_csv.yaml", "--set", "trainer.epochs=1", "--quiet"]
    assert main(fit) == 0
    first = json.loads((tmp_path / "runs/breast_cancer_csv/metrics.json").read_text())
    assert main([*fit, "--overwrite"]) == 0
    again = json.loads((tmp_path / "runs/breast_cancer_csv/metrics.json").read_text())
    assert (tmp_path / "runs/breast_cancer_csv/data/csv-schema.json").is_file()
    assert again["weights_sha256"] == first["weights_sha256"]  # afresh: the same run again


def test_a_column_whose_variance_overflows_float32_is_refused_before_training(tmp_path,
                                                                            monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "csv", "."]) == 0
    part = tmp_path / "data/breast_cancer/train-001.csv"
    lines = part.read_text().splitlines()
    row = lines[1].split(",")
    row[1] = "3e38"  # finite in float32; its square is not
    lines[1] = ",".join(row)
    part.write_text("\n".join(lines) + "\n")
    assert main(["validate", "breast_cancer_csv.yaml", "--check-data"]) == EXIT_BAD_INPUT
    assert main(["fit", "breast_cancer_csv.yaml", "--set", "trainer.epochs=1"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "column 'mean_texture'" in err and "not finite in float32" in err
    assert not (tmp_path / "runs").exists()  # nothing written

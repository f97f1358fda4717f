"""``--overwrite`` on a finished csv run: the run's vocabularies and statistics
(``data/csv-schema.json``) are written into the new run directory, not lost with the old one moved
aside (the second fit failed with FileNotFoundError)."""

from __future__ import annotations

import json

import pytest

from kerasdist.cli import main

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

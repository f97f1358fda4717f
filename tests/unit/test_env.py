"""``kerasdist env``: versions, devices, mends and the validated cluster role."""

from __future__ import annotations

import json

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

pytestmark = pytest.mark.timeout(120)

TWO_WORKERS = {"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
               "task": {"type": "worker", "index": 1}}


def _env(capsys, *args) -> tuple[int, dict]:
    code = main(["env", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_report_names_versions_devices_and_mends(capsys, monkeypatch):
    import keras
    import tensorflow as tf

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    code, report = _env(capsys)
    assert code == 0
    assert report["versions"]["tensorflow"] == tf.__version__
    assert report["versions"]["keras"] == keras.__version__
    from importlib import metadata

    try:
        ray_version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray_version = None
    assert report["versions"]["ray"] == ray_version
    assert report["environment"]["KERAS_BACKEND"] == "tensorflow"
    assert "CPU:0" in report["devices"]
    import importlib

    from kerasdist import _compat

    # Every mend of the index is reported, by name, with whether it is installed or needed.
    modules = [importlib.import_module(name) for name in _compat.MENDS + _compat.ENABLE_MENDS]
    assert set(report["mends"]) == {module.NAME for module in modules}
    assert {"keras#20585", "tensorflow#72388", "keras#20582"} <= set(report["mends"])
    states = {"active", "needed", "not needed", "not applicable"}
    assert set(report["mends"].values()) <= states | {f"unknown version: {s}" for s in states}
    assert report["supported"] == {"tensorflow": ">=2.20,<2.22", "keras": ">=3.14,<3.16"}
    assert report["cluster"]["source"] == "none"


def test_tf_config_role_is_validated(capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TWO_WORKERS))
    code, report = _env(capsys)
    assert code == 0 and report["cluster"] == {"source": "TF_CONFIG", "role": "worker:1",
                                               "is_chief": False, "tasks": {"worker": 2}}
    bad = {**TWO_WORKERS, "task": {"type": "worker", "index": 5}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(bad))
    code, report = _env(capsys)
    assert code == EXIT_BAD_INPUT and "index=5" in report["cluster"]["error"]


def test_seed_style_flags_give_the_role(capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    code, report = _env(capsys, "--job-name", "ps", "--ps-hosts", "localhost:2222",
                        "--worker-hosts", "localhost:2223,localhost:2224")
    assert code == 0 and report["cluster"]["source"] == "flags"
    assert report["cluster"]["role"] == "ps:0" and report["cluster"]["tasks"] == {
        "ps": 1, "worker": 2}

"""What a user adopting the package gets: the license, the typed marker and the init templates in
the wheel, one version, a requires-python the logged quickstarts bear out, a container image that
runs as a non-root user, and export defaults that match that image."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from kerasdist._version import __version__
from kerasdist.cluster import export

ROOT = Path(__file__).resolve().parents[2]


def test_license_is_the_apache_2_text_pyproject_declares():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_version_has_one_source():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in meta["project"]["dynamic"] and "version" not in meta["project"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "kerasdist._version.__version__"}
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text()


@pytest.mark.timeout(300)
def test_wheel_ships_py_typed_the_embedded_sample_and_the_templates(tmp_path):
    """Type checkers read kerasdist's annotations only when py.typed is inside the installed
    package; the offline MNIST sample and the templates of `kerasdist init` must ship too."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("kerasdist-*.whl")
    assert wheel.name.startswith(f"kerasdist-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kerasdist/py.typed" in names
    assert any(n.startswith("kerasdist/data/sample/") and n.endswith(".gz") for n in names)
    templates = ROOT / "kerasdist" / "templates"  # what `kerasdist init` writes
    shipped = {f"kerasdist/templates/{p.relative_to(templates).as_posix()}"
               for p in templates.rglob("*") if p.is_file()}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names)


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_image_runs_as_the_non_root_user_the_tfjob_pods_name():
    text = _dockerfile()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(rf"useradd --uid {export.IMAGE_UID}\b", text)
    manifest = export.tfjob_manifest(_ps_recipe(), recipe_path="recipes/r.yaml",
                                     image=export.DEFAULT_IMAGE, pvc="runs")
    for replica in manifest["spec"]["tfReplicaSpecs"].values():
        context = replica["template"]["spec"]["securityContext"]
        assert context == {"runAsNonRoot": True, "runAsUser": export.IMAGE_UID,
                           "runAsGroup": export.IMAGE_UID, "fsGroup": export.IMAGE_UID}


def test_export_defaults_to_the_image_tag_the_docs_tell_users_to_build():
    assert export.DEFAULT_IMAGE == f"kerasdist:{__version__}"
    build = f"docker build -t {export.DEFAULT_IMAGE} ."
    assert build in _dockerfile()
    assert build in (ROOT / "README.md").read_text()
    from kerasdist.cli import build_parser

    args = build_parser().parse_args(["export", "tfjob", "recipes/mnist_cnn_ps.yaml"])
    assert args.image == export.DEFAULT_IMAGE


def _ps_recipe():
    from kerasdist.config import validate_recipe

    return validate_recipe({"strategy": {"kind": "parameter_server"},
                            "cluster": {"kind": "local", "workers": 2, "ps": 1}})


def _quickstart_logs() -> list[tuple[str, int, int | None]]:
    """(Python version, install rc, fit rc or None) of every logged quickstart_python.sh run."""
    runs = []
    for log in sorted((ROOT / "docs" / "version-runs").glob("*/py*.quickstart.log")):
        text = log.read_text()
        python = re.search(r"^quickstart: Python (\S+)", text, re.M).group(1)
        install = int(re.search(r"^quickstart: install rc (\d+)", text, re.M).group(1))
        fit = re.search(r"^quickstart: fit rc (\d+)", text, re.M)
        runs.append((python, install, int(fit.group(1)) if fit else None))
    return runs


def test_requires_python_admits_no_python_where_the_quickstart_failed():
    """What the logs of tools/quickstart_python.sh found: the install fails on 3.10 (Keras needs
    3.11+), the quickstart passes on 3.11, 3.12 and 3.13. requires-python admits exactly the
    Pythons that passed."""
    from packaging.specifiers import SpecifierSet

    admitted = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())
                            ["project"]["requires-python"])
    runs = _quickstart_logs()
    assert {p.rsplit(".", 1)[0] for p, _, fit in runs if fit == 0} >= {"3.11", "3.12", "3.13"}
    for python, install, fit in runs:
        assert (python in admitted) == (install == 0 and fit == 0), (python, install, fit)

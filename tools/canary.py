"""The upgrade canary (issue 32): kerasdist on a given TensorFlow/Keras pair in a scratch venv.

For one pair it builds (or reuses) a virtual environment, installs ``tensorflow==TF``,
``keras==KERAS``, kerasdist's other requirements and ``test`` extras (keras-hub left out) and this
checkout (``-e . --no-deps``, so a pair outside the pins installs too), then

* reads every probe of :mod:`kerasdist._compat` there (``_compat.probes()``) and prints the ones
  that *flipped* against the probes of the interpreter running this script (the baseline), and
  the patched symbols whose signature differs from ``tests/unit/compat_targets.json``;
* prints ``kerasdist env``'s mends table there (active / needed / not needed / unknown version);
* unless ``--no-matrix``, runs the core conformance matrix there (``kerasdist conformance`` on
  the 14 cases of ``tests/conformance/test_matrix_core.py``) and prints the cells whose verdict
  differs from ``tests/conformance/expected.json``.

Default versions: the newest the package index serves, pre-releases included (``pip index
versions --pre``). The result is also written as JSON (``--json``), which
``tools/supported_versions.py`` turns into ``docs/architecture.md``'s table.

Examples::

    python tools/canary.py                                   # newest TF and Keras, pre-releases too
    python tools/canary.py --tf 2.19.1 --keras 3.15.1 --venv /work/venv-tf219 --json out.json
    python tools/canary.py --tf 2.20.0 --keras 3.15.1 --no-matrix

Exit code: 0 when the venv was built and the probes read (flips and changed cells are findings,
printed, not failures); 1 when the install or a probe run failed; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE_MATRIX = ROOT / "tests" / "conformance" / "test_matrix_core.py"
EXPECTED = ROOT / "tests" / "conformance" / "expected.json"
_PROBE_CODE = ("import json, warnings; warnings.simplefilter('ignore');"
               "from kerasdist import _compat; from kerasdist._compat import versions;"
               "probes = _compat.probes(); mends = _compat.status();"
               "print(json.dumps({'versions': versions.installed(), 'probes': probes,"
               " 'mends': mends, 'warning': versions.warning_line()}))")


def newest(package: str, pip: list[str]) -> str:
    """The newest version of ``package`` on the index, pre-releases included."""
    out = subprocess.run([*pip, "index", "versions", "--pre", package], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    match = re.search(r"Available versions:\s*([^,\s]+)", out)
    if not match:
        raise RuntimeError(f"pip index versions --pre {package}: no version in {out!r}")
    return match.group(1)


def core_cases() -> list[str]:
    """The 14 case names of the core matrix (parsed from its test file, no import)."""
    text = CORE_MATRIX.read_text()
    block = re.search(r"CORE = \((.*?)\)\n", text, re.S).group(1)
    return re.findall(r'"([a-z0-9_]+)"', block)


def probe(python: str) -> dict:
    """Probes, mends table and versions read by ``python`` (a subprocess; no TF op runs)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-c", _PROBE_CODE], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"probe run failed ({python}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def requirements() -> list[str]:
    """kerasdist's dependencies and ``test`` extras from ``pyproject.toml``, less TensorFlow and
    Keras (given exactly instead) and keras-hub (its tensorflow-text follows TF's minor; only the
    full matrix's KerasHub case needs it), so that a pair outside the pins still installs."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    return [r for r in wanted if not re.match(r"(tensorflow|keras|keras-hub)\b(?![-_])", r)]


def build(venv: Path, tf: str, keras: str) -> float:
    """Create ``venv`` (if absent), install the pair, kerasdist's other requirements and this
    checkout (``--no-deps``: its pins would refuse a newer pair); returns seconds."""
    start = time.monotonic()
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"tensorflow=={tf}", f"keras=={keras}", *requirements()],
                   check=True, timeout=3600)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True, timeout=1800)
    return time.monotonic() - start


def matrix(python: str, work: Path, timeout_s: float) -> tuple[dict, float, int]:
    """The core matrix's cells (``{case: {strategy: status}}``), its seconds and exit code."""
    out = work / "conformance.md"
    start = time.monotonic()
    done = subprocess.run(
        [python, "-m", "kerasdist", "conformance", "--cases", ",".join(core_cases()),
         "--out", str(out), "--timeout-s", str(timeout_s)],
        capture_output=True, text=True, timeout=timeout_s + 900, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.monotonic() - start
    json_out = out.with_suffix(".json")
    if not json_out.exists():
        sys.stderr.write(done.stderr[-3000:])
        return {}, seconds, done.returncode
    cells = json.loads(json_out.read_text())["cells"]
    return ({case: {s: v["status"] for s, v in row.items()} for case, row in cells.items()},
            seconds, done.returncode)


def flipped(base: dict, other: dict) -> dict:
    """``{probe: [baseline answer, other answer]}`` for the probes that differ."""
    return {k: [base.get(k), other.get(k)] for k in sorted(set(base) | set(other))
            if base.get(k) != other.get(k)}


def changed_cells(cells: dict) -> dict:
    """``{"case/strategy": [expected, got]}`` for the cells that differ from expected.json."""
    expected = json.loads(EXPECTED.read_text())
    return {f"{case}/{s}": [expected.get(case, {}).get(s), got]
            for case, row in sorted(cells.items()) for s, got in sorted(row.items())
            if expected.get(case, {}).get(s) != got}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tf", help="tensorflow version (default: the newest, pre-releases too)")
    parser.add_argument("--keras", help="keras version (default: the newest, pre-releases too)")
    parser.add_argument("--venv", type=Path, help="venv folder (default: a new one under "
                        "/tmp, kept for reuse: remove it yourself)")
    parser.add_argument("--no-matrix", action="store_true", help="probes and mends table only")
    parser.add_argument("--timeout-s", type=float, default=1500.0,
                        help="the matrix's limit per strategy, seconds (default 1500)")
    parser.add_argument("--json", type=Path, help="write the result here as JSON")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    pip = [sys.executable, "-m", "pip"]
    tf = args.tf or newest("tensorflow", pip)
    keras = args.keras or newest("keras", pip)
    venv = args.venv or Path(tempfile.gettempdir()) / f"kerasdist-canary-tf{tf}-keras{keras}"
    print(f"canary: tensorflow {tf}, keras {keras}, venv {venv}", flush=True)
    result: dict = {"tensorflow": tf, "keras": keras, "venv": str(venv)}
    try:
        result["install_s"] = round(build(venv, tf, keras), 1)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        print(f"canary: install failed: {err}", file=sys.stderr)
        result["install"] = "failed"
        _write(args.json, result)
        return 1
    python = str(venv / "bin" / "python")
    base = probe(sys.executable)
    here = probe(python)
    signatures = subprocess.run(
        [python, str(ROOT / "tools" / "compat_targets.py"), "--check"], capture_output=True,
        text=True, timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if signatures.returncode == 0:
        result["signatures"] = json.loads(signatures.stdout.strip().splitlines()[-1])
        print("canary: patched symbols whose signature differs from tests/unit/compat_targets.json:"
              + ("".join(f"\n  {k}" for k in result["signatures"]["differ"]) or " none")
              + f" (of {result['signatures']['symbols']})")
    result.update(baseline_versions=base["versions"], versions=here["versions"],
                  probes=here["probes"], mends=here["mends"], warning=here["warning"],
                  flipped=flipped(base["probes"], here["probes"]))
    print(f"canary: baseline {base['versions']}, here {here['versions']}")
    if here["warning"]:
        print(f"canary: warning there: {here['warning']}")
    print("canary: probes flipped against the baseline:"
          + ("".join(f"\n  {k}: {a} -> {b}" for k, (a, b) in result["flipped"].items()) or " none"))
    print("canary: mends there:" + "".join(f"\n  {k:<30} {v}" for k, v in here["mends"].items()))
    if not args.no_matrix:
        with tempfile.TemporaryDirectory(prefix="kerasdist-canary-") as work:
            cells, seconds, code = matrix(python, Path(work), args.timeout_s)
        result.update(cells=cells, matrix_s=round(seconds, 1), matrix_exit=code,
                      changed=changed_cells(cells))
        print(f"canary: core matrix exit {code} in {seconds:.0f} s; cells changed against "
              "expected.json:" + ("".join(f"\n  {k}: expected {a}, got {b}"
                                          for k, (a, b) in result["changed"].items()) or " none"))
    _write(args.json, result)
    return 0


def _write(path, result) -> None:
    if path is not None:
        path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())

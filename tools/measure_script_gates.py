#!/usr/bin/env python3
"""Run the users' scripts of ``tests/scripts`` under ``kerasdist launch`` N times, exactly as the
launch and Ray tests run them, and print the spread of the held-out accuracy they print.

The scripts set no seed (a user's script draws fresh weights each run), so each run is a new draw
of the value the tests gate. Kinds (``--kind``, repeatable):

* ``mwms``: ``launch --workers 2 mnist_multi_worker.py DATA 4`` (tests/multiprocess/test_launch.py)
* ``ps``: ``launch --ps 1 --workers 2 mnist_parameter_server.py DATA OUT 4`` (same file)
* ``ray``: ``launch --ray --workers 2 mnist_multi_worker.py DATA 4`` (tests/multiprocess/test_ray.py)

For each kind the table gives n, min, median, max, sample standard deviation and the highest gate
that sits >= 4 sd and >= 0.005 below the lowest run (the rule of docs/recipe-accuracy.md),
rounded down to 0.005. Accuracy is on 2,000 digits, so one digit is 0.0005.

Usage (2 shared cores: one run at a time)::

    nice -n 10 python tools/measure_script_gates.py --kind mwms --kind ps --runs 8

Exit status: 0 when every run exited 0 and printed its accuracy, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"
DATA = REPO / "kerasdist" / "data" / "sample"
PRINTED = re.compile(r"(?:task worker:\d|coordinator) held-out accuracy: ([\d.]+)")


def command(kind: str, tmp: Path, epochs: int) -> list[str]:
    """The ``kerasdist launch`` argv of one run of ``kind`` (mwms, ps or ray) in folder ``tmp``."""
    base = [sys.executable, "-m", "kerasdist", "launch", "--threads-per-task", "1",
            "--log-dir", str(tmp / "logs")]
    if kind == "mwms":
        return base + ["--workers", "2", str(SCRIPTS / "mnist_multi_worker.py"), str(DATA),
                       str(epochs)]
    if kind == "ray":
        return base + ["--ray", "--workers", "2", str(SCRIPTS / "mnist_multi_worker.py"),
                       str(DATA), str(epochs)]
    if kind == "ps":
        return base + ["--ps", "1", "--workers", "2", str(SCRIPTS / "mnist_parameter_server.py"),
                       str(DATA), str(tmp / "out"), str(epochs)]
    raise ValueError(f"--kind: expected mwms, ps or ray, got {kind!r}")


def gate(values: list[float]) -> float:
    """The highest multiple of 0.005 that is >= 4 sd and >= 0.005 below min(values)."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    top = min(values) - max(4 * spread, 0.005)
    return math.floor(top / 0.005 + 1e-9) * 0.005


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", action="append", choices=["mwms", "ps", "ray"], required=True)
    parser.add_argument("--runs", type=int, default=5, help="runs per kind (default 5)")
    parser.add_argument("--epochs", type=int, default=4, help="the scripts' EPOCHS (default 4)")
    args = parser.parse_args(argv)
    ok = True
    rows = []
    for kind in args.kind:
        values = []
        for run in range(args.runs):
            with tempfile.TemporaryDirectory(prefix=f"gate-{kind}-") as tmp:
                began = time.monotonic()
                done = subprocess.run(command(kind, Path(tmp), args.epochs), cwd=tmp,
                                      capture_output=True, text=True, timeout=900)
                found = [float(v) for v in PRINTED.findall(done.stdout + done.stderr)]
            wall = time.monotonic() - began
            if done.returncode != 0 or not found:
                ok = False
                print(f"{kind} run {run + 1}: exit {done.returncode}, accuracy {found}",
                      done.stderr[-2000:], sep="\n", flush=True)
                continue
            values.append(min(found))
            print(f"{kind} run {run + 1}: accuracy {found} ({wall:.0f} s)", flush=True)
        if values:
            rows.append((kind, values))
    print("\n| kind | n | min | median | max | sd | gate (>= 4 sd, >= 0.005 below min) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kind, values in rows:
        spread = statistics.stdev(values) if len(values) > 1 else float("nan")
        print(f"| {kind} | {len(values)} | {min(values):.4f} | {statistics.median(values):.4f} | "
              f"{max(values):.4f} | {spread:.4f} | {gate(values):.3f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

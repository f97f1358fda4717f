"""tools/bandwidth_bench.py on 2 simulated hosts: one short row, its printed fields, its cleanup.

Needs root (network namespaces); skipped otherwise. The whole grid and its figures:
docs/benchmarks.md, "Scaling where the network is the limit".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.startswith("kdbw")}


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(400)
def test_one_row_on_two_capped_hosts_prints_measured_and_model_figures(tmp_path):
    """multi_worker with bf16 gradients on 2 hosts linked at 100 Mbit/s: the row's line has
    examples/s, the bytes sent per step (close to the ring all-reduce's 2 (n-1)/n x 6.5 MB per
    worker plus TCP/IP framing) and the model's figures beside them; the namespaces are gone."""
    before = _namespaces()
    argv = [sys.executable, "tools/bandwidth_bench.py", "--rows", "mw-bf16", "--hosts", "2",
            "--caps", "100", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=360)
    finally:
        leftover = _namespaces() - before
    print("\n" + done.stdout[-2000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert leftover == set(), leftover
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("| mw-bf16 |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[:3] == ["mw-bf16", "2", "100 Mbit/s"], line
    steps, rate, sent, model_sent, busiest, model_rate, ratio = (float(c) for c in cells[3:10])
    assert steps >= 4 and rate > 0 and model_rate > 0, line
    assert ratio == pytest.approx(rate / model_rate, rel=0.02), line
    # 2 workers each send G/2 x 2 = 6.55 MB of bf16 gradients per step, 13.1 MB in all, in
    # 1500-byte frames (x 1514/1448): 13.70 MB; measured 1.046-1.048 x the payload
    assert model_sent == pytest.approx(13.70, abs=0.01), line
    assert 0.97 * model_sent <= sent <= 1.05 * model_sent, line
    # the cap binds: no link above 100 Mbit/s, and ~6.9 MB per worker take > 0.5 s
    assert 0 < busiest <= 101 and rate < 64 / 0.5, line
    result = json.loads((tmp_path / "bandwidth.json").read_text())
    row = result["rows"][0]
    assert "error" not in row and row["model_limit"] == "wire", row
    assert all(mbit <= 100 for mbit in row["link_mbit_by_host"]), row
    assert re.search(r"total \d+ s", done.stdout)
    assert (tmp_path / "bandwidth.png").is_file()

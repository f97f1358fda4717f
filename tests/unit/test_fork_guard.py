"""Nothing is forked from a process whose TensorFlow runtime has started
(:mod:`kerasdist._compat.tf_runtime`, :mod:`kerasdist.launch.forking`): a child forked after that
inherits a runtime without its threads (it hung, or refused to size its thread pools: "Intra op
parallelism cannot be modified after initialization", seen when a function data source's check
ran a ``tf.data`` op in the command)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
from kerasdist._compat import tf_runtime
from kerasdist.launch import forking

forking._STATE["warm"] = True  # as after the forked check of a fit
task = [sys.executable, "-m", "kerasdist", "fit", "r.yaml"]
import tensorflow as tf
before = (tf_runtime.started(), forking.launcher_ready(), forking.ready(task))
tf.data.Dataset.range(3)  # a data check's op: the runtime starts
after = (tf_runtime.started(), forking.launcher_ready(), forking.ready(task), forking._STATE["spent"])
print(before, after)
"""


@pytest.mark.timeout(120)
def test_a_process_whose_runtime_started_forks_nothing():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=110, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = done.stdout.strip().splitlines()[-1].split(") (")
    assert before == "(False, True, True"  # TensorFlow imported, no runtime: forks allowed
    assert after == "True, False, False, True)"  # runtime started: nothing forked from here on

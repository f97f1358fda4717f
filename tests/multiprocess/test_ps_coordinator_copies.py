"""Issue 39, item 2 (the parameter-server crash): the coordinator's copies of scheduled calls'
results must not use TensorFlow's cluster function library runtime from the
``ClusterCoordinator``'s worker threads, where they race with its instantiations
(:mod:`kerasdist._compat.tf_coordinator_copies` explains the race and the mend).

The child (``ps_copy_threads.py``) runs a parameter-server ``model.fit`` with TensorFlow's
``cluster_function_library_runtime`` logging on (``CFLR::Instantiate: <function> on <task>``, one
line per instantiation, with the native thread id). The coordinator's eager context instantiates
``__wrapped__<Op>`` functions there for every eager op whose input lives on another task (TF runs
eager ops as functions). Before the mend, each closure thread copied its call's outputs with such
an op (``__wrapped__Identity`` on ``/job:worker/...``), instantiating while the other closure
thread ran the same runtime's ``Run``; with the mend, only the main thread instantiates there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess]

CHILD = Path(__file__).with_name("ps_copy_threads.py")
INSTANTIATE = re.compile(r"^I\d{4} [\d:. ]+?(\d+) cluster_function_library_runtime\.cc:\d+\] "
                         r"CFLR::Instantiate: (__wrapped__\w+)\S* on (\S+)")


def _run_child(tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="cluster_function_library_runtime=1",
               PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(CHILD)], env=env, cwd=tmp_path, text=True,
                          capture_output=True, timeout=240)


@pytest.mark.timeout(300)
def test_only_the_main_thread_instantiates_coordinator_functions_during_a_ps_fit(tmp_path):
    done = _run_child(tmp_path)
    assert done.returncode == 0 and "FIT_DONE" in done.stderr, done.stderr[-6000:]
    main = re.search(r"MAIN_TID=(\d+)", done.stderr).group(1)
    found = [m.groups() for m in map(INSTANTIATE.match, done.stderr.splitlines()) if m]
    assert found, "no CFLR::Instantiate line: TF's log format changed, the test sees nothing"
    off_main = [(tid, name, task) for tid, name, task in found if tid != main]
    assert not off_main, (
        f"the coordinator instantiated {len(off_main)} function(s) in threads other than the "
        f"main thread (tid {main}), racing with the closure threads' CFLR::Run: {off_main}")

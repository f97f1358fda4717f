"""Issue 39, point 3: SIGINT/SIGTERM during start-up raise ``Interrupted`` (exit 130/143); the
handlers and the wakeup fd are restored after the block. The watcher that ends a process whose
main thread is blocked in TensorFlow is tested with real signals on ``kerasdist fit``
(``tests/multiprocess/test_startup_waits.py``)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from kerasdist._signals import startup
from kerasdist.errors import PREEMPTED, Interrupted, classify, exit_code

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_in_a_startup_block_raises_interrupted_naming_the_phase(signum, code):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as raised:
        with startup("reading the recipe"), startup("counting the examples of 'x'"):
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises here at once
    err = raised.value
    assert str(err) == f"{signal.Signals(signum).name} received while counting the examples of 'x'"
    assert classify(err) == PREEMPTED and exit_code(classify(err), err) == code
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(-1) == -1  # none left behind


def test_other_interruptions_keep_exit_130():
    assert exit_code(PREEMPTED, KeyboardInterrupt()) == 130
    assert exit_code(PREEMPTED) == 130

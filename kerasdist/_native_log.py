"""Keep TensorFlow's native noise (start-up, teardown) off the console.

:func:`filter_native_stderr` routes file descriptor 2 through a pipe read by a thread that drops
exactly the known lines TensorFlow writes from C++ before its logging is configured (:data:`NOISE`:
absl's banner, oneDNN and CUDA notices, ``failed call to cuInit`` on a CPU-only machine) and the
flood of "Failed to remove function remotely" lines of a stopping parameter-server coordinator
(:class:`NoiseDropper`); everything else passes through unchanged. ``--verbose 2`` (or
``KERASDIST_RAW_STDERR=1``) leaves stderr alone.

The filter lasts until the process ends: TensorFlow's destructors write while the interpreter
finalizes, when the filter's thread can no longer run, so the process ends in the filter's
``atexit`` hook (:func:`end_with`): streams flushed, the filter drained, ``os._exit(code)``,
after every output was written and closed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading

NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"^I\d{4} [\d:. ]+\d+ \S+\.cc:\d+\] "),  # native INFO lines
    re.compile(r"^E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit"),
    re.compile(r"^W\d{4} [\d:. ]+\d+ gpu_device\.cc:\d+\] Cannot dlopen some GPU libraries"),
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow"),
    # a local Ray in kerasdist's private network namespace (only loopback) finds no route out
    re.compile(r"^\[[\d\- :,]+ W \d+ \d+\] network_util\.cc:\d+: Failed to determine local IP "
               r"via external connectivity"),
)
"""Lines dropped: absl's pre-init banner, native INFO lines, the CPU-only machine's cuInit error
and GPU-library warnings (TensorFlow 2.21), and Ray 2.60's warning that a namespace with only
loopback has no route to the internet."""


TEARDOWN = re.compile(r"^E\d{4} [\d:. ]+\d+ context\.cc:\d+\] Failed to remove function "
                      r"remotely due to ")
"""The first line of the message TensorFlow's eager context writes, once per traced function and
remote task, when a parameter-server coordinator's functions are released after its ps and
worker tasks have stopped (a preempted run: hundreds of lines). Dropped together with its
continuation lines (:data:`TEARDOWN_CONTINUED`)."""
TEARDOWN_CONTINUED = (
    re.compile(r"^Additional GRPC error information from remote target /job:"),
    re.compile(r"^:UNKNOWN:Error received from peer "),
    re.compile(r"^This could happen if the remote target has been disconnected from the client"),
)


PY_FUNC_FAILURE = re.compile(r"^W\d{4} [\d:. ]+\d+ (op_kernel|local_rendezvous)\.cc:\d+\] .*"
                             r"(UNKNOWN|INVALID_ARGUMENT): [A-Z]\w*(Error|Exception)\b")
"""The first line of the warning TensorFlow's executor writes (once per kernel and once per
rendezvous) when a Python function inside a ``tf.data`` pipeline raised, e.g. a user's
``Dataset.from_generator`` generator mid-training: the Python traceback follows on its own lines.
kerasdist reports that error once, naming the data function
(:func:`kerasdist.data.sources.functions.from_user_code`); dropped with its traceback
(:data:`PY_FUNC_CONTINUED`)."""
PY_FUNC_CONTINUED = (
    re.compile(r"^$"),
    re.compile(r"^Traceback \(most recent call last\):$"),
    re.compile(r"^  File \""),
    re.compile(r"^    "),
    re.compile(r"^[A-Z]\w*(Error|Exception)\b"),
    re.compile(r"^\t \[\[.*\]\]$"),
)


def is_noise(line: str) -> bool:
    """True for a line of :data:`NOISE`."""
    return any(pattern.search(line) for pattern in NOISE)


class NoiseDropper:
    """Line-by-line filter: drops :data:`NOISE` lines, and each :data:`TEARDOWN` and
    :data:`PY_FUNC_FAILURE` message with the continuation lines right after it; passes everything
    else (the same continuation lines after any other line included)."""

    def __init__(self):
        self.in_teardown = False
        self.in_py_func = False

    def keep(self, line: str) -> bool:
        if TEARDOWN.search(line):
            self.in_teardown = True
            return False
        if self.in_teardown and any(p.search(line) for p in TEARDOWN_CONTINUED):
            return False
        self.in_teardown = False
        if PY_FUNC_FAILURE.search(line):
            self.in_py_func = True
            return False
        if self.in_py_func and any(p.search(line.rstrip("\n")) for p in PY_FUNC_CONTINUED):
            return False
        self.in_py_func = False
        return not is_noise(line)


class _Filter:
    def __init__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self.reader = os.fdopen(read_end, "rb")
        self.exit_code: int | None = None  # end_with: the process ends in close
        self.thread = threading.Thread(target=self._pump, name="kerasdist-stderr", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        dropper = NoiseDropper()
        for raw in self.reader:
            if dropper.keep(raw.decode("utf-8", "replace")):
                os.write(self.saved, raw)

    def close(self) -> None:
        """Give fd 2 back once the filter passed on what it holds; with ``exit_code`` set
        (:func:`end_with`), end the process here."""
        if self.exit_code is not None:
            logging.shutdown()  # its own hook, registered before this one, would run after it
            for stream in (sys.stdout, sys.__stdout__, sys.__stderr__):  # a script's own too
                with contextlib.suppress(Exception):  # closed, or its reader gone: nothing kept
                    stream.flush()
        sys.stderr.flush()
        os.dup2(self.saved, 2)  # closes the pipe's last write end: the reader sees EOF
        self.thread.join(timeout=2.0)
        os.close(self.saved)
        if self.exit_code is not None:
            os._exit(self.exit_code)


_ACTIVE: _Filter | None = None


def enable_crash_traces() -> None:
    """Print every thread's Python stack when this process dies of a fatal signal (SIGSEGV,
    SIGFPE, SIGABRT, SIGBUS, SIGILL; :mod:`faulthandler`) to the real stderr: with the filter on,
    to a duplicate of the descriptor the filter writes to (its thread dies with the process, so
    the pipe would lose the trace). A crash inside TensorFlow then names the Python call it came
    from, in the task's log. Idempotent; nothing changes when the process does not crash."""
    import faulthandler

    if faulthandler.is_enabled():
        return
    fd = os.dup(_ACTIVE.saved) if _ACTIVE is not None else 2  # kept open: the handler's own
    faulthandler.enable(file=fd, all_threads=True)


def filter_native_stderr(verbose) -> bool:
    """Drop :data:`NOISE` lines from this process's stderr (file descriptor 2) until exit, unless
    ``verbose == 2`` or ``KERASDIST_RAW_STDERR`` is set. Idempotent.

    Returns:
        Whether the filter is active.
    """
    global _ACTIVE
    if _ACTIVE is not None:
        return True
    if verbose == 2 or os.environ.get("KERASDIST_RAW_STDERR"):
        return False
    try:
        _ACTIVE = _Filter()
    except OSError:  # no fd 2, or no pipes: leave stderr as it is
        return False
    atexit.register(_ACTIVE.close)
    return True


def end_with(code: int) -> None:
    """With the filter on, end this process with exit status ``code`` in the filter's ``atexit``
    hook, after every other hook, without TensorFlow's destructors (module docs). For the
    process's entry point only (a later ``sys.exit`` keeps ``code``)."""
    if _ACTIVE is not None:
        _ACTIVE.exit_code = code


def drain() -> None:
    """Pass on what the filter still holds and give file descriptor 2 back (waits up to 2 s for
    the filter's thread). For a process about to end with ``os._exit`` (:func:`kerasdist._exit.
    abandon`), which runs no ``atexit`` hook: without it, the failure just written to stderr can
    be lost in the pipe. Idempotent."""
    global _ACTIVE
    active, _ACTIVE = _ACTIVE, None
    if active is not None:
        atexit.unregister(active.close)
        active.close()

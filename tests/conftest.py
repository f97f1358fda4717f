"""Test-wide setup: quiet, few-thread TensorFlow; 2 logical CPUs; no leaked environment variables."""

from __future__ import annotations

import itertools
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LOGICAL_CPUS = 2


def pytest_configure(config):
    # Split the CPU before any test initialises TensorFlow, so MirroredStrategy tests get 2 replicas.
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(LOGICAL_CPUS)])


IN_PROCESS_CLUSTER_FIXTURES = {"inprocess_ps_cluster", "ps_strategy"}
ISOLATED_ENV = "KERASDIST_ISOLATED_TEST"
ISOLATED_REPORTS_ENV = "KERASDIST_ISOLATED_REPORTS"  # the child writes its test reports here
_GROUP = pytest.StashKey[str]()
_LIMIT = pytest.StashKey[float]()
_GROUP_RESULTS: dict = {}  # group -> {nodeid: [report dict per phase]}, or {"": error text}


def pytest_collection_modifyitems(session, config, items):
    """Mark the tests that connect this process to an in-process cluster to run in a process of
    their own: ``tf.config.experimental_connect_to_cluster`` cannot be undone and its servers can
    never be stopped (a MirroredStrategy step run afterwards in the same process hangs), so they
    must never share a process with other tests, whatever the order.

    They share it with the other such tests **of their module**: the in-process cluster fixtures
    are session-scoped by design (``kerasdist.testing``), so one process per module runs them
    together, as one ``pytest`` run of that file would, and each test's outcome is reported here
    on its own. legacy/ (TF1 clusters of its own, in child processes) is grouped the same way.
    A test marked ``isolated`` by hand (it needs to be the first TF code of its process) runs
    alone."""
    if os.environ.get(ISOLATED_ENV):
        return
    for item in items:
        if item.get_closest_marker("isolated") is not None:
            item.stash[_GROUP] = item.nodeid
        elif IN_PROCESS_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())) or \
                "tests/legacy/" in item.nodeid:  # legacy/ starts TF1 clusters of its own
            item.add_marker(pytest.mark.isolated)
            item.stash[_GROUP] = item.nodeid.split("::")[0]
        else:
            continue
        # Here the test only waits for its group's process, which applies the test's own
        # timeout; that wait is bounded by the group's summed timeouts (_run_group), so
        # pytest-timeout's timer must not cut it at the first test's limit.
        item.stash[_LIMIT] = _item_limit(item)
        item.add_marker(pytest.mark.timeout(0), append=False)


def pytest_runtest_logreport(report):
    """In an isolated child: append each phase's report to the file the parent reads."""
    path = os.environ.get(ISOLATED_REPORTS_ENV)
    if not path or not os.environ.get(ISOLATED_ENV):
        return
    import json

    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        longrepr = list(longrepr)
    elif longrepr is not None:
        longrepr = str(longrepr)
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
             "duration": report.duration, "longrepr": longrepr,
             "sections": [list(s) for s in report.sections]}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _item_limit(item) -> float:
    marker = item.get_closest_marker("timeout")
    return marker.args[0] if marker and marker.args else 300


def _run_group(item, group: str) -> dict:
    """Run every collected test of ``group`` in one fresh ``python -m pytest`` process (in a
    private network namespace where the OS allows one, so the TF servers it starts are
    unreachable from other machines); return {nodeid: [phase reports]}."""
    import json
    import subprocess
    import sys
    import tempfile

    from kerasdist.launch import isolation

    members = [i for i in item.session.items if i.stash.get(_GROUP, None) == group]
    limit = sum(i.stash[_LIMIT] for i in members) + 120
    with tempfile.TemporaryDirectory(prefix="kerasdist-isolated-") as tmp:
        reports = os.path.join(tmp, "reports.jsonl")
        argv = [sys.executable, "-m", "pytest", *[i.nodeid for i in members], "-q", "-p",
                "no:cacheprovider", "-o", "addopts="]
        if isolation.unavailable_reason() is None:  # its TF servers: unreachable from the network
            argv = isolation.isolated_argv(argv)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit,
                                  env={**os.environ, ISOLATED_ENV: "1",
                                       ISOLATED_REPORTS_ENV: reports},
                                  cwd=str(item.config.rootpath))
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            code, output = -1, f"isolated process timed out after {limit} s\n{err.stdout or ''}"
        results: dict = {}
        if os.path.exists(reports):
            with open(reports, encoding="utf-8") as fh:
                for line in fh:
                    entry = json.loads(line)
                    results.setdefault(entry["nodeid"], []).append(entry)
    results[""] = f"[isolated process for {group}, exit {code}]\n{output[-8000:]}"
    return results


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Run an ``isolated`` test's group in a fresh process the first time one of its tests comes
    up, then report each test's own outcome, phase by phase, from what that process wrote (its
    output is shown for a test that has no report of its own)."""
    if os.environ.get(ISOLATED_ENV) or item.get_closest_marker("isolated") is None:
        return None
    from _pytest.reports import TestReport

    group = item.stash.get(_GROUP, item.nodeid)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    if group not in _GROUP_RESULTS:
        _GROUP_RESULTS[group] = _run_group(item, group)
    results = _GROUP_RESULTS[group]
    keywords = {k: 1 for k in item.keywords}
    phases = list(results.get(item.nodeid, []))
    # pytest reports a teardown phase for every test it ran to the end; a test without one was cut
    # short (the child died or timed out in it) and fails here, whatever its earlier phases said.
    if not any(phase["when"] == "teardown" for phase in phases):
        ran = {phase["when"] for phase in phases}
        phases.append({"when": "call" if "call" not in ran else "teardown", "outcome": "failed",
                       "duration": 0.0, "sections": [],
                       "longrepr": "the isolated process ended before this test finished "
                                   f"(phases reported: {sorted(ran) or 'none'})\n{results['']}"})
    for phase in phases:
        longrepr = phase["longrepr"]
        if isinstance(longrepr, list):
            longrepr = tuple(longrepr)
        report = TestReport(item.nodeid, item.location, keywords, phase["outcome"], longrepr,
                            phase["when"], [tuple(s) for s in phase["sections"]],
                            duration=phase["duration"])
        item.ihook.pytest_runtest_logreport(report=report)
    # What pytest's own protocol does after a test: tear down the fixtures and collectors of
    # earlier tests that the next test does not share (else the next test's setup fails with
    # "previous item was not torn down properly" when it lies in another folder, as under xdist).
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.fixture(autouse=True)
def no_leaked_environment():
    """Fail any test that leaves environment variables changed (TF_CONFIG above all)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    changed -= {"PYTEST_CURRENT_TEST"}
    if changed:
        os.environ.clear()
        os.environ.update(before)
        pytest.fail(f"test leaked environment variables: {sorted(changed)}")


@pytest.fixture(autouse=True)
def default_sigint_for_children():
    """Every test starts with SIGINT at Python's default handler and unblocked, and the state is
    put back after it.

    A child process inherits an ignored or blocked SIGINT, and Python started with SIGINT ignored
    installs no KeyboardInterrupt handler: the Ctrl-C tests (tests/legacy/test_legacy.py's CLI
    test, tests/multiprocess/test_ps_faults.py's SIGINT test) then wait for a process that never
    sees the signal. Both passed alone and failed in the full suite (CI of 080cedf, 2026-11-25),
    so a test before them leaves SIGINT changed in this process; this fixture takes that state
    away from the tests after it (which test leaves it is not found yet)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Installed again every time: native code (gRPC, Ray) can change the OS-level disposition
    # behind Python's back, where signal.getsignal still shows the old handler.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)


_COLLECTIVE_KEY_BLOCK = 10_000
_KEY_BLOCKS = itertools.count(1)


@pytest.fixture(autouse=True)
def fresh_mirrored_collective_keys():
    """Give every test's MirroredStrategy objects collective group keys no earlier test used.

    Every ``tf.distribute.MirroredStrategy`` of a process numbers its CPU all-reduce groups from
    ``1 + MirroredStrategy._collective_key_base`` (0 unless changed) and its instances from the
    same start, and the process's collective executor remembers each (group, instance) it has
    seen. A test whose step stopped between the replicas' halves of an all-reduce (an error
    raised on purpose, a callback stopping training) leaves such an instance behind, and the next
    test's first all-reduce of another shape then fails with "Shape mismatch in the collective
    instance 100". Found in CI: tests/integration/test_keras_grad_accum.py after test_fit.py."""
    import tensorflow as tf

    cls = tf.distribute.MirroredStrategy
    before = cls._collective_key_base
    cls._collective_key_base = _COLLECTIVE_KEY_BLOCK * next(_KEY_BLOCKS)
    yield
    cls._collective_key_base = before


@pytest.fixture
def write_recipe(tmp_path):
    """Write a YAML recipe text into tmp_path and return its path."""

    def write(text: str, name: str = "recipe.yaml"):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write



NOBODY = 65534  # uid and gid of the unprivileged user the root-run tests act as


@pytest.fixture
def unprivileged():
    """Run a command as a user that cannot write everywhere. Returns a namespace:

    - ``argv``: the prefix that runs a command as that user. As root (CI), ``setpriv`` to uid/gid
      65534 ('nobody'), since root writes anywhere; skipped when setpriv is missing or that user
      cannot import kerasdist with this interpreter (a 0700 folder, such as mktemp -d's, on the
      venv's path stops it; .ci/run makes its venv folder 0755). Otherwise empty.
    - ``base``: a fresh 0755 folder that user can reach (under /tmp as root: pytest's tmp_path is
      0700), removed afterwards.
    - ``own(*paths)``: as root, give the paths and everything under them to that user."""
    import contextlib
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    as_root = os.geteuid() == 0
    argv = []
    if as_root:
        if not shutil.which("setpriv"):
            pytest.skip("root, and no setpriv to run as another user")
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        probe = subprocess.run([*argv, sys.executable, "-c", "import kerasdist.cli"], cwd="/",
                               capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            pytest.skip(f"root, and user {NOBODY} cannot run {sys.executable} with kerasdist: "
                        f"{probe.stderr.strip()[-300:]}")

    def own(*paths):
        for top in paths if as_root else ():
            for path in [top, *top.rglob("*")]:
                os.chown(path, NOBODY, NOBODY, follow_symlinks=False)

    base = Path(tempfile.mkdtemp(prefix="kerasdist-user-", dir="/tmp" if as_root else None))
    base.chmod(0o755)
    try:
        yield SimpleNamespace(argv=argv, base=base, own=own)
    finally:
        for path in [base, *base.rglob("*")]:
            with contextlib.suppress(OSError):
                os.chmod(path, 0o755)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_kerasdist_logger():
    """Each test starts with the ``kerasdist`` logger as a new process has it: no handler of
    kerasdist's own, no level, propagating (so ``caplog`` sees its lines). Without this, a CLI
    run in an earlier test of the same process (``kerasdist._log.configure``: its handler, its
    level, propagation off) decided what later tests could read, and with ``--dist loadfile``
    the files sharing a process vary from run to run."""
    import logging

    from kerasdist import _log

    logger = logging.getLogger("kerasdist")
    for handler in [h for h in logger.handlers if getattr(h, _log._HANDLER_MARK, False)]:
        logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


@pytest.fixture
def signal_in_a_weakref_callback():
    """``send(signum)``: this process gets ``signum`` while Python runs a weakref callback, where
    an exception a handler raises is printed as "Exception ignored" and dropped (as in
    SQLAlchemy's ``InstanceState`` clean-up): a stop that relies on raising is lost there."""
    import weakref

    class Dropped:
        pass

    def send(signum) -> None:
        def callback(_ref):
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # bytecodes: Python runs the handler here, in the callback
                pass

        thing = Dropped()
        ref = weakref.ref(thing, callback)  # noqa: F841 - kept alive until the callback ran
        del thing  # the callback runs now

    return send


"""``kerasdist conformance`` as a user runs it: the matrix page and its JSON from two strategies
started at once (the parallel path of :func:`kerasdist.conformance.driver.run_matrix`, which
tests/conformance drives through its own fixture), exit 0; bad names exit 2 before anything runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess


@pytest.mark.extended
@pytest.mark.timeout(400)
def test_two_strategies_at_once_write_the_matrix_and_exit_0(tmp_path):
    out = tmp_path / "matrix.md"
    done = subprocess.run([sys.executable, "-m", "kerasdist", "conformance", "--strategies",
                           "default,mirrored", "--cases", "sequential,batchnorm", "--out", str(out),
                           "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = json.loads(out.with_suffix(".json").read_text())["cells"]
    assert set(cells) == {"sequential", "batchnorm"}
    assert {s: cells["sequential"][s]["status"] for s in ("default", "mirrored")} == {
        "default": "pass", "mirrored": "pass"}
    assert set(cells["batchnorm"]) == {"default", "mirrored"}
    page = out.read_text()
    assert "| `sequential` | pass | pass |" in page
    assert "the columns run at the same time unless `--sequential`" in page
    # both columns ran: each strategy's own processes wrote its results
    for strategy in ("default", "mirrored"):
        assert list((tmp_path / "work" / "results" / strategy).glob("sequential.*.json"))


@pytest.mark.parametrize("flag, value, field", [("--strategies", "default,nope", "--strategies"),
                                                ("--cases", "no_such_case", "--cases")])
def test_unknown_names_exit_2_before_anything_runs(tmp_path, flag, value, field):
    done = subprocess.run([sys.executable, "-m", "kerasdist", "conformance", flag, value, "--out",
                           str(tmp_path / "m.md"), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert field in done.stderr and value in done.stderr
    assert not (tmp_path / "m.md").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("out, needle", [
    ("a_file/m.md", "is a file, not a folder"),
    ("a_dir", "it is a directory"),
    ("m.md", "it is a directory"),  # its .json beside it is a directory
])
def test_an_unusable_out_exits_2_before_anything_runs(tmp_path, out, needle):
    """Issue 33 (3): the whole matrix used to run first, then a raw traceback, exit 1."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "m.json").mkdir()
    done = subprocess.run([sys.executable, "-m", "kerasdist", "conformance", "--strategies",
                           "default", "--cases", "sequential", "--out", str(tmp_path / out),
                           "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--out" in done.stderr and needle in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_empty_cases_list_exits_2(tmp_path, value):
    """Issue 33 (3): ``--cases ""`` used to run every case."""
    done = subprocess.run([sys.executable, "-m", "kerasdist", "conformance", "--cases", value,
                           "--out", str(tmp_path / "m.md"), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--cases: empty" in done.stderr and f"Received: --cases={value!r}" in done.stderr
    assert not (tmp_path / "work").exists()


def _task_processes(marker: str) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _start_and_wait_for_the_strategy(tmp_path):
    """``kerasdist conformance`` with its temporary folder under ``tmp_path/tmp``, once its
    strategy process (conformance/task.py, planned under that folder) runs."""
    import time

    temp = tmp_path / "tmp"
    temp.mkdir()
    with open(tmp_path / "output.log", "wb") as sink:  # a file: nobody drains a pipe meanwhile
        command = subprocess.Popen([sys.executable, "-m", "kerasdist", "conformance",
                                    "--strategies", "default", "--cases", "sequential", "--out",
                                    str(tmp_path / "m.md")],
                                   env={**os.environ, "TMPDIR": str(temp),
                                        "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"},
                                   stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not _task_processes(str(temp)):
        if command.poll() is not None or time.monotonic() > deadline:
            command.kill()
            command.wait()
            pytest.fail("the strategy process never started:\n"
                        + (tmp_path / "output.log").read_text(errors="replace")[-3000:])
        time.sleep(0.5)
    return command, temp


@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_conformance_leaves_no_process_and_no_folder(tmp_path, sig):
    """Issue 33 (2): SIGTERM or Ctrl-C to the command used to leave its strategy process running
    (PPID 1) for minutes and its temporary folder behind. Now SIGTERM and SIGINT stop the
    strategy's processes and remove the folder; a SIGKILLed command (nothing of it can run) still
    takes its strategy processes with it (PR_SET_PDEATHSIG)."""
    import time

    import psutil

    command, temp = _start_and_wait_for_the_strategy(tmp_path)
    started = time.monotonic()
    command.send_signal(sig)
    command.wait(timeout=120)
    output = (tmp_path / "output.log").read_text(errors="replace")
    deadline = time.monotonic() + 30
    while _task_processes(str(temp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _task_processes(str(temp))
    for proc in left:  # never leave them running, whatever the verdict
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not left, f"still running {time.monotonic() - started:.0f} s after {sig.name}: " \
                     f"{[p.pid for p in left]}\n{output[-3000:]}"
    if sig is not signal.SIGKILL:
        assert command.returncode == 130, output[-3000:]
        assert not list(temp.iterdir()), "the temporary folder was left behind"

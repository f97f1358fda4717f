"""A clean first screen: TensorFlow's start-up noise is filtered from stderr, real errors are not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(180)

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795413196.941792   26685 cudart_stub.cc:31] Could not find cuda drivers on your "
    "machine, GPU will not be used.",
    "E0000 00:00:1795413200.005354   26685 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "[2026-11-23 11:28:05,692 W 26285 26285] network_util.cc:330: Failed to determine local IP via "
    "external connectivity to: 8.8.8.8:53, [2001:4860:4860::8888]:53, falling back to hostname "
    "resolution",
]
REAL = "E0000 00:00:1795413200.005354   26685 some_kernel.cc:12] a real native error"


def _native_writes(*args: str, env=None) -> str:
    code = textwrap.dedent(f"""
        import os, sys
        from kerasdist import _native_log
        _native_log.filter_native_stderr({args[0] if args else None!r})
        for line in {NOISE + [REAL]!r}:
            os.write(2, (line + "\\n").encode())
        print("python error line", file=sys.stderr)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env).stderr


def test_known_noise_is_dropped_and_everything_else_passes():
    err = _native_writes()
    assert err.splitlines() == [REAL, "python error line"]


def test_verbose_2_and_the_environment_switch_keep_raw_stderr():
    assert _native_writes(2).splitlines() == NOISE + [REAL, "python error line"]
    env = {**os.environ, "KERASDIST_RAW_STDERR": "1"}
    assert _native_writes(None, env=env).splitlines() == NOISE + [REAL, "python error line"]


LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
trainer: {{epochs: 1}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


def test_fit_first_screen_has_no_native_noise(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(LINEAR.format(run_dir=tmp_path / "run"))
    env = {k: v for k, v in os.environ.items() if k != "KERASDIST_RAW_STDERR"}
    done = subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe)], env=env,
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [line for line in done.stderr.splitlines() if any(
        line.startswith(p) for p in ("E0000", "I0000", "WARNING: All log messages"))], done.stderr
    assert "kerasdist run summary" in done.stdout


def test_a_stopped_parameter_server_clusters_teardown_flood_is_dropped_real_errors_kept():
    from kerasdist._native_log import NoiseDropper

    flood = [
        "E0000 00:00:1795596407.367828   23371 context.cc:911] Failed to remove function remotely "
        "due to failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:34133: "
        "Failed to connect to remote host: Connection refused",
        "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while "
        "calling /tensorflow.eager.EagerService/Enqueue:",
        ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect"}',
        "This could happen if the remote target has been disconnected from the client.",
    ]
    # a real error's own continuation lines follow its own first line, and are kept
    real = [REAL, "Additional GRPC error information from remote target /job:ps/replica:0/task:0 "
            "while calling /tensorflow.eager.EagerService/RunComponentFunction:"]
    dropper = NoiseDropper()
    kept = [line for line in flood * 3 + [REAL] + flood + real if dropper.keep(line)]
    assert kept == [REAL, *real]


@pytest.mark.parametrize("verbose", [None, 2])
def test_a_crash_prints_the_python_stack_through_the_filter(verbose):
    """A fatal signal in a kerasdist process (here SIGSEGV from a NULL read, as a crash inside
    TensorFlow would be) prints every thread's Python stack to the real stderr, the filter on or
    off: the filter's thread dies with the process, so a trace written into its pipe is lost."""
    code = textwrap.dedent(f"""
        import ctypes
        from kerasdist import _native_log
        _native_log.filter_native_stderr({verbose!r})
        _native_log.enable_crash_traces()

        def crashing_call():
            ctypes.string_at(0)

        crashing_call()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -11, done
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert "in crashing_call" in done.stderr, done.stderr


TEARDOWN_AT_EXIT = """
import atexit, os, sys
from kerasdist.cli import console

FLOOD = ("E0000 00:00:1795917422.087682   11779 context.cc:911] Failed to remove function remotely "
         "due to failed to connect to all addresses\\n"
         "This could happen if the remote target has been disconnected from the client.\\n")


class Coordinator:  # as TensorFlow's functions: released while the interpreter finalizes
    def __del__(self):
        os.write(2, FLOOD.encode() * 1000)  # 180 kB: more than a pipe holds


coordinator = Coordinator()
code = console(sys.argv[1:])
atexit.register(lambda: print("a hook of the run ran", flush=True))
sys.exit(code)
"""


@pytest.mark.parametrize("argv, code", [(["--version"], 0), (["validate", "/no/such.yaml"], 2)])
def test_what_tensorflow_writes_while_the_interpreter_ends_stays_off_the_console(argv, code):
    """The filter lasts until the process ends (kerasdist._native_log.end_with): objects released
    while the interpreter finalizes (a parameter-server coordinator's functions, after its servers
    left) write nothing to the console, after a success or a failure; the command's own lines,
    its exit code and the atexit hooks of the run are kept. With --verbose 2 everything shows."""
    env = {k: v for k, v in os.environ.items() if k != "KERASDIST_RAW_STDERR"}
    done = subprocess.run([sys.executable, "-c", TEARDOWN_AT_EXIT, *argv], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == code, done.stderr[-2000:]
    assert "context.cc" not in done.stderr and "remote target" not in done.stderr, done.stderr[-500:]
    assert "a hook of the run ran" in done.stdout
    assert ("kerasdist " in done.stdout) if code == 0 else ("/no/such.yaml" in done.stderr), done
    raw = subprocess.run([sys.executable, "-c", TEARDOWN_AT_EXIT, *argv, "--verbose", "2"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert raw.stderr.count("context.cc:911] Failed to remove function remotely") == 1000

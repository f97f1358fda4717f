"""``kerasdist launch --this-task`` of a parameter-server *script* watches the tasks it waits on,
as a recipe's tasks do on clusters kerasdist does not launch (:mod:`kerasdist.cluster.watch`,
issue 31): the chief exits 1 naming a ps that stays hung, instead of waiting for ever.

The "ps" and "worker" here are plain TCP listeners on loopback that accept nothing and never
answer (what the probe calls ``hung``: the kernel completes the handshake, no gRPC frame
follows), so no TensorFlow server is started; the chief's script only sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import portpicker
import pytest

SLEEPER = "import time\ntime.sleep(120)\nprint('the script ended by itself')\n"


@contextlib.contextmanager
def _silent_listeners(count: int):
    """``count`` loopback sockets that listen and never accept or answer."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", portpicker.pick_unused_port()))
            sock.listen(8)
            socks.append(sock)
        yield [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _launch(tmp_path, tf_config: dict, *flags: str, timeout: float = 90):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("KERASDIST_STATUS_FILE", None)
    return subprocess.run([sys.executable, "-m", "kerasdist", "launch", "--this-task", *flags,
                           str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(120)
def test_a_ps_script_chief_exits_1_naming_a_hung_ps_within_the_task_timeout(tmp_path):
    with _silent_listeners(2) as (ps, worker):
        config = {"cluster": {"chief": ["127.0.0.1:1"], "ps": [ps], "worker": [worker]},
                  "task": {"type": "chief", "index": 0}}
        started = time.monotonic()
        done = _launch(tmp_path, config, "--task-timeout-s", "3")
        took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "the script ended by itself" not in out
    assert f"lost task ps:0 (hung, {ps})" in out or f"lost task worker:0 (hung, {worker})" in out, \
        out[-3000:]
    assert "--task-timeout-s=3" in out, out[-3000:]
    # 3 s of silence, a probe period (1 s) and two 2-s probe timeouts, plus interpreter start
    assert took < 60, (took, out[-2000:])


def test_dry_run_says_what_a_chief_watches_and_none_turns_the_watch_off(tmp_path):
    config = {"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                          "worker": ["127.0.0.1:3", "127.0.0.1:4"]},
              "task": {"type": "chief", "index": 0}}
    done = _launch(tmp_path, config, "--dry-run", "--task-timeout-s", "30")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "watches ps:0, worker:0, worker:1 (lost after 30 s" in done.stdout, done.stdout
    off = _launch(tmp_path, config, "--dry-run", "--task-timeout-s", "none")
    assert off.returncode == 0 and "watches" not in off.stdout, off.stdout
    worker = dict(config, task={"type": "worker", "index": 1})
    served = _launch(tmp_path, worker, "--dry-run")
    assert served.returncode == 0 and "serve" in served.stdout, served.stdout
    assert "watches ps:0 (lost after 60 s" in served.stdout, served.stdout


@pytest.mark.parametrize("value", ["-1", "abc", "1e9"])
def test_a_bad_task_timeout_exits_2_naming_the_flag_and_the_value(tmp_path, value):
    config = {"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                          "worker": ["127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}}
    done = _launch(tmp_path, config, "--task-timeout-s", value)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--task-timeout-s" in done.stderr and repr(value) in done.stderr, done.stderr
    assert not (tmp_path / "kerasdist-logs").exists()

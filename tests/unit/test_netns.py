"""The namespace child forked from the command (:mod:`kerasdist.launch.forking.netns`, issue 42 item 8):
``unshare(2)`` from Python puts a forked process in a private network namespace as ``unshare
--net [--map-root-user]`` does, as root and as a user; where it cannot, the launcher starts as a
new process and nothing was started by the forked one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# Forks (the launcher is forked from a process that imported kerasdist), enters the namespace,
# brings lo up, and serves a connection on 127.0.0.1 there; prints what it saw.
PROBE = r"""
import json, os, socket, sys
from kerasdist.launch.isolation import loopback_up
from kerasdist.launch.forking.netns import unshare_network
from kerasdist.launch.processes import network_interfaces

before = os.readlink("/proc/self/ns/net")
read_fd, write_fd = os.pipe()
pid = os.fork()
if pid == 0:
    code = 1
    try:
        unshare_network()
        interfaces = network_interfaces()
        loopback_up()
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=5):
                pass
        seen = {"netns": os.readlink("/proc/self/ns/net"), "others": interfaces,
                "uid": os.getuid()}
        os.write(write_fd, json.dumps(seen).encode())
        code = 0
    finally:
        os._exit(code)
os.close(write_fd)
data = os.read(read_fd, 65536)
_, status = os.waitpid(pid, 0)
print(json.dumps({"before": before, "child": json.loads(data or b"null"),
                  "code": os.waitstatus_to_exitcode(status)}))
"""


def _probe(prefix: list[str]) -> dict:
    done = subprocess.run([*prefix, sys.executable, "-c", PROBE], cwd="/", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _unshare_binary_works(prefix: list[str]) -> bool:
    binary = shutil.which("unshare")
    if binary is None:
        return False
    flags = ["--net"] if not prefix and os.geteuid() == 0 else ["--net", "--map-root-user"]
    return subprocess.run([*prefix, binary, *flags, "true"], capture_output=True,
                          timeout=30).returncode == 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("who", ["this user", "an unprivileged user"])
def test_a_forked_process_enters_a_private_network_namespace(who, unprivileged):
    prefix = unprivileged.argv if who == "an unprivileged user" else []
    if who == "an unprivileged user" and os.geteuid() != 0:
        prefix = []  # already one
    if not _unshare_binary_works(prefix):
        pytest.skip(f"'unshare --net' does not work here for {who}: nothing to match")
    seen = _probe(prefix)
    assert seen["code"] == 0 and seen["child"], seen
    assert seen["child"]["netns"] != seen["before"]  # a namespace of its own ...
    assert seen["child"]["others"] == []  # ... holding no interface but lo (now up: it served)
    assert seen["child"]["uid"] == 0  # root inside (a user: mapped, as --map-root-user does)


@pytest.mark.timeout(120)
def test_a_launcher_that_cannot_enter_a_namespace_falls_back_to_a_started_one(monkeypatch):
    """The forked launcher reports that unshare(2) failed and exits before doing anything; the
    command then starts the launcher as a new process, as without the fork path."""
    from kerasdist.config.loader import load_recipe
    from kerasdist.errors import ClusterError
    from kerasdist.launch import forking, isolation
    from kerasdist.launch.forking import netns

    recipe = load_recipe(REPO / "recipes" / "linear_mwms.yaml")

    def refused():
        raise OSError(1, "unshare(CLONE_NEWNET): Operation not permitted")

    started = []
    report = {"ok": False, "error": "ClusterError", "module": "kerasdist.errors",
              "message": "the stand-in ran"}

    def stand_in(recipe, write_fd, *, overwrite, verbose, isolate):
        started.append(isolate)
        child = subprocess.Popen([sys.executable, "-c", (
            f"import os; os.write({write_fd}, {json.dumps(report).encode()!r})")],
            pass_fds=(write_fd,))
        return child, None

    monkeypatch.setattr(netns, "unshare_network", refused)
    monkeypatch.setattr(isolation, "_popen_launcher", stand_in)
    monkeypatch.setitem(forking._STATE, "warm", True)
    monkeypatch.setitem(forking._STATE, "spent", False)
    with pytest.raises(ClusterError) as raised:
        isolation.run_isolated(recipe, overwrite=False, verbose=None)
    assert not isinstance(raised.value, netns.NotIsolated)
    assert "the stand-in ran" in str(raised.value)  # the started launcher's end is the run's
    assert started == [True]  # started once, isolated
    assert forking._STATE["spent"]  # and nothing more is forked from this process

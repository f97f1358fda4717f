"""Naming the lost peer: TF error messages and the HTTP/2 liveness probe of gRPC servers."""

from __future__ import annotations

import socket
import threading

import portpicker

from kerasdist.cluster.probe import EMPTY_SETTINGS_FRAME, probe, unresponsive_peers
from kerasdist.cluster.spec import local_cluster
from kerasdist.strategies.multi_worker import lost_tasks


def _server(*, answer: bool):
    """A listening socket that sends an HTTP/2 SETTINGS frame on connect (alive), or one that never
    accepts (hung: like a SIGSTOPped process, only the kernel completes the handshake)."""
    sock = socket.socket()
    sock.bind(("localhost", 0))
    sock.listen(4)

    def serve():
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.sendall(EMPTY_SETTINGS_FRAME)
        conn.recv(1024)
        conn.close()

    if answer:
        threading.Thread(target=serve, daemon=True).start()
    return sock, f"localhost:{sock.getsockname()[1]}"


def test_probe_tells_alive_hung_and_dead():
    alive, alive_addr = _server(answer=True)
    hung, hung_addr = _server(answer=False)
    try:
        assert probe(alive_addr) == "alive"
        assert probe(hung_addr, timeout_s=0.5) == "hung"
        assert probe(f"localhost:{portpicker.pick_unused_port()}") == "dead"
    finally:
        alive.close()
        hung.close()


def test_unresponsive_peers_skips_this_task():
    spec = local_cluster(workers=3)  # nothing listens on these ports
    assert unresponsive_peers(spec.for_task("worker", 1)) == {"worker:0": "dead", "worker:2": "dead"}


def test_lost_tasks_from_tf_messages():
    me = local_cluster(workers=2)
    killed = ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error "
              "information from remote target /job:worker/replica:0/task:1 while calling RecvBuf "
              "[[{{node CollectiveReduceV2}}]] on /job:worker/replica:0/task:0/device:CPU:0")
    hung = ("Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped "
            "sending heartbeats):\n/job:worker/replica:0/task:1")
    assert lost_tasks(killed, me.task_name) == ["worker:1"]
    assert lost_tasks(hung, me.task_name) == ["worker:1"]
    assert lost_tasks("Deadline Exceeded", me.task_name) == []


def test_bare_collective_timeout_is_attributed_by_the_probe():
    import tensorflow as tf

    from kerasdist.strategies.multi_worker import peer_error

    me = local_cluster(workers=2)  # worker:1's port: nobody listens
    err = tf.errors.DeadlineExceededError(None, None, "Graph execution error:\nDeadline Exceeded")
    message = str(peer_error(err, me, 40, 10.0))
    assert message.startswith(f"task worker:0: lost task worker:1 (dead, {me.cluster['worker'][1]}) "
                              "during training")
    assert "DeadlineExceededError" in message and "Received: Deadline Exceeded" in message


def test_a_peer_that_does_not_answer_the_handshake_is_unreachable(monkeypatch):
    """No TCP handshake within the timeout (a partition drops packets silently) or "no route to
    host": 'unreachable', told apart from a refused port ('dead') and a silent server ('hung');
    tests/multiprocess/test_hosts.py shows it on a real partition."""
    import errno

    def timing_out(address, timeout=None):
        raise socket.timeout("timed out")

    def no_route(address, timeout=None):
        raise OSError(errno.EHOSTUNREACH, "No route to host")

    monkeypatch.setattr(socket, "create_connection", timing_out)
    assert probe("10.77.1.3:4000", timeout_s=0.1) == "unreachable"
    monkeypatch.setattr(socket, "create_connection", no_route)
    assert probe("10.77.1.3:4000", timeout_s=0.1) == "unreachable"


def test_the_message_names_each_lost_task_with_its_state_and_address(monkeypatch):
    import tensorflow as tf

    from kerasdist.cluster import probe as probe_module
    from kerasdist.cluster.spec import parse_tf_config
    from kerasdist.strategies.multi_worker import peer_error

    me = parse_tf_config('{"cluster": {"worker": ["10.77.1.1:4000", "10.77.1.2:4001", '
                         '"10.77.1.3:4002"]}, "task": {"type": "worker", "index": 1}}')
    states = {"10.77.1.1:4000": "alive", "10.77.1.3:4002": "unreachable"}
    monkeypatch.setattr(probe_module, "probe", lambda address, timeout_s: states[address])
    # TF's chained message names worker:0 (alive, it relayed the error) and worker:2
    err = tf.errors.UnavailableError(None, None, (
        "Collective ops is aborted by: Error reported from /job:worker/task:0: The following "
        "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:2"))
    failure = peer_error(err, me, 10, 20.0)
    assert str(failure).startswith("task worker:1: lost task worker:2 (unreachable, "
                                   "10.77.1.3:4002) during training"), str(failure)
    assert failure.lost_tasks == ["worker:2"]

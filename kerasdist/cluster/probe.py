"""Which peer is gone? A liveness probe of the other tasks' TensorFlow gRPC servers.

When a collective times out (``DeadlineExceededError``) TF's message does not always name the peer
that stopped answering. A task's gRPC server is an HTTP/2 server, which sends its SETTINGS frame as
soon as a client connects (RFC 9113, section 3.4). So:

* connection refused or reset: the task is **dead** (its host answers, its port does not);
* no TCP handshake within the probe timeout, or "no route to host": the task is **unreachable**
  (its host is down or cut off by the network: a partition drops packets without any answer);
* connected, but no SETTINGS frame within the probe timeout: the task is **hung** (e.g. stopped
  with SIGSTOP, or stuck with the GIL held): the kernel still completes the TCP handshake for it;
* a SETTINGS frame arrives: the task is **alive**.

Standard library only; one short connection per peer.
"""

from __future__ import annotations

import errno
import socket

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # length 0, type SETTINGS, stream 0
SETTINGS_TYPE = 0x04


UNREACHABLE_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN,
                                errno.ETIMEDOUT})


def _connect(host: str, port: int, timeout_s: float) -> socket.socket | str:
    """A connected socket, or ``'unreachable'`` / ``'dead'``."""
    try:
        return socket.create_connection((host, port), timeout=timeout_s)
    except socket.timeout:
        return "unreachable"
    except OSError as err:
        return "unreachable" if err.errno in UNREACHABLE_ERRNOS else "dead"


def probe(address: str, *, timeout_s: float = 2.0) -> str:
    """``'alive'``, ``'hung'``, ``'unreachable'`` or ``'dead'`` for the gRPC server at
    ``host:port`` (see the module docs); at most about ``2 * timeout_s`` seconds."""
    host, _, port = address.rpartition(":")
    connected = _connect(host, int(port), timeout_s)
    if isinstance(connected, str):
        return connected
    try:
        with connected as sock:
            sock.settimeout(timeout_s)
            sock.sendall(HTTP2_PREFACE + EMPTY_SETTINGS_FRAME)
            header = b""
            while len(header) < 9:
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    return "dead"
                header += chunk
    except socket.timeout:
        return "hung"
    except OSError:
        return "dead"
    return "alive" if header[3] == SETTINGS_TYPE else "hung"


def unresponsive_peers(tf_config, *, timeout_s: float = 2.0) -> dict[str, str]:
    """``{task name: 'hung' | 'unreachable' | 'dead'}`` for every other task of the cluster that
    is not alive."""
    result = {}
    for job, addresses in tf_config.cluster.items():
        for index, address in enumerate(addresses):
            name = f"{job}:{index}"
            if name == tf_config.task_name:
                continue
            state = probe(address, timeout_s=timeout_s)
            if state != "alive":
                result[name] = state
    return result

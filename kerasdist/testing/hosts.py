"""Simulated hosts for tests and benchmarks: Linux network namespaces joined by a bridge.

Each simulated host is a network namespace with its own IPv4 address, its own loopback (up, so a
TensorFlow server can bind ``localhost`` too) and one veth link to a bridge (the "switch"). The
bridge lives in a namespace of its own, so nothing is added to the machine's real network: the
root namespace gets no interface, route or address, and a host namespace has no route other than
its own subnet, so the only reachable addresses are those of the hosts of the set::

    from kerasdist.testing.hosts import HostSet

    with HostSet(3, rate_mbit=100) as hosts:          # needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
        server = hosts.run(1, ["python", "-m", "http.server", "8000", "--bind", hosts.address(1)])
        client = hosts.run(0, ["curl", f"http://{hosts.address(1)}:8000/"])
        hosts.link_down(1)                            # a partition: packets dropped, no reset
        hosts.link_up(1)
    # here every namespace, link and process of the set is gone, also when the body raised

A bandwidth cap (``rate_mbit``) is a ``tbf`` (or ``htb``) qdisc on both ends of a host's link; a
partition (:meth:`HostSet.link_down`) is the host's bridge port in the STP ``disabled`` state.
Names are ``prefix`` plus a random suffix, so sets running in parallel do not collide; a set
removes only what it created. ``docs/hosts.md`` says how and why, with the measured figures.

Errors: :class:`HostSimulatorError` (a ``RuntimeError``) when an ``ip``, ``tc`` or ``bridge``
command fails (its stderr in the message), when not root, or for an unknown host index;
``ValueError`` for bad arguments.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["HostSet", "HostSimulatorError", "leftovers", "with_hosts_file"]

PREFIX = "kd"  # the default start of every namespace and interface name of a set
DEFAULT_PROCESS_TIMEOUT_S = 600.0
_CMD_TIMEOUT_S = 30.0


def with_hosts_file(hosts_file: str | os.PathLike, argv: Sequence[str]) -> list[str]:
    """``argv`` run with ``hosts_file`` as its ``/etc/hosts`` (and its children's): a private
    mount namespace (``unshare --mount``, propagation private) bind-mounts it, so names the test
    chose (a Slurm node's, a JobSet pod's DNS name) resolve to simulated hosts' addresses without
    touching the machine's own file. Needs root."""
    inner = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner,
            str(hosts_file), *argv]


class HostSimulatorError(RuntimeError):
    """A command of the simulator failed, or the simulator cannot run here."""


def _sh(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ``ip``/``tc``/``bridge`` command; raise :class:`HostSimulatorError` on failure."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HostSimulatorError(f"{' '.join(argv)}: {err}") from err
    if check and done.returncode != 0:
        raise HostSimulatorError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def leftovers(suffix: str) -> list[str]:
    """What of the set with ``suffix`` still exists: namespace names (``ip netns list``), links of
    the root namespace (``ip link``) and live processes in those namespaces. Empty after a
    :class:`HostSet` has closed; tests use it to prove the cleanup."""
    found = []
    namespaces = _sh(["ip", "netns", "list"]).stdout.split()
    for name in namespaces:
        if suffix in name:
            found.append(f"netns {name}")
            pids = _sh(["ip", "netns", "pids", name], check=False).stdout.split()
            found += [f"process {pid} in {name}" for pid in pids]
    for line in _sh(["ip", "-o", "link"]).stdout.splitlines():
        if suffix in line:
            found.append(f"link {line.split(':')[1].strip()}")
    return found


class HostSet:
    """``num_hosts`` simulated hosts on one bridge; use as a context manager (or call
    :meth:`close` yourself).

    Args:
        num_hosts: how many hosts (1 to 250). Host ``i`` (0-based) gets address ``.i+1`` of the
            subnet.
        rate_mbit: bandwidth cap of every host's link in Mbit/s (10**6 bit/s), each direction;
            ``None`` (default) for no cap (veth speed: several Gbit/s, CPU-bound). A sequence
            gives one cap per host (``None`` entries uncapped).
        subnet: the private IPv4 /24 of the set; default ``10.77.<k>.0/24`` with a random ``k``.
        shaper: ``"tbf"`` (default) or ``"htb"``: the qdisc that enforces ``rate_mbit``.
        burst_bytes: the shaper's bucket (bytes); default ``max(16 KiB, 4 ms at the rate)``.
        log_dir: where :meth:`run` writes each process's output; default a new temporary
            directory (kept after :meth:`close`, so a failed test can show the logs).
        prefix: how every namespace and interface name of the set begins: 2 to 5 lowercase
            letters or digits starting with a letter; default ``"kd"``.

    Raises:
        HostSimulatorError: not root, or a network command failed (whatever had been created is
            removed before the error propagates from ``__enter__``).
        ValueError: ``num_hosts`` out of range, a bad ``subnet``, ``shaper``, ``rate_mbit`` or
            ``prefix``.
    """

    def __init__(self, num_hosts: int, *, rate_mbit: float | Sequence[float | None] | None = None,
                 subnet: str | None = None, shaper: str = "tbf", burst_bytes: int | None = None,
                 log_dir: str | os.PathLike | None = None, prefix: str = PREFIX):
        if not 1 <= num_hosts <= 250:
            raise ValueError(f"num_hosts must be within 1..250. Received: {num_hosts}")
        if shaper not in ("tbf", "htb"):
            raise ValueError(f"shaper must be 'tbf' or 'htb'. Received: {shaper!r}")
        rates = list(rate_mbit) if isinstance(rate_mbit, (list, tuple)) else [rate_mbit] * num_hosts
        if len(rates) != num_hosts or any(r is not None and r <= 0 for r in rates):
            raise ValueError(f"rate_mbit must be None, a positive number or {num_hosts} of them. "
                             f"Received: {rate_mbit!r}")
        if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9]{1,4}", prefix):
            raise ValueError("prefix must be 2 to 5 lowercase letters or digits, starting with a "
                             f"letter (interface names are at most 15 characters). Received: "
                             f"{prefix!r}")
        network = ipaddress.ip_network(subnet or f"10.77.{secrets.randbelow(256)}.0/24")
        if network.version != 4 or network.prefixlen != 24 or not network.is_private:
            raise ValueError(f"subnet must be a private IPv4 /24. Received: {subnet!r}")
        self.num_hosts = num_hosts
        self.rates = rates
        self.network = network
        self.shaper = shaper
        self.burst_bytes = burst_bytes
        self.prefix = prefix
        self.suffix = secrets.token_hex(3)
        self.switch_ns = f"{prefix}{self.suffix}sw"
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"hosts-{self.suffix}-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._processes: dict[int, list[subprocess.Popen]] = {i: [] for i in range(num_hosts)}
        self._created: list[str] = []  # namespaces, in creation order
        self._count = 0

    # -- names -------------------------------------------------------------------------------
    def namespace(self, host: int) -> str:
        """The network namespace name of ``host`` (``ip netns exec <name> ...`` runs there)."""
        self._check(host)
        return f"{self.prefix}{self.suffix}h{host}"

    def address(self, host: int) -> str:
        """The IPv4 address of ``host`` (a string, e.g. ``"10.77.5.1"``)."""
        self._check(host)
        return str(self.network.network_address + host + 1)

    def host_if(self, host: int) -> str:
        """The interface name of ``host``'s link inside its namespace."""
        self._check(host)
        return f"{self.prefix}{self.suffix}v{host}"

    def switch_if(self, host: int) -> str:
        """The bridge port of ``host``'s link, in the switch namespace."""
        self._check(host)
        return f"{self.prefix}{self.suffix}p{host}"

    def mac(self, host: int) -> str:
        self._check(host)
        return "02:77:{}:{}:{}:{:02x}".format(self.suffix[0:2], self.suffix[2:4], self.suffix[4:6], host)

    def _check(self, host: int) -> None:
        if not isinstance(host, int) or not 0 <= host < self.num_hosts:
            raise HostSimulatorError(f"no host {host!r}: hosts are 0..{self.num_hosts - 1}")

    # -- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> HostSet:
        if os.geteuid() != 0:
            raise HostSimulatorError("simulated hosts need root (network namespaces, veth, tc)")
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        sw = self.switch_ns
        _sh(["ip", "netns", "add", sw])
        self._created.append(sw)
        _sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0"])
        _sh(["ip", "-n", sw, "link", "set", "br0", "up"])
        for i in range(self.num_hosts):
            ns, veth, port = self.namespace(i), self.host_if(i), self.switch_if(i)
            _sh(["ip", "netns", "add", ns])
            self._created.append(ns)
            # Created inside the switch namespace and the host end moved out: no interface of
            # the set ever exists in the root namespace, not even for a moment.
            _sh(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", veth,
                 "address", self.mac(i)])
            _sh(["ip", "-n", sw, "link", "set", veth, "netns", ns])
            _sh(["ip", "-n", sw, "link", "set", port, "master", "br0"])
            _sh(["ip", "-n", sw, "link", "set", port, "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            _sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", veth])
            _sh(["ip", "-n", ns, "link", "set", veth, "up"])
            if self.rates[i] is not None:
                self._shape(ns, veth, self.rates[i])
                self._shape(sw, port, self.rates[i])
        for i in range(self.num_hosts):
            for j in range(self.num_hosts):
                if i != j:
                    _sh(["ip", "-n", self.namespace(i), "neigh", "replace", self.address(j),
                         "lladdr", self.mac(j), "dev", self.host_if(i), "nud", "permanent"])

    def _shape(self, ns: str, dev: str, rate_mbit: float) -> None:
        rate_bit = int(rate_mbit * 1e6)
        burst = self.burst_bytes or max(16 * 1024, rate_bit // 8 // 250)
        if self.shaper == "tbf":
            _sh(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                 f"{rate_bit}bit", "burst", str(burst), "latency", "100ms"])
        else:
            _sh(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb",
                 "default", "1"])
            _sh(["tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1",
                 "htb", "rate", f"{rate_bit}bit", "ceil", f"{rate_bit}bit", "burst", str(burst)])

    def close(self) -> None:
        """Kill every process of every host (SIGKILL, waited for), then delete the namespaces
        (which deletes their links). Idempotent; never raises for what is already gone."""
        for i in range(self.num_hosts):
            self.kill(i)
        for ns in reversed(self._created):
            _sh(["ip", "netns", "del", ns], check=False)
        self._created.clear()

    # -- processes ---------------------------------------------------------------------------
    def run(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
            timeout_s: float = DEFAULT_PROCESS_TIMEOUT_S, cwd: str | os.PathLike | None = None,
            capture: bool = False) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (``ip netns exec``); return its ``Popen``.

        Args:
            env: variables set on top of this process's environment (``None``: unchanged).
            timeout_s: the process is sent SIGKILL after this many seconds (coreutils
                ``timeout``); default 600.
            cwd: its working directory.
            capture: ``True`` gives the output as ``Popen.stdout`` (a text pipe: read it, or it
                can fill and block the process); ``False`` (default) writes stdout and stderr to
                a file of ``log_dir``, whose path is the ``log_path`` attribute of the ``Popen``
                (read it with :meth:`output`).

        The process starts a session of its own (its process group is what :meth:`kill` ends).
        """
        ns = self.namespace(host)
        if ns not in self._created:
            raise HostSimulatorError(f"host {host} does not exist (HostSet not entered, or closed)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0. Received: {timeout_s}")
        self._count += 1
        full = ["ip", "netns", "exec", ns, "timeout", "-s", "KILL", f"{timeout_s:g}", *argv]
        environ = dict(os.environ, **(env or {}))
        log_path = None
        if capture:
            out = subprocess.PIPE
        else:
            log_path = self.log_dir / f"h{host}-{self._count}.log"
            out = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        try:
            proc = subprocess.Popen(full, env=environ, cwd=cwd, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
        finally:
            if not capture:
                out.close()
        proc.log_path = log_path  # type: ignore[attr-defined]
        self._processes[host].append(proc)
        return proc

    def enter_argv(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run in ``host``'s network namespace with ``nsenter``: unlike :meth:`run`
        (``ip netns exec``) no mount namespace, no kill timeout and no tracking; for daemons
        whose owner stops them (:class:`kerasdist.testing.slurm.SlurmCluster`)."""
        self._check(host)
        return ["nsenter", f"--net=/var/run/netns/{self.namespace(host)}", *argv]

    @staticmethod
    def output(proc: subprocess.Popen) -> str:
        """The output so far of a process started by :meth:`run` without ``capture``."""
        path = getattr(proc, "log_path", None)
        return Path(path).read_text(encoding="utf-8", errors="replace") if path else ""

    def pids(self, host: int) -> list[int]:
        """Process ids of every process running in ``host``'s namespace (``ip netns pids``)."""
        ns = self.namespace(host)
        if ns not in self._created:
            return []
        return [int(p) for p in _sh(["ip", "netns", "pids", ns], check=False).stdout.split()]

    def kill(self, host: int, *, wait_s: float = 10.0) -> None:
        """SIGKILL every process of ``host``: the process groups :meth:`run` started and any
        other process in its namespace; wait up to ``wait_s`` seconds for them to be gone."""
        for proc in self._processes[host]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        for proc in self._processes[host]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.stdout is not None:
                proc.stdout.close()
        while self.pids(host) and time.monotonic() < deadline:
            time.sleep(0.05)

    # -- faults ------------------------------------------------------------------------------
    def link_down(self, host: int) -> None:
        """Partition ``host``: its bridge port drops every frame both ways (STP state disabled).
        No reset, no ICMP error, no carrier change on the host: its peers' packets vanish, so
        connects time out and open connections hang until their own timeouts."""
        _sh(["bridge", "-n", self.switch_ns, "link", "set", "dev", self.switch_if(host), "state", "0"])

    def link_up(self, host: int) -> None:
        """End the partition of ``host`` (its bridge port forwards again, STP state 3)."""
        _sh(["bridge", "-n", self.switch_ns, "link", "set", "dev", self.switch_if(host), "state", "3"])

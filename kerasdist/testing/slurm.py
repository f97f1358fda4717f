"""A real Slurm cluster for tests: munge, ``slurmctld`` and one ``slurmd`` per node, on this machine.

Debian's ``slurm-wlm`` and ``munge`` packages (``apt-get install -y slurm-wlm munge``) start a
working Slurm in seconds; this module writes everything they need into a directory of its own
(``slurm.conf`` with free ports, a fresh munge key, state, spool, pid and log files), so nothing
of the machine's own Slurm or munge configuration is read or changed::

    from kerasdist.testing.slurm import SlurmCluster

    with SlurmCluster(num_nodes=3) as slurm:         # needs root
        job = slurm.sbatch(script_path)               # submitted as written
        info = slurm.wait(job, timeout_s=600)         # {'JobState': 'COMPLETED', ...}
    # here every daemon, job and namespace the cluster started is gone

Nodes: with network namespaces available (root, ``ip netns``), every node is a simulated host of
:class:`kerasdist.testing.hosts.HostSet` (``slurmctld`` on node 0) whose ``slurmd`` has a private
``/etc/hosts`` naming every node, so the node names in ``SLURM_STEP_NODELIST`` resolve; without
namespaces one node runs on loopback, named as this machine. The ``slurm.conf`` settings (checked
on Slurm 22.05, Debian 12) need no cgroups and let a node declare more CPUs than the machine has.
Every daemon, and so every job, runs under ``nice -n 19``; :meth:`close` cancels every job and
ends every process of the cluster.

Errors: :class:`SlurmUnavailable` (a ``RuntimeError``) says why no cluster can start here
(a missing program, not root); tests skip with its message (:func:`unavailable_reason`).
:class:`SlurmError` when a daemon does not come up in time or a command fails (logs included).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

__all__ = ["PROGRAMS", "SlurmCluster", "SlurmError", "SlurmUnavailable", "unavailable_reason"]

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo")
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
_CMD_TIMEOUT_S = 30.0


class SlurmUnavailable(RuntimeError):
    """No Slurm cluster can start on this machine (the message says why)."""


class SlurmError(RuntimeError):
    """A Slurm daemon did not come up, or a Slurm command failed."""


def unavailable_reason() -> str | None:
    """Why :class:`SlurmCluster` cannot start here, or None: the programs of Debian's
    ``slurm-wlm`` and ``munge`` packages missing from ``PATH``, or not root (``slurmd`` starts
    the jobs' processes as their users)."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} not on PATH; on Debian: "
                "apt-get install -y slurm-wlm munge)")
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd starts the jobs' processes)"
    return None


def _free_port() -> int:
    import portpicker

    return portpicker.pick_unused_port()


class SlurmCluster:
    """A Slurm cluster of ``num_nodes`` nodes on this machine; a context manager.

    Args:
        num_nodes: nodes (1 to 16); more than one needs network namespaces (simulated hosts).
        cpus_per_node: CPUs each node declares (Slurm's ``CPUs``; one task each by default), 1
            to 64; default 4. Not checked against the machine (``config_overrides``).
        work_dir: where the configuration, state and logs go; default a new temporary directory
            (kept after :meth:`close`, so a failed test can show the logs).
        namespaces: simulated hosts (True), loopback (False, one node only) or whatever the
            machine allows (None, default).
        ready_timeout_s: seconds to wait for every node to be ``idle``; default 90.

    Raises:
        SlurmUnavailable: from ``__enter__``, when the programs are missing or not root.
        SlurmError: a daemon did not come up within ``ready_timeout_s`` (its log in the message).
        ValueError: bad arguments.
    """

    def __init__(self, num_nodes: int = 1, *, cpus_per_node: int = 4,
                 work_dir: str | os.PathLike | None = None, namespaces: bool | None = None,
                 ready_timeout_s: float = 90.0):
        if not 1 <= num_nodes <= 16:
            raise ValueError(f"num_nodes must be within 1..16. Received: {num_nodes}")
        if not 1 <= cpus_per_node <= 64:
            raise ValueError(f"cpus_per_node must be within 1..64. Received: {cpus_per_node}")
        if namespaces is False and num_nodes > 1:
            raise ValueError(f"more than one node needs namespaces. Received: num_nodes={num_nodes}, "
                             "namespaces=False")
        self.num_nodes = num_nodes
        self.cpus_per_node = cpus_per_node
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kd-slurm-"))
        self.namespaces = namespaces
        self.ready_timeout_s = ready_timeout_s
        self.conf = self.work_dir / "slurm.conf"
        # Unix socket paths are at most 108 bytes: the munge socket and slurmd's spool (its steps'
        # sockets) live in a short directory of their own, removed by close()
        self.sockets = Path(tempfile.mkdtemp(prefix="kdsl-", dir="/tmp"))
        self.hosts = None  # a HostSet in namespace mode
        self._daemons: list[subprocess.Popen] = []
        self.node_names: list[str] = []

    # -- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        reason = unavailable_reason()
        if reason:
            raise SlurmUnavailable(reason)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _use_namespaces(self) -> bool:
        if self.namespaces is not None:
            return self.namespaces
        from kerasdist.launch import isolation

        return self.num_nodes > 1 or (isolation.unavailable_reason() is None
                                      and shutil.which("nsenter") is not None)

    def _start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work_dir, 0o755)  # munged refuses a key or socket in a writable-by-all dir
        if self._use_namespaces():
            from kerasdist.testing.hosts import HostSet

            self.hosts = HostSet(self.num_nodes, prefix="kdsl", log_dir=self.work_dir / "host-logs")
            self.hosts.__enter__()
            suffix = self.hosts.suffix
            self.node_names = [f"kd{suffix}n{i}" for i in range(self.num_nodes)]
            addresses = [self.hosts.address(i) for i in range(self.num_nodes)]
        else:
            self.node_names = [socket.gethostname()]
            addresses = ["127.0.0.1"]
        self._start_munge()
        self._write_conf(addresses)
        self._daemons.append(self._spawn(0, ["slurmctld", "-D", "-i"], "slurmctld.out"))
        for i, name in enumerate(self.node_names):
            (self.sockets / name).mkdir(parents=True, exist_ok=True)
            self._daemons.append(self._spawn(i, ["slurmd", "-D", "-N", name], f"slurmd-{name}.out",
                                             hosts_file=True))
        self._wait_ready()

    def _start_munge(self) -> None:
        key = self.work_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        argv = ["nice", "-n", "19", "munged", "--foreground", "--force", f"--key-file={key}",
                f"--socket={self.munge_socket}", f"--pid-file={self.work_dir / 'munged.pid'}",
                f"--log-file={self.work_dir / 'munged.log'}",
                f"--seed-file={self.work_dir / 'munged.seed'}"]
        with open(self.work_dir / "munged.out", "w", encoding="utf-8") as out:
            self._daemons.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        deadline = time.monotonic() + 20
        while not Path(self.munge_socket).exists():
            if self._daemons[-1].poll() is not None or time.monotonic() > deadline:
                raise SlurmError(f"munged did not start: {self._tail('munged.out')}")
            time.sleep(0.1)

    @property
    def munge_socket(self) -> str:
        return str(self.sockets / "munge.sock")

    def _write_conf(self, addresses: Sequence[str]) -> None:
        d = self.work_dir
        (d / "state").mkdir(exist_ok=True)
        nodes = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={self.cpus_per_node} State=UNKNOWN"
                          for name, addr in zip(self.node_names, addresses, strict=True))
        text = f"""# written by kerasdist.testing.slurm for a test cluster
ClusterName=kdtest
SlurmctldHost={socket.gethostname()}({addresses[0]})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={self.sockets}/%n
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd'}-%n.pid
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd'}-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
MinJobAge=3600
KillWait=30
{nodes}
PartitionName=kdtest Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        self.conf.write_text(text, encoding="utf-8")
        if self.hosts is not None:
            lines = ["127.0.0.1 localhost"] + [f"{addr} {name}" for name, addr
                                                in zip(self.node_names, addresses, strict=True)]
            (d / "etc-hosts").write_text("\n".join(lines) + "\n", encoding="utf-8")

    @property
    def env(self) -> dict[str, str]:
        """The variables a Slurm client command needs to talk to this cluster (``SLURM_CONF``)."""
        return {"SLURM_CONF": str(self.conf)}

    def _wrap(self, node: int, argv: Sequence[str], *, hosts_file: bool = False) -> list[str]:
        if self.hosts is None:
            return list(argv)
        if hosts_file:  # a private /etc/hosts naming the nodes, for this process and its children
            from kerasdist.testing.hosts import with_hosts_file

            argv = with_hosts_file(self.work_dir / "etc-hosts", argv)
        return self.hosts.enter_argv(node, argv)

    def _spawn(self, node: int, argv: Sequence[str], log: str, *,
               hosts_file: bool = False) -> subprocess.Popen:
        full = self._wrap(node, ["nice", "-n", "19", *argv], hosts_file=hosts_file)
        with open(self.work_dir / log, "w", encoding="utf-8") as out:
            return subprocess.Popen(full, env={**os.environ, **self.env}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        want = f"idle {self.num_nodes}"
        seen = ""
        while time.monotonic() < deadline:
            for proc in self._daemons:
                if proc.poll() is not None:
                    raise SlurmError(f"a Slurm daemon exited ({proc.args[-4:]}, code "
                                     f"{proc.returncode}):\n{self.logs()}")
            done = self.command(["sinfo", "-h", "-o", "%t %D"], check=False)
            seen = done.stdout.strip()
            if seen == want:
                return
            time.sleep(0.5)
        raise SlurmError(f"the Slurm nodes are not idle after {self.ready_timeout_s:g} s "
                         f"(sinfo: {seen!r}):\n{self.logs()}")

    def close(self) -> None:
        """Cancel every job, stop every daemon and process of the cluster, remove its
        namespaces. Idempotent; never raises for what is gone already."""
        if self._daemons and len(self._daemons) > 1:
            self.command(["scancel", "--full", "--user=root"], check=False, timeout_s=10)
        for proc in reversed(self._daemons):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._daemons):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._daemons.clear()
        if self.hosts is not None:
            self.hosts.close()
        for pid in self.stray_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.sockets, ignore_errors=True)

    def stray_pids(self) -> list[int]:
        """Processes of this machine that carry this cluster's ``SLURM_CONF`` (jobs' processes,
        ``slurmstepd``) other than this one; empty after :meth:`close`."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    # -- commands and jobs -------------------------------------------------------------------
    def command(self, argv: Sequence[str], *, check: bool = True, timeout_s: float = _CMD_TIMEOUT_S,
                cwd: str | os.PathLike | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command (``sbatch``, ``scontrol``...) against this cluster, on
        node 0; returns the finished process (text output).

        Raises:
            SlurmError: it exited non-zero (with ``check``) or ran past ``timeout_s`` seconds.
        """
        full = self._wrap(0, argv)
        try:
            done = subprocess.run(full, env={**os.environ, **(env or {}), **self.env}, cwd=cwd,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise SlurmError(f"{' '.join(argv)}: no answer in {timeout_s:g} s") from err
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip()}")
        return done

    def sbatch(self, script: str | os.PathLike, *options: str, cwd: str | os.PathLike | None = None,
               env: dict[str, str] | None = None) -> int:
        """Submit ``script`` as written (``sbatch --parsable [options] script``); its job id."""
        done = self.command(["sbatch", "--parsable", *options, str(script)], cwd=cwd, env=env)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o`` of ``job_id`` as a dict (``JobState``, ``ExitCode``,
        ``Restarts``, ``NodeList``, ...)."""
        text = self.command(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        return dict(item.split("=", 1) for item in text.split() if "=" in item)

    def wait(self, job_id: int, *, timeout_s: float, states=FINAL_STATES,
             poll_s: float = 1.0) -> dict[str, str]:
        """Wait until the job is in one of ``states`` (default: finished); its fields.

        A failing ``scontrol`` is retried until the deadline.

        Raises:
            SlurmError: still not there after ``timeout_s`` seconds (its last fields and the
                last ``scontrol`` error in the message).
        """
        deadline = time.monotonic() + timeout_s
        info: dict[str, str] = {}
        error = None
        while time.monotonic() < deadline:
            try:  # one failed scontrol (killed by SIGPIPE under load) is not the end
                info, error = self.job(job_id), None
            except SlurmError as err:
                error = err
            if info.get("JobState") in states and error is None:
                return info
            time.sleep(poll_s)
        raise SlurmError(f"job {job_id} not in {sorted(states)} after {timeout_s:g} s: {info}"
                         + (f" (last scontrol error: {error})" if error else ""))

    def _tail(self, name: str, lines: int = 30) -> str:
        path = self.work_dir / name
        if not path.exists():
            return f"({name}: none)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def logs(self, lines: int = 30) -> str:
        """The last lines of the daemons' logs (for a failed test's message)."""
        names = ["slurmctld.log", *[f"slurmd-{n}.log" for n in self.node_names], "munged.out"]
        return "\n".join(f"== {name}\n{self._tail(name, lines)}" for name in names)

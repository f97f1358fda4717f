"""``cluster.kind: ray`` across simulated hosts (kerasdist.testing.hosts): a multi-node Ray cluster,
one Ray node per host (``ray start --head`` on host 0, ``ray start --address`` on the others), the
multi-worker recipe joining it with ``cluster.address``, and Ray Train's elastic scaling
(``cluster.min_workers``) when a host is lost and when it comes back.

Needs root (network namespaces); skipped otherwise. Heavy (3 Ray nodes + 3 TensorFlow workers on
this 2-core machine): run alone, ``python -m pytest -q -n 0 -m "extended or not extended"
tests/multiprocess/test_ray_hosts.py`` (docs/ray.md, "Across machines").
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

import portpicker
import pytest

from kerasdist.testing.hosts import HostSet, leftovers

pytest.importorskip("ray.train.tensorflow")

REPO = Path(__file__).parents[2]
RECIPE = REPO / "recipes" / "mnist_cnn_ray.yaml"
RAY = str(Path(sys.executable).parent / "ray")
NUM_HOSTS = 3
OBJECT_STORE_BYTES = 80 << 20  # Ray's minimum is 75 MiB; no training data goes through it
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]

# Every Ray process (raylet, GCS, Ray workers: the Ray Train workers too) inherits the node's
# environment: kerasdist from this checkout, quiet TensorFlow, one thread.
# Ray 2.60 enables token authentication by default: one random token for the nodes and clients
# of this test (in the environment, so ~/.ray is not touched).
NODE_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEDUP_LOGS": "0"}  # every worker's lines on the driver, not "repeated 2x"

# Run in host 0's namespace: wait until `n` Ray nodes are alive; prints "NODES <ips>".
WAIT_NODES = """
import sys, time, ray
address, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + timeout
while True:
    alive = sorted(node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"])
    if len(alive) >= n or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print("NODES", " ".join(alive), flush=True)
"""


class RayHosts:
    """A Ray cluster on a :class:`HostSet`: the head on host 0, one worker node on each other
    host, each node with 1 logical CPU and its own temp dir (its own Unix sockets)."""

    def __init__(self, hosts: HostSet):
        self.hosts = hosts
        self.port = portpicker.pick_unused_port()
        self.address = f"{hosts.address(0)}:{self.port}"
        # short: Ray's Unix socket paths must fit in 107 bytes
        self.temp = Path(tempfile.mkdtemp(prefix="kdray-", dir="/tmp"))
        self.nodes: dict[int, object] = {}
        self.started = 0

    def start(self, host: int) -> None:
        common = ["--block", "--node-ip-address", self.hosts.address(host), "--num-cpus", "1",
                  "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats",
                  "--temp-dir", str(self.temp / f"h{host}-{self.started}")]
        self.started += 1
        if host == 0:
            argv = [RAY, "start", "--head", "--port", str(self.port), "--include-dashboard",
                    "false", *common]
        else:
            argv = [RAY, "start", "--address", self.address, *common]
        self.nodes[host] = self.hosts.run(host, argv, NODE_ENV, timeout_s=900, cwd=REPO)

    def join(self, host: int, nodes: int, *, tries: int = 3) -> float:
        """Start the node of ``host`` and wait until ``nodes`` Ray nodes are alive; return the
        seconds it took. Ray 2.60's ``ray start`` gives up when its raylet has not registered
        with the GCS within a fixed 30 s ("The current node timed out during startup"), which a
        loaded 2-core machine can exceed: such a start is retried (up to ``tries`` in all)."""
        started = time.monotonic()
        for attempt in range(1, tries + 1):
            self.start(host)
            alive = self.wait_nodes(nodes, 120, stop_if_exited=self.nodes[host])
            if len(alive) >= nodes and self.hosts.address(host) in alive:
                return time.monotonic() - started
            assert attempt < tries, f"host {host}'s Ray node did not join:\n{_logs(self.hosts)}"
            print(f"host {host}'s Ray node failed to start (try {attempt}): retrying")
            self.hosts.kill(host)
        raise AssertionError("unreachable")

    def wait_nodes(self, n: int, timeout_s: float = 120, stop_if_exited=None) -> list[str]:
        waiter = self.hosts.run(0, [sys.executable, "-c", WAIT_NODES, self.address, str(n),
                                    str(timeout_s)], NODE_ENV, timeout_s=timeout_s + 60,
                                capture=True)
        deadline = time.monotonic() + timeout_s + 70
        while waiter.poll() is None and time.monotonic() < deadline:
            if stop_if_exited is not None and stop_if_exited.poll() is not None:
                waiter.kill()  # the node's `ray start` gave up: no use waiting for it
                break
            time.sleep(0.5)
        out, _ = waiter.communicate(timeout=30)
        found = re.findall(r"^NODES (.*)$", out or "", re.M)
        return found[-1].split() if found else []

    def controller_events(self) -> list[tuple[float, str]]:
        """Ray Train's controller decisions so far (from its log on the head node), as
        ``(unix time, first line of the message)``: failures, resize decisions, groups started."""
        events = set()  # a set: session_latest is a link to the session's own folder
        for path in self.temp.glob("h0-*/session_*/logs/train/ray-train-sys-controller-*.log"):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    entry = json.loads(line)
                    stamp = datetime.datetime.strptime(entry["asctime"], "%Y-%m-%d %H:%M:%S,%f")
                    text = " ".join(entry["message"].split("\n")[:2])
                    if re.search(r"FailurePolicy|Deciding|Started training|timed out", text):
                        events.add((stamp.timestamp(), text[:200]))
        return sorted(events)

    def close(self, keep_logs: Path | None = None) -> None:
        """Remove the nodes' temp dirs; first copy their Ray logs to ``keep_logs`` (if given)."""
        if keep_logs is not None:
            for logs in self.temp.glob("h*/session_*/logs"):
                shutil.copytree(logs, keep_logs / logs.parents[1].name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.sock", "events"))
        shutil.rmtree(self.temp, ignore_errors=True)


@contextlib.contextmanager
def ray_on_hosts(tmp_path: Path):
    """3 hosts, a Ray node on each (all alive when the body starts); on exit every process and
    namespace of the set is gone (HostSet.close) and so are the nodes' temp dirs."""
    with HostSet(NUM_HOSTS, log_dir=tmp_path / "logs") as hosts:
        ray = RayHosts(hosts)
        try:
            started = time.monotonic()
            for host in range(NUM_HOSTS):  # one after the other: less load at each start
                ray.join(host, host + 1)
            print(f"\nRay: {NUM_HOSTS} nodes up after {time.monotonic() - started:.0f} s")
            yield hosts, ray
        finally:
            suffix = hosts.suffix
            hosts.close()
            ray.close(keep_logs=tmp_path / "ray-logs")
    assert leftovers(suffix) == []


def _logs(hosts: HostSet, *procs) -> str:
    texts = []
    for path in sorted(hosts.log_dir.glob("h*.log")):
        texts.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-2500:]}")
    return "\n".join(texts)


def _fit(hosts: HostSet, ray: RayHosts, run_dir: Path, *, steps: int, timeout_s: float,
         **overrides):
    """The driver: ``kerasdist fit recipes/mnist_cnn_ray.yaml --set cluster.address=...`` in host
    0's namespace (the run_dir is on the filesystem every host shares)."""
    settings = {"cluster.address": ray.address, "cluster.workers": NUM_HOSTS,
                "cluster.threads_per_task": 1, "data.batch_size": 32 * NUM_HOSTS,
                "trainer.epochs": 1, "trainer.steps_per_epoch": steps,
                "trainer.checkpoint.every_steps": 5, "strategy.timeout_s": 20,
                "output.tensorboard": False, "output.run_dir": str(run_dir), **overrides}
    argv = [sys.executable, "-m", "kerasdist", "fit", str(RECIPE), "--verbose", "2"]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return hosts.run(0, argv, NODE_ENV, timeout_s=timeout_s, cwd=REPO)


def _records(run_dir: Path) -> dict[int, dict]:
    out = {}
    for path in (run_dir / "logs").glob("ray-worker-*.json"):
        with contextlib.suppress(ValueError, OSError):
            out[int(path.stem.rsplit("-", 1)[1])] = json.loads(path.read_text())
    return out


def _newest_backup(run_dir: Path) -> int:
    steps = [int(m.group(1)) for p in (run_dir / "checkpoints").glob("ckpt-*.index")
             if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name))]
    return max(steps, default=-1)


def _wait_for(what: str, predicate, deadline: float, driver, hosts) -> None:
    while not predicate():
        assert driver.poll() is None, f"the driver exited {driver.poll()} before {what}:\n" + \
            hosts.output(driver)[-6000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + \
            hosts.output(driver)[-6000:]
        time.sleep(0.2)


@pytest.mark.timeout(720)
def test_ray_recipe_trains_across_three_hosts_one_worker_each(tmp_path):
    """A 3-node Ray cluster on 3 simulated hosts (1 CPU each): the multi-worker recipe joins it by
    address from host 0 and trains 3 workers in sync, one on each host (each worker's record names
    its node's address and its TF task address on that host)."""
    steps = 20
    run_dir = tmp_path / "run"
    with ray_on_hosts(tmp_path) as (hosts, ray):
        started = time.monotonic()
        driver = _fit(hosts, ray, run_dir, steps=steps, timeout_s=540)
        driver.wait(timeout=560)
        elapsed = time.monotonic() - started
        out = hosts.output(driver)
        records = _records(run_dir)
    print(f"driver exit {driver.returncode} after {elapsed:.0f} s; workers "
          f"{ {r: (v['node_ip'], v['task_address']) for r, v in sorted(records.items())} }")
    assert driver.returncode == 0, out[-6000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    print(f"held-out accuracy {metrics['evaluation']['accuracy']:.3f}, "
          f"{metrics['throughput']['examples_per_sec']:.0f} examples/s, wall {metrics['wall_time_s']:.0f} s")
    assert metrics["global_steps"] == steps and metrics["num_replicas"] == NUM_HOSTS, metrics
    addresses = [hosts.address(i) for i in range(NUM_HOSTS)]
    assert sorted(records) == list(range(NUM_HOSTS)), records
    assert sorted(r["node_ip"] for r in records.values()) == sorted(addresses), records
    for record in records.values():  # TF's task server of each worker is on its own host
        assert record["task_address"].rsplit(":", 1)[0] == record["node_ip"], record
        assert record["world_size"] == NUM_HOSTS
    digests = re.findall(r"done at global step \d+; weights sha256 ([0-9a-f]{64})", out)
    assert len(digests) == NUM_HOSTS and set(digests) == {metrics["weights_sha256"]}, out[-3000:]


def _resumed(out: str) -> list[int]:
    """Global steps the workers resumed at (kerasdist's "resuming from checkpoint" lines), in
    order; one per worker and attempt."""
    return [int(s) for s in re.findall(r"resuming from checkpoint \S+ \(global step (\d+)\)", out)]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fault", ["node_killed", "link_down"])
def test_a_lost_host_shrinks_the_ray_group_and_a_returning_host_grows_it_back(tmp_path, fault):
    """cluster.min_workers=2 of 3 (Ray Train's elastic ScalingConfig(num_workers=(2, 3))): once a
    backup at step >= 10 exists, host 2 is lost (``node_killed``: every process of its namespace,
    Ray node and worker, SIGKILLed; ``link_down``: its link partitioned, no reset). Ray restarts
    the group on the 2 hosts left, which resume from the newest backup at its exact global step
    with the recipe's global batch (96: 48 per replica). Then host 2 returns (a new Ray node on it,
    after its link is up) and Ray grows the group back to 3 (at its next resize check), which
    resumes again from the newest backup; the run ends at exactly the requested step."""
    steps, every = 60, 5
    run_dir = tmp_path / "run"
    with ray_on_hosts(tmp_path) as (hosts, ray):
        driver = _fit(hosts, ray, run_dir, steps=steps, timeout_s=1080, **{
            "cluster.min_workers": 2, "cluster.max_restarts": 3, "cluster.resize_check_s": 10,
            "trainer.checkpoint.every_steps": every, "trainer.validation": False})
        first = time.monotonic() + 400
        _wait_for("3 workers and a backup at step >= 10", lambda: len(_records(run_dir)) == 3
                  and _newest_backup(run_dir) >= 10, first, driver, hosts)
        old = _records(run_dir)
        assert {r["world_size"] for r in old.values()} == {3}, old
        at_loss = _newest_backup(run_dir)
        if fault == "node_killed":
            hosts.kill(2)
        else:
            hosts.link_down(2)
        lost, lost_wall = time.monotonic(), time.time()
        print(f"\n{fault}: host 2 lost with the newest backup at step {at_loss}")

        def shrunk():
            now = _records(run_dir)
            return all(i in now and now[i]["pid"] != old[i]["pid"] and now[i]["world_size"] == 2
                       for i in (0, 1))

        _wait_for("the group restarted on 2 workers", shrunk, lost + 300, driver, hosts)
        restarted = time.monotonic() - lost
        two = _records(run_dir)
        out = hosts.output(driver)
        resumed_small = _resumed(out)
        print(f"group restarted on 2 workers {restarted:.1f} s after the loss on "
              f"{sorted(two[i]['node_ip'] for i in (0, 1))}; resumes so far {resumed_small}")
        assert {two[i]["node_ip"] for i in (0, 1)} == {hosts.address(0), hosts.address(1)}, two
        # host 2 returns: its link up and, its Ray node being dead (killed, or marked dead by
        # Ray's GCS after missed health checks), a new Ray node started on it
        backup_before_grow = _newest_backup(run_dir)
        if fault == "link_down":
            hosts.kill(2)
            hosts.link_up(2)
        returned = time.monotonic()
        joined = ray.join(2, 3)
        print(f"host 2's new Ray node joined in {joined:.1f} s")

        def grown():
            now = _records(run_dir)
            return len(now) == 3 and all(now[i]["world_size"] == 3 and now[i]["pid"] != two.get(
                i, old[i])["pid"] for i in range(3))

        _wait_for("the group grown back to 3 workers", grown, returned + 300, driver, hosts)
        grew = time.monotonic() - returned
        three = _records(run_dir)
        print(f"group grown back to 3 workers {grew:.1f} s after host 2's new Ray node started "
              f"(newest backup then >= {backup_before_grow})")
        driver.wait(timeout=max(10, 1060 - (time.monotonic() - lost)))
        out = hosts.output(driver)
        print("Ray Train's controller, seconds after the loss:")
        for stamp, text in ray.controller_events():
            if stamp >= lost_wall - 1:
                print(f"  {stamp - lost_wall:+7.1f} s  {text}")
    assert driver.returncode == 0, out[-6000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    resumed = _resumed(out)
    print(f"resumed at {resumed}; metrics: global_steps {metrics['global_steps']}, start_step "
          f"{metrics.get('start_step')}, replicas {metrics['num_replicas']}")
    assert metrics["global_steps"] == steps and metrics["num_replicas"] == 3, metrics
    assert sorted(r["node_ip"] for r in three.values()) == sorted(
        hosts.address(i) for i in range(3)), three
    # the 2-worker attempt resumed (both workers) at one step, the newest backup when it started,
    # at least the one that existed at the loss: nothing before it is retrained
    small = resumed[:2]
    assert len(small) == 2 and small[0] == small[1] and small[0] >= at_loss, resumed
    # then the grown group of 3 resumed at one step, at least the newest backup when host 2
    # came back. A later failure of the grown group (seen once: a collective timeout at the very
    # end of the run under load, docs/hosts.md) restarts it within cluster.max_restarts: each
    # such attempt resumes, again all 3 at one step, never earlier than the one before.
    big = resumed[2:]
    attempts = [big[i:i + 3] for i in range(0, len(big), 3)]
    assert attempts and all(len(a) == 3 and len(set(a)) == 1 for a in attempts), resumed
    assert attempts[0][0] >= max(small[0], backup_before_grow), resumed
    assert [a[0] for a in attempts] == sorted(a[0] for a in attempts), resumed
    assert metrics["start_step"] == attempts[-1][0], metrics


# Run in host 0's namespace: poll until the alive Ray nodes are exactly `want` (a space-separated
# list of addresses) or the timeout passes; prints "ALIVE <ips>" then "AFTER <seconds>".
ALIVE_WHEN = """
import sys, time, ray
address, want, timeout = sys.argv[1], sorted(sys.argv[2].split()), float(sys.argv[3])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
started = time.monotonic()
while True:
    alive = sorted(node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"])
    if alive == want or time.monotonic() - started > timeout:
        break
    time.sleep(0.5)
print("ALIVE", " ".join(alive), flush=True)
print("AFTER", round(time.monotonic() - started, 1), flush=True)
"""


def _alive_when(hosts: HostSet, ray: RayHosts, want: list[str], timeout_s: float) -> tuple:
    """``(alive addresses, seconds waited)`` once Ray's alive nodes are ``want`` (or timed out)."""
    waiter = hosts.run(0, [sys.executable, "-c", ALIVE_WHEN, ray.address, " ".join(want),
                           str(timeout_s)], NODE_ENV, timeout_s=timeout_s + 90, capture=True)
    out, _ = waiter.communicate(timeout=timeout_s + 90)
    alive = re.findall(r"^ALIVE ?(.*)$", out or "", re.M)
    after = re.findall(r"^AFTER (\S+)$", out or "", re.M)
    assert alive and after, out
    return alive[-1].split(), float(after[-1])


@pytest.mark.timeout(600)
def test_a_partitioned_ray_node_is_marked_dead_and_does_not_rejoin_when_its_link_returns(
        tmp_path):
    """What Ray itself does with a host partitioned longer than its health checks allow (no
    training: the fact docs/ray.md builds on). Host 1's link goes down: Ray's GCS marks its node
    dead. The link comes back: that node's raylet does not come back as an alive node of the
    cluster (it learns it was marked dead and ends), so a returning host needs a new
    ``ray start --address`` (what test_a_lost_host_shrinks... does) before Ray Train can grow the
    group back on it."""
    with HostSet(2, log_dir=tmp_path / "logs") as hosts:
        ray = RayHosts(hosts)
        try:
            ray.join(0, 1)
            ray.join(1, 2)
            both = sorted(hosts.address(i) for i in range(2))
            hosts.link_down(1)
            cut = time.monotonic()
            alive, _ = _alive_when(hosts, ray, [hosts.address(0)], 180)
            marked_dead = time.monotonic() - cut
            assert alive == [hosts.address(0)], f"host 1's node still alive:\n{_logs(hosts)}"
            down_for = time.monotonic() - cut
            hosts.link_up(1)
            back = time.monotonic()
            alive_after, _ = _alive_when(hosts, ray, both, 60)
            node = ray.nodes[1]
            deadline = time.monotonic() + 30
            while node.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            ended = node.poll()
            print(f"\nhost 1's node marked dead {marked_dead:.1f} s after its link went down "
                  f"(link down {down_for:.1f} s); {time.monotonic() - back:.0f} s after the link "
                  f"came back: alive nodes {alive_after}, host 1's `ray start --block` "
                  f"{'exited ' + str(ended) if ended is not None else 'still running'}")
            log = _logs(hosts)
        finally:
            suffix = hosts.suffix
            hosts.close()
            ray.close(keep_logs=tmp_path / "ray-logs")
    assert leftovers(suffix) == []
    assert alive_after == [hosts.address(0)], log  # the partitioned node did not rejoin

"""The pods of ``kerasdist export jobset`` run as JobSet would run them: every pod's command and
environment taken from the manifest (the downward-API annotations and ``JOB_COMPLETION_INDEX``
filled in as Kubernetes does), each on a simulated host whose DNS name
(``<jobset>-<replicated job>-0-<index>.<jobset>``) resolves to its address as JobSet's headless
service makes it resolve (a private ``/etc/hosts`` per process). No ``TF_CONFIG`` is given: each
pod derives its own (``cluster.kind: jobset``). Needs root (network namespaces); skipped
otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kerasdist.testing.hosts import HostSet, with_hosts_file

REPO = Path(__file__).parents[2]
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]
TASK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _manifest(recipe: Path, tmp_path: Path) -> dict:
    out = tmp_path / "jobset.yaml"
    done = subprocess.run([sys.executable, "-m", "kerasdist", "export", "jobset", str(recipe),
                           "-o", str(out), "--name", "kd"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    manifest, _network_policy = yaml.safe_load_all(out.read_text())
    return manifest


def _run_pods(manifest: dict, hosts: HostSet, tmp_path: Path, *,
              timeout_s: float) -> dict[str, subprocess.Popen]:
    """Start every pod of ``manifest``, pod i on host i; returns the processes by task name."""
    from kerasdist.cluster.export_jobset import pod_environments

    commands = {j["name"]: j["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
                for j in manifest["spec"]["replicatedJobs"]}
    return _start(pod_environments(manifest), commands, manifest["metadata"]["name"], hosts,
                  tmp_path, timeout_s=timeout_s)


def _start(environments: dict[str, dict[str, str]], commands: dict[str, list[str]], name: str,
           hosts: HostSet, tmp_path: Path, *, timeout_s: float) -> dict[str, subprocess.Popen]:
    """Pod ``<replicated job>:<index>`` i of ``environments`` on host i, named as JobSet names
    it, running ``commands[<replicated job>]``."""
    from kerasdist.launch.clusters.jobset import pod_host

    lines = ["127.0.0.1 localhost"]
    for host, task in enumerate(environments):
        job, index = task.split(":")
        lines.append(f"{hosts.address(host)} {pod_host(name, job, int(index))}")
    hosts_file = tmp_path / "etc-hosts"
    hosts_file.write_text("\n".join(lines) + "\n")
    processes = {}
    for host, (task, env) in enumerate(environments.items()):
        command = commands[task.split(":")[0]]
        assert command[0] == "kerasdist"
        argv = with_hosts_file(hosts_file, [sys.executable, "-m", "kerasdist", *command[1:]])
        processes[task] = hosts.run(host, argv, {**TASK_ENV, **env}, timeout_s=timeout_s,
                                    cwd=REPO)
    return processes


def _linear(tmp_path: Path) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "linear_mwms.yaml").read_text())
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    path = tmp_path / "linear_mwms.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.mark.timeout(600, method="signal")
def test_the_jobset_pods_of_the_multi_worker_recipe_train_to_its_target(tmp_path):
    """recipes/linear_mwms.yaml as a JobSet of 2 worker pods on 2 hosts: both exit 0, W within
    0.1 of 2 and b within 0.1 of 10 (the recipe's target)."""
    import keras
    import numpy as np

    manifest = _manifest(_linear(tmp_path), tmp_path)
    with HostSet(2, log_dir=tmp_path / "logs") as hosts:
        processes = _run_pods(manifest, hosts, tmp_path, timeout_s=540)
        deadline = time.monotonic() + 540
        for process in processes.values():
            process.wait(timeout=max(1, deadline - time.monotonic()))
        logs = {task: hosts.output(p)[-3000:] for task, p in processes.items()}
    codes = {task: p.returncode for task, p in processes.items()}
    assert codes == {"worker:0": 0, "worker:1": 0}, logs
    model = keras.saving.load_model(tmp_path / "run" / "model.keras", compile=False)
    kernel, bias = (float(np.ravel(w)[0]) for w in model.get_weights())
    print(f"\nJobSet pods kd-worker-0-0.kd, kd-worker-0-1.kd: W={kernel:.4f} b={bias:.4f}")
    assert abs(kernel - 2) < 0.1 and abs(bias - 10) < 0.1, logs


@pytest.mark.extended
@pytest.mark.timeout(1500, method="signal")
def test_the_jobset_pods_of_the_parameter_server_recipe_train_to_its_target(tmp_path):
    """recipes/mnist_cnn_ps.yaml whole as a JobSet (chief, ps, 2 workers) on 4 hosts: the chief
    exits 0 with held-out accuracy >= 0.975 (the recipe's target); the ps and worker servers
    serve until JobSet's successPolicy (the chief done) deletes them: here the test ends them."""
    raw = yaml.safe_load((REPO / "recipes" / "mnist_cnn_ps.yaml").read_text())
    raw["cluster"]["threads_per_task"] = 1
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    recipe = tmp_path / "mnist_cnn_ps.yaml"
    recipe.write_text(yaml.safe_dump(raw), encoding="utf-8")
    manifest = _manifest(recipe, tmp_path)
    assert manifest["spec"]["successPolicy"]["targetReplicatedJobs"] == ["chief"]
    with HostSet(4, log_dir=tmp_path / "logs") as hosts:
        processes = _run_pods(manifest, hosts, tmp_path, timeout_s=1440)
        processes["chief:0"].wait(timeout=1400)
        serving = sorted(t for t, p in processes.items() if p.poll() is None)
        logs = {task: hosts.output(p)[-3000:] for task, p in processes.items()}
    assert processes["chief:0"].returncode == 0, logs
    assert serving == ["ps:0", "worker:0", "worker:1"], logs
    result = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print(f"\nJobSet chief: accuracy {result['evaluation']['accuracy']:.4f}, "
          f"{result['global_steps']} steps")
    assert result["global_steps"] == 625 and result["evaluation"]["accuracy"] >= 0.975, result


def _trainjob(recipe: Path, tmp_path: Path) -> tuple[dict, dict]:
    out = tmp_path / "trainjob.yaml"
    done = subprocess.run([sys.executable, "-m", "kerasdist", "export", "trainjob", str(recipe),
                           "-o", str(out), "--name", "kd"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    runtime, trainjob, _network_policy = yaml.safe_load_all(out.read_text())
    return runtime, trainjob


@pytest.mark.extended
@pytest.mark.timeout(1500, method="signal")
def test_the_trainjob_pods_of_the_parameter_server_recipe_train_to_its_target(tmp_path):
    """recipes/mnist_cnn_ps.yaml whole as a Kubeflow Trainer v2 TrainJob: 4 pods of the one
    replicated job ``node`` (kd-node-0-0.kd ... kd-node-0-3.kd) on 4 hosts, each taking its role
    from its rank: node 0 (the chief) exits 0 with held-out accuracy >= 0.975 (the recipe's
    target); nodes 1-3 (ps, workers) serve until the Job's successPolicy (index 0 succeeded)
    ends them: here the test ends them."""
    from kerasdist.cluster.export_trainjob import trainjob_pod_environments

    raw = yaml.safe_load((REPO / "recipes" / "mnist_cnn_ps.yaml").read_text())
    raw["cluster"]["threads_per_task"] = 1
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    recipe = tmp_path / "mnist_cnn_ps.yaml"
    recipe.write_text(yaml.safe_dump(raw), encoding="utf-8")
    runtime, trainjob = _trainjob(recipe, tmp_path)
    environments = trainjob_pod_environments(runtime, trainjob)
    assert list(environments) == ["node:0", "node:1", "node:2", "node:3"]
    with HostSet(4, log_dir=tmp_path / "logs") as hosts:
        processes = _start(environments, {"node": trainjob["spec"]["trainer"]["command"]}, "kd",
                           hosts, tmp_path, timeout_s=1440)
        processes["node:0"].wait(timeout=1400)
        serving = sorted(t for t, p in processes.items() if p.poll() is None)
        logs = {task: hosts.output(p)[-3000:] for task, p in processes.items()}
    assert processes["node:0"].returncode == 0, logs
    assert serving == ["node:1", "node:2", "node:3"], logs
    result = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print(f"\nTrainJob node 0 (chief): accuracy {result['evaluation']['accuracy']:.4f}, "
          f"{result['global_steps']} steps")
    assert result["global_steps"] == 625 and result["evaluation"]["accuracy"] >= 0.975, result


@pytest.mark.extended
@pytest.mark.timeout(600, method="signal")
def test_the_trainjob_pods_of_the_multi_worker_recipe_train_to_its_target(tmp_path):
    """recipes/linear_mwms.yaml as a TrainJob of 2 nodes on 2 hosts: both exit 0, W within 0.1
    of 2 and b within 0.1 of 10 (the recipe's target)."""
    import keras
    import numpy as np

    from kerasdist.cluster.export_trainjob import trainjob_pod_environments

    runtime, trainjob = _trainjob(_linear(tmp_path), tmp_path)
    with HostSet(2, log_dir=tmp_path / "logs") as hosts:
        processes = _start(trainjob_pod_environments(runtime, trainjob),
                           {"node": trainjob["spec"]["trainer"]["command"]}, "kd", hosts,
                           tmp_path, timeout_s=540)
        deadline = time.monotonic() + 540
        for process in processes.values():
            process.wait(timeout=max(1, deadline - time.monotonic()))
        logs = {task: hosts.output(p)[-3000:] for task, p in processes.items()}
    assert {task: p.returncode for task, p in processes.items()} == {"node:0": 0, "node:1": 0}, \
        logs
    model = keras.saving.load_model(tmp_path / "run" / "model.keras", compile=False)
    kernel, bias = (float(np.ravel(w)[0]) for w in model.get_weights())
    print(f"\nTrainJob nodes kd-node-0-0.kd, kd-node-0-1.kd: W={kernel:.4f} b={bias:.4f}")
    assert abs(kernel - 2) < 0.1 and abs(bias - 10) < 0.1, logs

"""Start a local cluster for the tf_keras baseline and run its job; the whole tree is one process
group, so ``kerasdist bench`` measures the memory of every task.

Run: ``python -m kerasdist.bench.tfkeras_cluster {parameter_server,multi_worker} RECIPE WORKERS OUT``
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import ClusterError
from kerasdist.launch.processes import LocalLauncher, describe_exit

JOB = [sys.executable, "-m", "kerasdist.bench.tfkeras_job"]


def main(argv=None) -> int:
    kind, recipe_path, workers, out_path = sys.argv[1:] if argv is None else argv
    workers = int(workers)
    log_dir = Path(out_path).with_suffix(".logs")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # this wrapper's own env, inherited by its tasks only
    if _is_coordinator(kind):
        spec = local_cluster(workers=workers, ps=1, chief=True)
        roles = [("ps", 0)] + [("worker", i) for i in range(workers)]
        with LocalLauncher(log_dir=log_dir) as launcher:
            servers = [launcher.start(spec.for_task(job, i),
                                      ["fit", recipe_path, "--set", "cluster.kind=tf_config"])
                       for job, i in roles]
            launcher.wait_listening(servers, timeout_s=120)
            chief = launcher.start(spec, [kind, recipe_path, out_path], program=JOB)
            return _wait(launcher, [chief])
    spec = local_cluster(workers=workers)
    with LocalLauncher(log_dir=log_dir) as launcher:
        tasks = [launcher.start(spec.for_task("worker", i), [kind, recipe_path, out_path],
                                program=JOB) for i in range(workers)]
        return _wait(launcher, tasks)


def _wait(launcher: LocalLauncher, tasks) -> int:
    while not all(t.returncode() == 0 for t in tasks):
        failed = launcher.failed()
        if failed:
            task = failed[0]
            raise ClusterError(f"tf_keras task {task.name} {describe_exit(task.returncode())}:\n"
                               f"{launcher.tail(task)}")
        time.sleep(0.2)
    return 0


def _is_coordinator(kind: str) -> bool:
    """Whether the strategy kind runs a coordinator with ps tasks (from its declared traits)."""
    from kerasdist.config.schema import strategy_config_classes

    return strategy_config_classes()[kind].traits.topology == "coordinator"


if __name__ == "__main__":
    sys.exit(main())


"""Start a local cluster for a cluster baseline row and run its job; the whole tree is one process
group, so ``kerasdist bench`` measures the memory of every task.

Jobs: ``tf_keras`` (:mod:`kerasdist.bench.tfkeras_job`, Keras 2's own distributed ``fit``, run with
``TF_USE_LEGACY_KERAS=1``) and ``keras_enable`` (:mod:`kerasdist.bench.enable_job`, a user's Keras 3
``fit`` with only ``kerasdist.enable()``). Under ``parameter_server`` the ps and worker tasks are
kerasdist's own task servers (``kerasdist fit RECIPE`` with ``cluster.kind=tf_config``) and the
job is the coordinator; under ``multi_worker`` every worker runs the job.

Run: ``python -m kerasdist.bench.baseline_cluster {tf_keras,keras_enable}
{parameter_server,multi_worker} RECIPE WORKERS OUT``
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kerasdist.bench.runner import is_coordinator
from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import ClusterError
from kerasdist.launch.processes import LocalLauncher, describe_exit

JOBS = {"tf_keras": [sys.executable, "-m", "kerasdist.bench.tfkeras_job"],
        "keras_enable": [sys.executable, "-m", "kerasdist.bench.enable_job"]}


def main(argv=None) -> int:
    job, kind, recipe_path, workers, out_path = sys.argv[1:] if argv is None else argv
    workers = int(workers)
    log_dir = Path(out_path).with_suffix(".logs")
    if job == "tf_keras":  # this wrapper's own env, inherited by its tasks only
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    program = JOBS[job]
    # keras_enable runs with the threads kerasdist's own row gets ('auto' resolved for this
    # cluster), so the two rows differ only in the lifecycle; tf_keras with TF's default.
    threads = 0
    if job == "keras_enable":
        from kerasdist.config import load_recipe

        threads = load_recipe(recipe_path).intra_op_threads()
    if is_coordinator(kind):
        spec = local_cluster(workers=workers, ps=1, chief=True)
        roles = [("ps", 0)] + [("worker", i) for i in range(workers)]
        with LocalLauncher(log_dir=log_dir, threads_per_task=threads) as launcher:
            servers = [launcher.start(spec.for_task(role, i),
                                      ["fit", recipe_path, "--set", "cluster.kind=tf_config",
                                       "--set", f"cluster.threads_per_task={threads}"])
                       for role, i in roles]
            launcher.wait_listening(servers, timeout_s=120)
            chief = launcher.start(spec, [kind, recipe_path, out_path], program=program)
            return _wait(launcher, [chief])
    spec = local_cluster(workers=workers)
    with LocalLauncher(log_dir=log_dir, threads_per_task=threads) as launcher:
        tasks = [launcher.start(spec.for_task("worker", i), [kind, recipe_path, out_path],
                                program=program) for i in range(workers)]
        return _wait(launcher, tasks)


def _wait(launcher: LocalLauncher, tasks) -> int:
    while not all(t.returncode() == 0 for t in tasks):
        failed = launcher.failed()
        if failed:
            task = failed[0]
            raise ClusterError(f"baseline task {task.name} {describe_exit(task.returncode())}:\n"
                               f"{launcher.tail(task)}")
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())


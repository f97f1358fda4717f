"""One process of a conformance run: build the strategy once, run every planned case under it.

``python kerasdist/conformance/task.py PLAN.json`` (the driver starts it directly for ``default``
and ``mirrored``, and through ``kerasdist launch`` for ``multi_worker`` -- every worker runs it --
and ``parameter_server`` -- it runs once, as the coordinator). ``PLAN.json``::

    {"strategy": "multi_worker", "cases": ["sequential", ...], "out": DIR, "workdir": DIR,
     "initial": DIR}

Each case's result goes to ``<out>/<case>.<task>.{npz,json}`` (:mod:`kerasdist.conformance.runner`),
``<task>`` being ``main`` or ``worker-<i>``. A case that raises is recorded as an error and the
next case runs (under ``multi_worker`` a failure seen by one worker only leaves the other in a
collective until ``COLLECTIVE_TIMEOUT_S``; both then go on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kerasdist.conformance.case import task_name

LOGICAL_CPUS = 2
COLLECTIVE_TIMEOUT_S = 60


def _one_device(tf):
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def _mirrored(tf):
    cpu = tf.config.list_physical_devices("CPU")[0]  # its replicas are logical CPUs
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(LOGICAL_CPUS)])
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(LOGICAL_CPUS)])


def _multi_worker(tf):
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_S)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _parameter_server(tf):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(resolver)


PLAIN_STRATEGIES = {"reference": None, "default": _one_device, "mirrored": _mirrored,
                    "multi_worker": _multi_worker, "parameter_server": _parameter_server}
"""Each matrix column's plain ``tf.distribute`` strategy, as a user would build it (not
kerasdist's own builders: the matrix tests Keras 3 itself under ``kerasdist.enable()``); the
reference column has none."""


def build_strategy(kind: str):
    """The column's strategy (:data:`PLAIN_STRATEGIES`) in this process, its threads set first;
    None for the reference.

    Raises:
        ValueError: ``kind`` is not a column of :data:`PLAIN_STRATEGIES`.
    """
    if kind not in PLAIN_STRATEGIES:
        raise ValueError(f"unknown conformance strategy. Received: {kind!r}")
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(4)
    make = PLAIN_STRATEGIES[kind]
    return None if make is None else make(tf)


def coordinated(kind: str) -> bool:
    """Whether the column's kind trains through a coordinator (the registry's ``coordinator``
    topology: parameter server), whose input is a dataset function, not a dataset."""
    from kerasdist.strategies import get

    return kind != "reference" and get(kind).traits.topology == "coordinator"


def run_plan(plan: dict) -> int:
    """Run every case of ``plan`` (module docs); returns the number of cases that raised."""
    import kerasdist
    from kerasdist.conformance import runner
    from kerasdist.conformance.cases import select

    kind = plan["strategy"]
    kerasdist.enable()
    strategy = build_strategy(kind)
    name, is_chief = task_name()
    out, initial_dir = Path(plan["out"]), Path(plan["initial"])
    broken, failures = None, 0
    for case in select(plan["cases"]):
        if broken:
            runner.save({"status": "not_run", "error": f"not run: the cluster stopped being "
                         f"usable after case '{broken}' failed"}, out, case.name, name)
            continue
        initial = runner.load(initial_dir, case.name, "initial")
        try:
            result = runner.run_case(
                case, strategy, workdir=Path(plan["workdir"]) / case.name,
                initial=initial["initial_weights"] if initial else None, is_chief=is_chief,
                parameter_server=coordinated(kind))
        except Exception as err:  # noqa: BLE001 - recorded per case; the driver reports it
            result = runner.failure(err)
            failures += 1
        runner.save(result, out, case.name, name)
        print(f"[conformance] {kind} {name} {case.name}: {result['status']}", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(argv[0]).read_text())
    run_plan(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())

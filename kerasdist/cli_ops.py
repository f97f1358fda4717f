"""The operations commands of the ``kerasdist`` CLI (``launch``, ``evaluate``, ``env``; the parser
of ``sweep``), registered by :mod:`kerasdist.cli` with :func:`add_parsers`. Exit codes as in
:mod:`kerasdist.errors`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from kerasdist._log import get_logger
from kerasdist.errors import EXIT_BAD_INPUT, EXIT_OK, ClusterError

log = get_logger("launch")


def threads_per_task(text: str) -> int:
    """``--threads-per-task``: an integer from 0 to
    :data:`~kerasdist.config.schema.MAX_THREADS_PER_TASK` (else exit 2 before a task starts)."""
    from kerasdist.config.schema import MAX_THREADS_PER_TASK

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_THREADS_PER_TASK:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 0 (TensorFlow's default) to {MAX_THREADS_PER_TASK}. "
            f"Received: {text!r}")
    return value


def task_timeout_s(text: str) -> float | None:
    """``--task-timeout-s``: seconds (> 0, at most a day) a watched task may stay unreachable or
    hung before it is lost; ``none`` turns the watch off."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(
            f"must be seconds, more than 0 and at most 86400, or 'none'. Received: {text!r}")
    return value


def add_parsers(sub, add_role_args) -> None:
    """Add the ``launch``, ``evaluate``, ``env`` and ``sweep`` sub-commands to ``sub``."""
    from kerasdist.sweep import command as sweep

    sweep.add_parser(sub)
    launch = sub.add_parser(
        "launch", help="run your own Keras script as a local cluster (each task gets TF_CONFIG; "
                       "kerasdist.enable() is applied first)")
    launch.add_argument("--workers", default="2", help="worker tasks: N, or MIN:MAX to go on "
                        "with as few as MIN when a lost worker cannot be restarted within "
                        "--max-restarts (with --ray: Ray Train's elastic group, from MIN to MAX "
                        "workers) (default 2)")
    launch.add_argument("--ps", type=int, default=0, help="parameter-server tasks; > 0 runs the "
                        "script once as the coordinator (chief) and servers on the ps/workers")
    launch.add_argument("--chief", action="store_true",
                        help="multi-worker: add a chief:0 task that also runs the script")
    launch.add_argument("--max-restarts", type=int, default=None,
                        help="restart the cluster (or a dead PS worker) this many times "
                             "(default 0); with --this-task in a Slurm job: the requeues task 0 "
                             "may ask for after --preemption-signal (a job requeued more often is "
                             "refused, exit 2; default: no requeue, no cap)")
    launch.add_argument("--preemption-signal", default="USR1",
                        help="with --this-task in a Slurm job: the signal (sbatch "
                             "--signal=<SIG>@N) that stops the script; task 0 then requeues the "
                             "job within --max-restarts (default USR1)")
    launch.add_argument("--log-dir", default="kerasdist-logs", help="per-task logs (default "
                        "./kerasdist-logs)")
    launch.add_argument("--threads-per-task", type=threads_per_task, default=0,
                        help="intra-op threads per task, 0 to 1024 (0: TensorFlow's default)")
    launch.add_argument("--dry-run", action="store_true",
                        help="print each task's TF_CONFIG and command; start nothing")
    launch.add_argument("--allow-oversubscription", action="store_true",
                        help="start more than 4 tasks per CPU core (at least 8 in all)")
    launch.add_argument("--allow-network-exposure", action="store_true",
                        help="run without a private network namespace: the task servers are "
                             "then reachable, unauthenticated, from other machines")
    launch.add_argument("--this-task", action="store_true",
                        help="on a real cluster: run only this machine's task, its role from "
                             "TF_CONFIG, the Slurm job or the role flags (ps/worker tasks of a "
                             "parameter-server cluster serve; the others run the script)")
    launch.add_argument("--task-timeout-s", type=task_timeout_s, default=60.0,
                        help="parameter-server clusters: seconds a ps or worker task may stay "
                             "unreachable or hung before it is lost (restarted locally; with "
                             "--this-task the task watching it exits 1); 'none': never (default "
                             "60, as strategy.task_timeout_s)")
    launch.add_argument("--ray", action="store_true",
                        help="run the workers as Ray Train workers (pip install 'kerasdist[ray]'; "
                             "multi-worker scripts only)")
    launch.add_argument("--ray-address", default=None,
                        help="--ray: 'auto' or HOST:PORT of an existing Ray cluster (default: a "
                             "local Ray for this run, in a private network namespace)")
    launch.add_argument("--cpus-per-worker", type=float, default=1.0,
                        help="--ray: logical CPUs each worker reserves (default 1)")
    launch.add_argument("--gpus-per-worker", type=float, default=0.0,
                        help="--ray: GPUs each worker reserves (default 0)")
    launch.add_argument("--resize-check-s", type=float, default=60.0,
                        help="--ray with --workers MIN:MAX: seconds between Ray Train's checks "
                             "whether a smaller group can grow (default 60)")
    launch.add_argument("--debug", action="store_true",
                        help="on a failure, also print the Python traceback (also: "
                             "KERASDIST_DEBUG=1)")
    add_role_args(launch)
    launch.add_argument("script", help="your Python script")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")

    evaluate = sub.add_parser("evaluate", help="sidecar evaluator: evaluate a run's checkpoints "
                                               "(the newest, or each new one with --watch)")
    evaluate.add_argument("run_dir", help="the run directory (holds run.json and checkpoints/)")
    evaluate.add_argument("--watch", action="store_true",
                          help="evaluate every new checkpoint until the run finishes")
    evaluate.add_argument("--split", default=None, help="split to evaluate (default: the "
                          "recipe's data.eval_split)")
    evaluate.add_argument("--poll-s", type=float, default=2.0, help="--watch: seconds between looks")
    evaluate.add_argument("--idle-timeout-s", type=float, default=None,
                          help="--watch: give up after this many seconds without a new checkpoint")
    evaluate.add_argument("--json", action="store_true", help="print the evaluations as JSON")

    env = sub.add_parser("env", help="versions, devices, active mends and this process's "
                                     "cluster role, for bug reports")
    env.add_argument("--json", action="store_true", help="print JSON")
    add_role_args(env)


def _this_task(args) -> int:
    """``launch --this-task``: this process's role of a real cluster (the role flags, else its
    Slurm step, else ``TF_CONFIG``); the script reads the ``TF_CONFIG`` set here. The kind's hooks
    (:class:`~kerasdist.launch.clusters.slurm.SlurmKind` in a Slurm step) serve a ps or worker
    task of a parameter-server cluster, log the start, requeue after ``--preemption-signal`` stops
    the script (exit 128 + its number; only with ``--max-restarts``, which also caps the requeues
    at start) and release the servers when the chief exits 0."""
    import contextlib

    from kerasdist.cluster.spec import parse_tf_config
    from kerasdist.cluster.watch import TaskWatch, watched_tasks
    from kerasdist.launch.clusters import slurm, tf_config
    from kerasdist.launch.script_task import run_script

    on_slurm = args.job_name is None and not os.environ.get("TF_CONFIG") and \
        bool(os.environ.get("SLURM_JOB_ID"))
    kind = slurm.SlurmKind() if on_slurm else tf_config.TFConfigKind()
    task = _script_recipe(args, slurm=on_slurm)
    if args.job_name is not None:
        spec = flags_role(args)
    else:
        spec = kind.environment_role(task) if on_slurm else \
            parse_tf_config(os.environ.get("TF_CONFIG"))
    os.environ["TF_CONFIG"] = spec.to_json()  # this process's own role, read by the script
    serves = spec.num("ps") > 0 and spec.task_type in ("ps", "worker")
    watched = watched_tasks(spec, args.task_timeout_s) if spec.num("ps") > 0 else {}
    if args.dry_run:
        print(f"[{spec.task_name}]\n  TF_CONFIG='{spec.to_json()}'\n  "
              f"{'serve' if serves else ' '.join([args.script, *args.script_args])}")
        if watched:
            print(f"  watches {', '.join(sorted(watched))} (lost after "
                  f"{args.task_timeout_s:g} s unreachable or hung: exit 1)")
        return EXIT_OK
    # a parameter-server chief or worker watches the tasks it waits on, as a recipe's do
    watch = TaskWatch(watched, args.task_timeout_s, task=spec.task_name,
                      setting="--task-timeout-s") if watched else contextlib.nullcontext()
    if args.max_restarts is not None:
        kind.log_start(task, spec)
    with watch, _task_prefix(spec):
        if serves:
            kind.serve(task, spec)
            return EXIT_OK
        try:
            with slurm.signal_ends_script(args.preemption_signal) if on_slurm else \
                    contextlib.nullcontext():
                code = run_script(args.script, list(args.script_args))
        except slurm.ScriptPreempted as stop:
            if args.max_restarts is not None:
                kind.on_preempted(task)
            else:
                log.warning("preempted; not requeued: give --max-restarts N to requeue the job")
            return 128 + stop.signum
    if code == 0 and spec.task_type == "chief" and spec.num("ps") > 0:
        kind.on_success(task, spec)
    return code


def _script_recipe(args, *, slurm: bool):
    """What the scheduled kinds' hooks read of a recipe, for a ``launch --this-task`` script: the
    strategy ``--ps`` implies, in a Slurm step a Slurm cluster of the flags, TF's default threads."""
    from types import SimpleNamespace

    from kerasdist.config.cluster_configs import SlurmClusterConfig

    cluster = SlurmClusterConfig(ps=args.ps, max_restarts=args.max_restarts or 0,
                                 preemption_signal=args.preemption_signal) if slurm else None
    strategy = SimpleNamespace(kind="parameter_server" if args.ps > 0 else "multi_worker")
    return SimpleNamespace(strategy=strategy, cluster=cluster, intra_op_threads=lambda: 0)


def flags_role(args):
    """The role the seed-style flags give (``--job-name`` ... ``--chief-host``).

    Raises:
        ClusterError: a malformed host list or index (names the flag).
    """
    from kerasdist.cluster.spec import from_flags

    return from_flags(job_name=args.job_name, task_index=args.task_index or 0,
                      ps_hosts=args.ps_hosts or "", worker_hosts=args.worker_hosts or "",
                      chief_host=args.chief_host or "")


def _task_prefix(spec):
    """Every task runs the script under multi-worker (their output shares the job's console:
    each line says its task); under parameter server only the chief does (no prefix)."""
    import contextlib

    from kerasdist.launch.echo import prefixed_output

    speakers = spec.num("worker") + spec.num("chief") if spec.num("ps") == 0 else 1
    return prefixed_output(spec.task_name) if speakers > 1 else contextlib.nullcontext()


def _signal_name(text: str) -> str:
    """``--preemption-signal``, checked as ``cluster.preemption_signal`` is (exit 2 naming it)."""
    from kerasdist.config.schema import PREEMPTION_SIGNALS

    name = text.strip().upper().removeprefix("SIG")
    if name not in PREEMPTION_SIGNALS:
        raise ClusterError(f"--preemption-signal must name one of {', '.join(PREEMPTION_SIGNALS)} "
                           f"(with or without 'SIG'). Received: {text!r}")
    return name


def _cmd_launch(args) -> int:
    """Build the launch spec (:class:`~kerasdist.launch.script.ScriptCluster`) from the flags and
    hand it to :func:`kerasdist.launch.script.launch`."""
    from kerasdist.launch.isolation import isolated_here
    from kerasdist.launch.plan import parse_worker_range
    from kerasdist.launch.processes import check_task_count
    from kerasdist.launch.script import ScriptCluster, dry_run, launch

    args.preemption_signal = _signal_name(args.preemption_signal)
    if args.max_restarts is not None and args.max_restarts < 0:
        raise ClusterError(f"--max-restarts must be >= 0. Received: --max-restarts {args.max_restarts}")
    if args.this_task:
        return _this_task(args)
    args.max_restarts = args.max_restarts or 0
    if args.ray:
        return _launch_on_ray(args)
    low, high = parse_worker_range(args.workers)
    check_task_count(high + args.ps + (1 if args.chief or args.ps else 0),
                     allowed=args.allow_oversubscription,
                     what=f"--workers {args.workers} --ps {args.ps}"
                          + (" --chief" if args.chief else ""),
                     flag="--allow-oversubscription")
    cluster = ScriptCluster(script=args.script, args=tuple(args.script_args),
                            workers=high, min_workers=low if low < high else None, ps=args.ps,
                            chief=args.chief, max_restarts=args.max_restarts,
                            log_dir=Path(args.log_dir), threads_per_task=args.threads_per_task,
                            task_timeout_s=args.task_timeout_s)
    if args.dry_run:
        print(dry_run(cluster))
        return EXIT_OK
    from kerasdist.launch import explain

    explain.RUN.update(logs=Path(args.log_dir), max_restarts=args.max_restarts)
    return launch(cluster, isolate=not args.allow_network_exposure and not isolated_here())


def _launch_on_ray(args) -> int:
    """``kerasdist launch --ray``: checks, then (a local Ray: in a private network namespace)
    :func:`kerasdist.launch.clusters.ray.launch_script`."""
    from kerasdist.errors import ClusterError
    from kerasdist.launch.clusters import ray as ray_kind

    for flag, value in (("--ps", args.ps), ("--chief", args.chief)):
        if value:
            raise ClusterError(f"{flag} cannot be used with --ray: Ray Train runs one group of "
                               f"identical workers (worker 0 is the chief). Received: {flag}="
                               f"{value}")
    from kerasdist.launch.isolation import isolated_here, run_command_isolated
    from kerasdist.launch.plan import parse_worker_range

    low, high = parse_worker_range(args.workers)
    for flag, value, low_ok in (("--cpus-per-worker", args.cpus_per_worker, False),
                                ("--gpus-per-worker", args.gpus_per_worker, True),
                                ("--resize-check-s", args.resize_check_s, False)):
        if not math.isfinite(value) or value < 0 or (value == 0 and not low_ok):
            raise ClusterError(f"--ray needs {flag} {'>= 0' if low_ok else '> 0'} (a finite "
                               f"number). Received: {flag} {value:g}")
    if not Path(args.script).is_file():
        raise ClusterError(f"script: no such file. Received: {args.script!r}")
    placement = ray_kind.RayPlacement(workers=high, cpus=args.cpus_per_worker,
                                     gpus=args.gpus_per_worker, address=args.ray_address,
                                     max_failures=args.max_restarts,
                                     min_workers=low if low < high else None,
                                     resize_check_s=args.resize_check_s)
    if args.dry_run:
        print(ray_kind.script_dry_run(args.script, list(args.script_args), placement,
                                     log_dir=Path(args.log_dir), threads=args.threads_per_task))
        return EXIT_OK
    ray_kind.require_ray()
    ray_kind.check_elastic_v2(placement, flag=f"--workers {args.workers}")
    ray_kind.check_address(args.ray_address)
    if args.ray_address is None and not args.allow_network_exposure and not isolated_here():
        return run_command_isolated(
            ["launch", "--ray", "--workers", str(args.workers), "--max-restarts",
             str(args.max_restarts), "--log-dir", str(Path(args.log_dir).resolve()),
             "--threads-per-task", str(args.threads_per_task), "--cpus-per-worker",
             str(args.cpus_per_worker), "--gpus-per-worker", str(args.gpus_per_worker),
             "--resize-check-s", str(args.resize_check_s),
             str(Path(args.script).resolve()), *args.script_args])
    ray_kind.launch_script(args.script, list(args.script_args), placement,
                          log_dir=Path(args.log_dir), threads=args.threads_per_task)
    return EXIT_OK


def _cmd_evaluate(args) -> int:
    from kerasdist.training.evaluator import Evaluator, wait_for_run

    if args.watch:
        wait_for_run(args.run_dir, poll_s=args.poll_s, timeout_s=args.idle_timeout_s)
    evaluator = Evaluator(args.run_dir, split=args.split)
    results = (evaluator.watch(poll_s=args.poll_s, idle_timeout_s=args.idle_timeout_s)
               if args.watch else [evaluator.once()])
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            shown = "  ".join(f"{k} {v:.4f}" for k, v in r.items() if isinstance(v, float))
            print(f"{r['checkpoint']:<14} step {r['global_step']:<8} {shown}")
    return EXIT_OK


def _cmd_env(args) -> int:
    from kerasdist import environment

    flags = None
    if any(getattr(args, name) is not None for name in
           ("job_name", "task_index", "ps_hosts", "worker_hosts", "chief_host")):
        flags = {"job_name": args.job_name or "worker", "task_index": args.task_index or 0,
                 "ps_hosts": args.ps_hosts or "", "worker_hosts": args.worker_hosts or "",
                 "chief_host": args.chief_host or ""}
    report = environment.collect(flags=flags)
    print(json.dumps(report, indent=2) if args.json else environment.format_text(report))
    return EXIT_OK if environment.cluster_ok(report) else EXIT_BAD_INPUT


COMMANDS = {"launch": _cmd_launch, "evaluate": _cmd_evaluate, "env": _cmd_env}

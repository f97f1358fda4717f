"""Drive the conformance matrix: the strategy-free reference, one cluster per strategy, verdicts.

:func:`run_matrix` runs, in this process, every case without a strategy (the reference, which
also fixes each case's initial weights); then starts each strategy's processes **once** -- one
process for ``default`` and ``mirrored`` (2 logical CPUs), 2 worker processes for
``multi_worker`` and 1 ps + 2 workers + the coordinator for ``parameter_server``, both through
``kerasdist launch`` (private network namespace, free ports, every process stopped at the end) --
which run all the cases in turn (:mod:`kerasdist.conformance.task`); finally it evaluates each
run's trained weights here, without a strategy, and judges every cell
(:mod:`kerasdist.conformance.oracle`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kerasdist._parent_death import session_ending_with
from kerasdist.conformance import data as cdata
from kerasdist.conformance import oracle, runner
from kerasdist.conformance.cases import Case, select
from kerasdist.keras.precision import policy_scope

STRATEGIES = ("default", "mirrored", "multi_worker", "parameter_server")
TASK_SCRIPT = Path(__file__).with_name("task.py")
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@dataclass
class Matrix:
    """Verdicts ``{case name: {strategy: Verdict}}`` plus run facts."""

    cases: list[Case]
    strategies: list[str]
    cells: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)

    def failures(self) -> list[tuple[str, str, str]]:
        """``(case, strategy, detail)`` of every cell that is neither pass nor refused."""
        return [(c, s, v.detail) for c, row in self.cells.items() for s, v in row.items()
                if v.status not in ("pass", "refused")]

    def as_dict(self) -> dict:
        return {"strategies": self.strategies, "seconds": self.seconds,
                "cells": {c: {s: v.as_dict() for s, v in row.items()}
                          for c, row in self.cells.items()}}


def run_reference(cases: list[Case], folder: Path) -> dict:
    """Run every case strategy-free here; save initial weights under ``folder/initial``."""
    results = {}
    for case in cases:
        try:
            result = runner.run_case(case, None, workdir=folder / "work" / "reference" / case.name)
        except Exception as err:  # noqa: BLE001 - a reference failure is a harness bug: shown
            raise RuntimeError(f"conformance case '{case.name}' fails without any strategy: "
                               f"{err}") from err
        runner.save({"initial_weights": result["initial_weights"]}, folder / "initial",
                     case.name, "initial")
        runner.save(result, folder / "results" / "reference", case.name, "main")
        results[case.name] = result
    return results


def _command(strategy: str, plan_path: Path, log_dir: Path, *, allow_exposure: bool) -> list[str]:
    from kerasdist.strategies import get

    traits = get(strategy).traits
    direct = [sys.executable, str(TASK_SCRIPT), str(plan_path)]
    if traits.topology == "single":  # this process is the whole job
        return direct
    launch = [sys.executable, "-m", "kerasdist", "launch", "--workers", "2", "--threads-per-task",
              "1", "--log-dir", str(log_dir)]
    if traits.needs_ps:
        launch += ["--ps", "1"]
    if allow_exposure:
        launch.append("--allow-network-exposure")
    return launch + [str(TASK_SCRIPT), str(plan_path)]


@dataclass
class StrategyRun:
    """A strategy's processes, started by :func:`start_strategy` and running every case.

    Attributes:
        strategy: the strategy name.
        proc: the top process (the task script, or ``kerasdist launch``), in a session of its own.
        log: file holding its stdout and stderr.
        started: ``time.perf_counter()`` at start (s).
        deadline: ``time.perf_counter()`` value after which it is stopped (s).
    """

    strategy: str
    proc: subprocess.Popen
    log: Path
    started: float
    deadline: float


def start_strategy(strategy: str, cases: list[Case], folder: Path, *, timeout_s: float,
                   allow_exposure: bool = False) -> StrategyRun:
    """Start the strategy's processes once, in the background; they run every case.

    Several strategies may run at once (they share nothing but the reference's initial weights,
    which must exist: run :func:`run_reference` first); the processes spend most of their time
    in single-threaded Python (tracing, Keras's loops), so running them together costs little.
    """
    out = folder / "results" / strategy
    plan = {"strategy": strategy, "cases": [c.name for c in cases], "out": str(out),
            "workdir": str(folder / "work" / strategy), "initial": str(folder / "initial")}
    plan_path = folder / f"plan-{strategy}.json"
    plan_path.write_text(json.dumps(plan))
    command = _command(strategy, plan_path, folder / "logs" / strategy,
                       allow_exposure=allow_exposure)
    log = folder / f"output-{strategy}.log"
    # its own process group (what stop_strategies signals), SIGTERM when this process ends
    # however it ends: kerasdist launch then stops its tasks, a task script ends, and a killed
    # kerasdist conformance leaves no strategy process running
    with open(log, "wb") as sink:  # a file, not a pipe: nobody must drain it while others run
        proc = subprocess.Popen(command, env={**os.environ, **QUIET}, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(folder), preexec_fn=session_ending_with(os.getpid()))
    now = time.perf_counter()
    return StrategyRun(strategy, proc, log, now, now + timeout_s)


def finish_strategy(run: StrategyRun) -> tuple[float, str]:
    """Wait for a started strategy (stopping it at its deadline). Returns (seconds, output tail).

    A run past its deadline gets SIGTERM (``kerasdist launch`` stops its tasks), then SIGKILL
    for its whole process group 30 s later; its output then begins with "timed out".
    """
    try:
        run.proc.wait(timeout=max(0.0, run.deadline - time.perf_counter()))
        prefix = ""
    except subprocess.TimeoutExpired:
        stop_strategies([run])
        prefix = f"timed out after {run.deadline - run.started:.0f} s\n"
    seconds = time.perf_counter() - run.started
    output = run.log.read_bytes()[-20000:].decode("utf-8", "replace")
    return seconds, prefix + output


STOP_GRACE_S = 30.0
"""Seconds a strategy's processes get after SIGTERM (``kerasdist launch`` stops its tasks)
before SIGKILL."""


def stop_strategies(runs: list[StrategyRun], grace_s: float = STOP_GRACE_S) -> None:
    """Stop every run still running, all at once: SIGTERM to each run's process group, then
    SIGKILL to those still there ``grace_s`` seconds later; returns when every top process has
    been reaped."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        live = [run for run in runs if run.proc.poll() is None]
        for run in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.proc.pid, sig)
        deadline = time.monotonic() + wait_s
        for run in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))


def _tasks(folder: Path, case: str) -> dict:
    results = {}
    for meta in sorted(folder.glob(f"{case}.*.json")):
        task = meta.name[len(case) + 1:-len(".json")]
        results[task] = runner.load(folder, case, task)
    return results


def same_weights(case: Case, weights: list) -> tuple[dict, object]:
    """Strategy-free evaluate/predict of ``weights`` on the case's data; also the model."""
    import keras

    keras.utils.set_random_seed(runner.SEED)
    data = cdata.make(case.data, examples=case.examples)
    with policy_scope(case.precision):
        model = runner.build_model(case, data)
        model.set_weights(weights)
        e_args, e_kwargs = runner.eval_input(case, data)
        evaluation = model.evaluate(*e_args, verbose=0, return_dict=True, **e_kwargs)
        p_args, p_kwargs = runner.predict_input(case, data)
        predictions = model.predict(*p_args, verbose=0, **p_kwargs)
    return ({"evaluation": {k: float(v) for k, v in evaluation.items()},
             "predict": runner._flatten_predictions(predictions)}, model)


def judge_case(case: Case, strategy: str, folder: Path, reference: dict,
               initial_loss: dict) -> oracle.Verdict:
    results = _tasks(folder / "results" / strategy, case.name)
    if not results:
        return oracle.Verdict("not_run", "the strategy's processes wrote no result")
    chief = results.get("main") or results.get("worker-0")
    problems, evaluated = [], {"evaluation": {}, "predict": []}
    if chief and chief.get("status") == "ok":
        evaluated, _ = same_weights(case, chief["weights"])
        if case.check is not None:
            data = cdata.make(case.data, examples=case.examples)
            try:  # a check that raises is the cell's finding, not the end of the matrix
                problems = case.check(folder / "work" / strategy / case.name, chief,
                                      lambda: runner.build_model(case, data))
            except Exception as err:  # noqa: BLE001
                problems = [f"the case's check of what it wrote raised {type(err).__name__}: "
                            f"{str(err).strip()[:300]}"]
    return oracle.judge(case, strategy, results, reference[case.name], evaluated,
                        initial_loss.get(case.name), problems)


def run_matrix(*, strategies=STRATEGIES, case_names=(), folder: Path, timeout_s: float = 1500,
               allow_exposure: bool = False, parallel: bool = True, progress=print) -> Matrix:
    """Run the matrix (module docs) in ``folder`` (created; results, logs, callback outputs).

    Args:
        strategies: strategy names, a subset of :data:`STRATEGIES`.
        case_names: case names; empty = every case.
        folder: working folder.
        timeout_s: per strategy, from its start (s).
        allow_exposure: run clusters without a private network namespace.
        parallel: start every strategy's processes at once after the reference (default);
            False runs them one after another (less memory, easier to read logs).
        progress: called with one line per finished stage.

    Returns:
        The :class:`Matrix` of verdicts.
    """
    cases = select(list(case_names))
    folder.mkdir(parents=True, exist_ok=True)
    matrix = Matrix(cases, list(strategies))
    start = time.perf_counter()
    reference = run_reference(cases, folder)
    initial_loss = {c.name: same_weights(c, reference[c.name]["initial_weights"])[0][
        "evaluation"].get("loss") for c in cases}
    matrix.seconds["reference"] = time.perf_counter() - start
    progress(f"reference: {len(cases)} cases in {matrix.seconds['reference']:.0f} s")
    started = []
    try:
        for strategy in strategies:  # all at once when parallel; else each after the last
            started.append(start_strategy(strategy, cases, folder, timeout_s=timeout_s,
                                          allow_exposure=allow_exposure))
            if not parallel:
                _judge_strategy(matrix, started[-1], folder, reference, initial_loss, progress)
        if parallel:
            for run in started:
                _judge_strategy(matrix, run, folder, reference, initial_loss, progress)
    finally:
        stop_strategies(started)
    return matrix


def _judge_strategy(matrix: Matrix, run: StrategyRun, folder: Path, reference: dict,
                    initial_loss: dict, progress) -> None:
    """Wait for one strategy's run and judge its cells into ``matrix``."""
    strategy, cases = run.strategy, matrix.cases
    seconds, output = finish_strategy(run)
    matrix.seconds[strategy] = seconds
    matrix.logs[strategy] = output
    start = time.perf_counter()
    for case in cases:
        matrix.cells.setdefault(case.name, {})[strategy] = judge_case(
            case, strategy, folder, reference, initial_loss)
    passed = sum(matrix.cells[c.name][strategy].status == "pass" for c in cases)
    progress(f"{strategy}: {passed}/{len(cases)} pass, run {seconds:.0f} s, judged in "
             f"{time.perf_counter() - start:.0f} s")

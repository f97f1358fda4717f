"""The sweep driver: one process, one thread, the only one that talks to Optuna.

It keeps up to ``parallel`` trials running, each a whole ``kerasdist fit`` (:mod:`.backends`),
answers their epoch-end gates (:mod:`.gate`: report the value, ask the pruner, write the
decision), and records each trial's end in the study: COMPLETE with the objective, PRUNED, or
FAIL with the tail of its log. It holds ``<output.dir>/.sweep.lock`` while it runs and marks the
study as its own (:func:`kerasdist.sweep.storage.mark_driver`, refused while another live driver's
mark is there), so a trial left RUNNING in the storage when it starts was interrupted (its driver
is gone) and is resumed: same number, same folder, same parameters, from its own checkpoint.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from kerasdist._log import get_logger
from kerasdist.errors import EXIT_FAILED, EXIT_OK, RunDirError
from kerasdist.sweep import gate, hparams
from kerasdist.sweep.plan import SweepPlan
from kerasdist.sweep.storage import HEARTBEAT_S, TrialBook, check_start, mark_driver, unmark_driver
from kerasdist.sweep.study import require_optuna, run_dir, suggest, trial_dir, trial_recipe

log = get_logger("sweep")
POLL_S = 0.5


@dataclass
class Running:
    """A trial the driver runs: its Optuna number, folder, process, what its gate said."""

    number: int
    folder: Path
    proc: Any
    started: float
    epoch: int = 0
    pruned_at: int | None = None
    timed_out: bool = False
    values: dict[int, float] = field(default_factory=dict)


@contextlib.contextmanager
def sweep_lock(folder: Path):
    """Hold ``<folder>/.sweep.lock`` (``flock``) for the block.

    Raises:
        RunDirError: another live driver holds it (exit code 2), naming its pid.
    """
    import fcntl
    import os

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".sweep.lock"
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise RunDirError(f"output.dir: another kerasdist sweep (pid {handle.read().strip() or '?'}) "
                              f"is running this sweep. Received: dir='{folder}'") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


def _states():
    optuna = require_optuna()
    return optuna.trial.TrialState


def counts(study) -> dict[str, int]:
    """Trials by state name (``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING``...)."""
    return dict(collections.Counter(t.state.name for t in study.get_trials(deepcopy=False)))


class Driver:
    """Run a checked sweep to its end (see module docs).

    Args:
        plan: the checked sweep (:func:`kerasdist.sweep.plan.load_sweep`).
        echo: where one line per trial event goes (default ``print``).
        backend_start: starts a trial (default :func:`kerasdist.sweep.backends.start_trial`).
    """

    def __init__(self, plan: SweepPlan, *, echo: Callable[[str], None] = print,
                 backend_start: Callable[..., Any] | None = None):
        from kerasdist.sweep.backends import start_trial

        self.plan, self.config, self.echo = plan, plan.config, echo
        self.start_trial = backend_start or start_trial
        self.running: dict[int, Running] = {}
        self.study = None
        self.book: TrialBook | None = None
        self.tracker = None
        self.stops = None

    # ------------------------------------------------------------------------------ the loop
    def run(self) -> int:
        """Run until ``trials`` trials are COMPLETE or PRUNED; returns the exit code: 0, or 1
        when more than ``max_failed_trials`` failed. Ctrl-C / SIGTERM stop every trial (each saves
        its checkpoint) and leave them RUNNING in the storage: a re-run resumes them.

        Raises:
            RecipeError, RunDirError: the storage, the study or the lock (exit code 2), before
                any trial starts.
        """
        from kerasdist._signals import stop_requests

        check_start(self.plan)  # before the lock: nothing is written on bad input
        with contextlib.ExitStack() as stack:
            stack.enter_context(sweep_lock(self.plan.out))
            self.stops = stack.enter_context(stop_requests())
            self.book = TrialBook.open(self.plan)
            self.study = self.book.study
            mark_driver(self.plan, self.study)
            stack.callback(unmark_driver, self.plan)
            if self.config.backend == "ray":
                from kerasdist.sweep import ray_backend

                ray_backend.connect(address=self.config.ray_address,
                                    cores_per_trial=self.plan.cores_per_trial,
                                    parallel=self.config.parallel,
                                    oversubscribe=self.config.allow_oversubscription)
                stack.callback(ray_backend.shutdown)
            from kerasdist.sweep import tracking

            self.tracker = tracking.start(self.plan, self.study)
            hparams.write_new(self.plan, self.study)  # a trial told just before a kill
            interrupted = [t for t in self.study.get_trials(deepcopy=False)
                           if t.state == _states().RUNNING]
            if interrupted:
                self.echo(f"kerasdist sweep: resuming {len(interrupted)} interrupted trial(s): "
                          f"{', '.join(str(t.number) for t in interrupted)}")
            try:
                code = self._loop(interrupted)
                self.stops.check()
            except BaseException:
                self._stop_all()
                raise
            from kerasdist.sweep.outputs import write_outputs

            write_outputs(self.plan, self.study, echo=self.echo)
            if self.tracker is not None:
                self.tracker.finish(self.study, failed=code != EXIT_OK)
            return code

    def _loop(self, interrupted: list) -> int:
        pending = list(interrupted)
        beat = time.monotonic()
        while True:
            self.stops.check()
            if time.monotonic() - beat >= HEARTBEAT_S:
                mark_driver(self.plan, self.study)
                beat = time.monotonic()
            for run in list(self.running.values()):
                self._answer_gate(run)
                self._check_timeout(run)
                code = run.proc.poll()
                if code is not None:
                    self._answer_gate(run)  # a value written just before it ended
                    del self.running[run.number]
                    self._finish(run, code)
            done = counts(self.study)
            finished = done.get("COMPLETE", 0) + done.get("PRUNED", 0)
            if done.get("FAIL", 0) > self.config.max_failed_trials:
                self.echo(f"kerasdist sweep: {done['FAIL']} trials failed (max_failed_trials="
                          f"{self.config.max_failed_trials}); stopping the sweep")
                self._stop_all()
                return EXIT_FAILED
            while len(self.running) < self.config.parallel and (
                    pending or finished + len(self.running) < self.config.trials):
                if pending:
                    frozen = pending.pop(0)
                    self._start(frozen.number, dict(frozen.params), resumed=True)
                else:
                    trial = self.study.ask()
                    self._start(trial.number, suggest(trial, self.config))
            if not self.running and finished >= self.config.trials:
                return EXIT_OK
            time.sleep(POLL_S)

    # ------------------------------------------------------------------------------ a trial
    def _start(self, number: int, params: dict[str, Any], *, resumed=False) -> None:
        folder = trial_dir(self.plan, number)
        folder.mkdir(parents=True, exist_ok=True)
        recipe = folder / "recipe.yaml"
        if not recipe.is_file():  # a resumed trial keeps the recipe it started with
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            header = f"# kerasdist sweep {self.config.output.study}, trial {number}: {shown}\n"
            raw = trial_recipe(self.plan, number, params)
            temp = recipe.with_suffix(".yaml.tmp")
            temp.write_text(header + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
            temp.replace(recipe)
        self.book.set_user_attr(number, "dir", str(folder))
        gate.stopped_path(folder / "gate").unlink(missing_ok=True)  # left by a stopped driver
        proc = self.start_trial(self.config.backend, recipe=recipe, log=folder / "trial.log",
                                cores=self.plan.cores_per_trial)
        run = Running(number=number, folder=folder, proc=proc,
                      started=time.monotonic())
        self.running[number] = run
        what = "resumed" if resumed else "started"
        self.echo(f"kerasdist sweep: trial {number} {what} in {folder} "
                  f"({', '.join(f'{k}={v!r}' for k, v in params.items())})")
        if self.tracker is not None:
            self.tracker.trial_started(number, params)

    def _answer_gate(self, run: Running) -> None:
        """Report every new epoch value of ``run`` and write its decision."""
        gate_dir = run.folder / "gate"
        while True:
            number = run.epoch + 1
            path = gate.value_path(gate_dir, number)
            if not path.exists():
                return
            data = json.loads(path.read_text(encoding="utf-8"))
            value = data.get("value")
            run.epoch = number
            decided = gate.decision_path(gate_dir, number)
            if decided.exists():  # answered before the driver was interrupted: it stands
                if decided.read_text(encoding="utf-8").strip() == gate.PRUNE:
                    run.pruned_at = number
                continue
            prune = value is None
            if value is not None:
                run.values[number] = value
                self.book.report(run.number, number, value)  # kept if reported before a restart
                prune = self.config.pruner.name != "none" and self.book.should_prune(run.number)
            if self.config.pruner.name != "none":
                gate.write_atomic(gate.decision_path(gate_dir, number),
                                  gate.PRUNE if prune else gate.CONTINUE)
                if prune:
                    run.pruned_at = number
                    self.echo(f"kerasdist sweep: trial {run.number} pruned after epoch {number} "
                              f"({self.config.objective.metric}={value})")

    def _check_timeout(self, run: Running) -> None:
        if not run.timed_out and time.monotonic() - run.started > self.config.trial_timeout_s:
            run.timed_out = True
            self.echo(f"kerasdist sweep: trial {run.number} ran past trial_timeout_s="
                      f"{self.config.trial_timeout_s:g}; stopping it")
            run.proc.stop()

    def _finish(self, run: Running, code: int) -> None:
        states = _states()
        if run.pruned_at is None:
            run.pruned_at = _pruned_before(run.folder)
        value, why = self._objective(run) if code == 0 else (None, _failure(run, code))
        trial = run.number
        if code == 0 and run.pruned_at is not None:
            self.study.tell(trial, state=states.PRUNED)
            state = "PRUNED"
        elif value is not None:
            self.study.tell(trial, value)
            state = "COMPLETE"
        else:
            self.book.set_user_attr(trial, "failure", why)
            self.book.set_user_attr(trial, "log", str(run.folder / "trial.log"))
            self.study.tell(trial, state=states.FAIL)
            state = "FAIL"
        tail = f": {why}" if state == "FAIL" else (f" ({self.config.objective.metric}={value:.6g})"
                                                    if value is not None else "")
        self.echo(f"kerasdist sweep: trial {trial} {state}{tail}")
        if self.tracker is not None:
            self.tracker.trial_finished(trial, state=state, value=value)
        hparams.write_new(self.plan, self.study)

    def _objective(self, run: Running) -> tuple[float | None, str]:
        """The objective of a finished trial: its last epoch's value (``metrics.json``, else the
        gate's last value file)."""
        metric = self.config.objective.metric
        metrics = run_dir(run.folder) / "metrics.json"
        values = []
        if metrics.is_file():
            values = json.loads(metrics.read_text(encoding="utf-8")).get("history", {}).get(metric, [])
        value = values[-1] if values else (run.values[max(run.values)] if run.values else
                                           _last_gate_value(run.folder))
        if value is None or not math.isfinite(value):
            return None, (f"objective.metric '{metric}' has no finite value in {metrics}. "
                          f"Received: {value!r}")
        return float(value), ""

    def _stop_all(self) -> None:
        for run in self.running.values():
            run.proc.stop()
            gate.write_atomic(gate.stopped_path(run.folder / "gate"), "")  # nobody waits
        for run in self.running.values():
            run.proc.wait()
        if self.running:
            self.echo(f"kerasdist sweep: stopped trial(s) {', '.join(map(str, self.running))}; "
                      "they stay RUNNING in the study and resume when the sweep is run again")


def _pruned_before(folder: Path) -> int | None:
    """The epoch whose decision file says ``prune`` (a trial that ended while the driver was
    away), or None."""
    for path in sorted((folder / "gate").glob("epoch-*.decision")):
        if path.read_text(encoding="utf-8").strip() == gate.PRUNE:
            return int(path.name.split("-")[1].split(".")[0])
    return None


def _last_gate_value(folder: Path) -> float | None:
    paths = sorted((folder / "gate").glob("epoch-*.value.json"))
    return json.loads(paths[-1].read_text(encoding="utf-8")).get("value") if paths else None


def _failure(run: Running, code: int) -> str:
    """Why a trial failed: its exit and the last ``kerasdist: failed:`` (or ``kerasdist: error:``,
    bad input) line of its log, the error the trial's command ended with."""
    from kerasdist.launch.processes import describe_exit

    what = f"past trial_timeout_s, stopped; {describe_exit(code)}" if run.timed_out else \
        f"kerasdist fit {describe_exit(code)}"
    try:
        lines = (run.folder / "trial.log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    said = [line.strip() for line in lines[-200:]
            if "kerasdist: failed: " in line or "kerasdist: error: " in line]
    return f"{what}; {said[-1]}" if said else what

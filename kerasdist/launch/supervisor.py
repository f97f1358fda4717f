"""One supervisor for every local cluster kerasdist starts: one monitor loop over task states, one
restart budget, one failure channel (each task's status file, :mod:`kerasdist.launch.status`, never
its log); what to run comes in as a :class:`LaunchSpec`.

An **attempt** starts the tasks of :attr:`LaunchSpec.plan` (servers first, then the members):
every *member* exiting 0 succeeds it; a failed member or a dead ps fails it (the others get
:attr:`LaunchSpec.survivor_grace_s` to fail on their own, then every task is stopped). A dead
*server* worker is restarted alone on its address while the budget lasts; a body that cannot go
on without it (TF's ``ClusterCoordinator`` waits until every worker is back) is interrupted, its
tasks stopped after :data:`BODY_STOP_S`, and abandoned after :data:`BODY_ABANDON_S` more. SIGINT
or SIGTERM asks every task to save and stop, then raises ``KeyboardInterrupt``. After a failed
attempt: :func:`kerasdist.launch.retry.next_attempt` (fail, restart, or go on with fewer workers).
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
import time
from typing import Any, Callable

from kerasdist._log import get_logger
from kerasdist._signals import StopRequests, stop_requests, terminate_on_sigterm
from kerasdist._timeline import mark
from kerasdist.cluster.spec import TFConfig, check_ports_free
from kerasdist.cluster.watch import HangWatch
from kerasdist.errors import EXIT_INTERRUPTED, RETRYABLE, TaskFailedError
from kerasdist.launch import forking, status
from kerasdist.launch.echo import Echo
from kerasdist.launch.plan import (
    AttemptRecord,
    Failure,
    LaunchSpec,
    TaskPlan,
    TaskState,
    stop_line,
    why,
)
from kerasdist.launch.processes import LocalLauncher, Task, describe_exit, network_note
from kerasdist.launch.retry import next_attempt

log = get_logger("launch")

BODY_STOP_S = 20.0
"""Seconds a body (a parameter-server coordinator) gets to end its run after a task it cannot
go on without was lost and it was interrupted; then every task is stopped."""

BODY_ABANDON_S = 20.0
"""Seconds a body still gets after every task was stopped; then it is abandoned
(:attr:`LaunchSpec.abandon`: by default the failure is reported and the process ends, exit 1)."""


class Supervisor:
    """Run a :class:`LaunchSpec` to its end (see the module docs). Read after :meth:`run`:
    ``attempts`` (:class:`AttemptRecord` each), ``restarted``, ``left`` and ``restarts_left``."""

    def __init__(self, spec: LaunchSpec):
        self.spec = spec
        self.restarts_left = spec.max_restarts
        self.attempts: list[AttemptRecord] = []
        self.restarted: list[str] = []
        self.ended_run: str | None = None  # why the monitor ended the body's run
        self.left: list[str] = []  # server workers the body went on without, by name
        self._states: dict[int, TaskState] = {}
        self._members: list[Task] = []
        self._servers: list[Task] = []
        self._plans: dict[str, TaskPlan] = {}
        self._launcher: LocalLauncher | None = None
        self._echo: Echo | None = None
        self._hang = HangWatch(spec.hang_timeout_s)

    # -------------------------------------------------------------------------------- the run
    def run(self, body: Callable[[TFConfig], Any] | None = None) -> Any:
        """Run attempts until one succeeds, a failure is not retryable, or neither the budget
        nor ``min_workers`` allows another. With ``body`` (the coordinator of a parameter-server
        run), the attempt's members are replaced by ``body(tf_config)`` run here, once (the
        :class:`TFConfig` of the attempt's first task: ``for_task`` gives the body's role): its
        return value is returned, its exception raised.

        Raises:
            ClusterError (or the task's own bad-input class): a task refused its input, a port was
                taken, a server did not start (names it; exit code 2).
            TrainingError: a task failed deterministically (names it; its own message).
            TaskFailedError: a task was lost and the run cannot go on (names it, how it ended).
            KeyboardInterrupt: SIGINT/SIGTERM; every task was asked to save and stop first.
        """
        spec = self.spec
        workers = spec.workers
        previous_lost: set[str] = set()
        while True:
            if spec.check_workers is not None:
                spec.check_workers(workers)
            record = AttemptRecord(workers=workers)
            self.attempts.append(record)
            number = len(self.attempts)
            if body is not None:
                return self._attempt(number, workers, body, record)
            failure = self._attempt(number, workers, None, record)
            if failure is None:
                record.ended = "succeeded"
                return None
            record.ended = failure.first_line
            label = (f"attempt {number}/{spec.max_restarts + 1}" if number <= spec.max_restarts + 1
                     else f"attempt {number}")
            log.warning(f"{label} failed: {failure.report}")
            nxt = next_attempt(failure, workers=workers, full=spec.workers, fewest=spec.fewest,
                               restarts_left=self.restarts_left, previous_lost=previous_lost,
                               number=number, what=spec.what)
            previous_lost = set(failure.lost)
            self.restarts_left -= 1 if nxt.restart else 0
            workers = nxt.workers
            log.warning(nxt.message)

    # ---------------------------------------------------------------------------- one attempt
    def _attempt(self, number: int, workers: int, body, record: AttemptRecord):
        spec = self.spec
        plans = spec.plan(workers, number)
        if plans:
            check_ports_free(plans[0].tf_config)
        self._plans = {plan.name: plan for plan in plans}
        self._states, self._members, self._servers = {}, [], []
        with LocalLauncher(log_dir=spec.log_dir, threads_per_task=spec.threads_per_task) as \
                launcher, terminate_on_sigterm(), Echo() if spec.echo else contextlib.nullcontext() as echo:
            self._launcher, self._echo = launcher, echo
            servers = [self._start(p) for p in plans if p.server]
            if servers:
                launcher.wait_listening(servers, timeout_s=spec.start_timeout_s)
            members = [self._start(p) for p in plans if not p.server]
            forking.spend()  # restarts, and tasks started after a body began, are new processes
            log.info(f"local cluster, attempt {number}: {len(servers)} server(s), "
                     f"{len(members)} member task(s), {workers} worker(s) ({network_note()}); "
                     f"logs in {spec.log_dir}")
            try:
                if body is not None:
                    return self._run_body(body, plans[0].tf_config, record)
                with stop_requests() as stops:
                    first = self._watch(stops)
            except KeyboardInterrupt:
                log.warning(f"interrupted: every task saves a checkpoint and stops (up to "
                            f"{spec.stop_grace_s:.0f} s)")
                record.ended = "interrupted"
                self._stop_all(spec.stop_grace_s, hung=self._hung_before_stop())
                raise
            if first is None:
                return None
            self._wait_for_survivors(min(spec.survivor_grace_s, 60.0))
            failure = self._describe(self._root_cause(first))
            self._stop_all(5.0)
            return failure

    def _start(self, plan: TaskPlan) -> Task:
        mark(f"spawn {plan.name}")
        task = self._launcher.start_process(plan.name, list(plan.argv), tf_config=plan.tf_config,
                                            env={**self.spec.task_env,
                                                 "TF_CONFIG": plan.tf_config.to_json()})
        self._states[id(task)] = TaskState.RUNNING
        (self._servers if plan.server else self._members).append(task)
        if self._echo is not None:
            self._echo.add(task)
        return task

    def _live(self) -> list[Task]:
        return [t for t in self._launcher.tasks if self._states.get(id(t)) is TaskState.RUNNING]

    def _watch(self, stops: StopRequests) -> Task | None:
        """The monitor loop of an attempt without a body: None when every member exited 0, else
        the first failed task (one killed by a signal first). A SIGINT/SIGTERM recorded in
        ``stops`` is raised at the top of each poll.

        Each poll reads every task's exit code **once** (:meth:`_poll`): a member exiting 0
        between two reads would otherwise make a finished cluster count as failed."""
        while True:
            stops.check()
            self._kill_hung()
            codes = self._poll()
            for task, code in codes:
                if code == 0 and task in self._members:
                    self._states[id(task)] = TaskState.SUCCEEDED
            if self._members and all(self._states[id(t)] is TaskState.SUCCEEDED
                                     for t in self._members):
                return None
            down = [(t, c) for t, c in codes if c is not None
                    and self._states[id(t)] is TaskState.RUNNING]
            down = [(t, c) for t, c in down
                    if not self._server_worker_down(t) and not self._spare_left(t)]
            if down:
                for task, _ in down:
                    self._states[id(task)] = TaskState.FAILED
                order = self._launcher.tasks.index
                return min(down, key=lambda tc: (tc[1] >= 0, order(tc[0])))[0]
            time.sleep(0.2)

    def _poll(self) -> list[tuple[Task, int | None]]:
        """``(task, exit code or None)`` of every running task, each read once."""
        return [(task, task.returncode()) for task in self._live()]

    def _server_worker_down(self, task: Task) -> bool:
        """A dead server worker: restarted alone while the budget lasts. True when handled (the
        attempt goes on); beyond the budget False: the coordinator cannot go on without it (see
        the module docs)."""
        if task not in self._servers or task.tf_config.task_type != "worker":
            return False
        if self.restarts_left <= 0:
            return False
        self.restarts_left -= 1
        self._states[id(task)] = TaskState.RESTARTED
        self.restarted.append(task.name)
        log.warning(f"task {task.name} {describe_exit(task.returncode())}; restarting it "
                    f"({len(self.restarted)}/{self.spec.max_restarts})")
        self._start(self._plans[task.name])
        return True

    def _spare_left(self, task: Task) -> bool:
        """A lost server worker the coordinator goes on without (:attr:`LaunchSpec.spare_workers`),
        no restart being left for it: True after marking it lost for good, one line."""
        if (task not in self._servers or task.tf_config.task_type != "worker"
                or len(self.left) >= self.spec.spare_workers):
            return False
        self._states[id(task)] = TaskState.FAILED
        self.left.append(task.name)
        log.warning(f"{why(task, self._hang.hung)} and no restart is left; the run goes on without "
                    f"it ({len(self.left)}/{self.spec.spare_workers} backup workers lost)")
        return True

    def _run_body(self, body, cluster: TFConfig, record: AttemptRecord):
        """Run ``body`` here while a monitor thread restarts server workers; a dead ps task or a
        worker lost with no restart left ends the body's run (SIGINT to this thread, then its
        tasks are stopped after :data:`BODY_STOP_S`)."""
        done = threading.Event()
        monitor = threading.Thread(target=self._watch_servers, args=(done,), daemon=True,
                                   name="kerasdist-supervisor")
        monitor.start()
        try:
            result = body(cluster)
        except BaseException as err:
            done.set()
            monitor.join(timeout=5)
            ended = self.ended_run or self._dead_ps()
            if ended:
                record.ended = ended
                self._stop_all(5.0)
                raise TaskFailedError(f"{ended}; training stopped ({type(err).__name__})") from None
            raise
        finally:
            done.set()
        monitor.join(timeout=5)
        record.ended = "succeeded"
        return result

    def _kill_hung(self) -> None:
        """Kill the server tasks that have not answered for ``hang_timeout_s``
        (:class:`kerasdist.cluster.watch.HangWatch`): from then on they are lost tasks like any other."""
        for task, silent_s in self._hang.overdue([t for t in self._live() if t in self._servers]):
            self._hang.kill(task, silent_s)

    def _hung_before_stop(self) -> list[Task]:
        """Before a stop: the server tasks that do not answer now, killed once the members have
        stopped (:meth:`_stop_all`), so the coordinator first saves at the step the ps holds
        without their calls in flight (:mod:`kerasdist._compat.tf_frozen_task`)."""
        if self.spec.hang_timeout_s is None:
            return []
        hung = self._hang.hung_now([t for t in self._live() if t in self._servers])
        for task in hung:
            log.warning(f"task {task.name} does not answer: the coordinator stops without its "
                        "steps in flight, then it is killed")
        return hung

    def _watch_servers(self, done: threading.Event) -> None:
        while not done.wait(0.5):
            self._kill_hung()
            for task in self._live():
                if task.returncode() is None or self._server_worker_down(task):
                    continue
                if self._spare_left(task):
                    continue
                self._states[id(task)] = TaskState.FAILED
                how = why(task, self._hang.hung)[len(f"task {task.name} "):]
                if task.tf_config.task_type == "worker":
                    self.ended_run = (f"task {task.name} {how} and no "
                                      "restart is left; the coordinator cannot go on without one "
                                      "of its workers")
                else:
                    self.ended_run = f"parameter server {task.name} died" if \
                        task.name not in self._hang.hung else f"parameter server {task.name} {how}"
                log.warning(f"{self.ended_run}: the run stops")
                if self.spec.interrupt_body:
                    _thread.interrupt_main(signal.SIGINT)
                if not done.wait(BODY_STOP_S):
                    # TF's coordinator waits for the lost task to come back: stopping every task
                    # makes its pending remote calls fail, so the body's run ends
                    log.warning(f"the coordinator did not stop within {BODY_STOP_S:.0f} s: "
                                "stopping every task")
                    for other in self._live():
                        self._states[id(other)] = TaskState.STOPPED
                    self._launcher.stop_all(grace_s=5.0)
                    if not done.wait(BODY_ABANDON_S):
                        self._abandon_body()
                return

    def _abandon_body(self) -> None:
        """The body stayed blocked after every task was stopped: hand the failure to
        :attr:`LaunchSpec.abandon` (by default the process reports it and ends here)."""
        err = TaskFailedError(f"{self.ended_run}; training stopped (the coordinator stayed "
                              f"blocked in TensorFlow {BODY_ABANDON_S:.0f} s after every task "
                              "was stopped)")
        log.warning(f"the coordinator is still blocked {BODY_ABANDON_S:.0f} s after every task "
                    "was stopped: ending the run without it")
        self._stop_all(5.0)
        self.spec.abandon(err)

    def _dead_ps(self, grace_s: float = 5.0) -> str | None:
        """'parameter server ps:0 died' when a ps task has exited (waits up to ``grace_s``: the
        coordinator can notice a lost ps before its process has been reaped)."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = [t.name for t in self._launcher.tasks
                    if t.tf_config.task_type == "ps" and t.returncode() is not None]
            if dead:
                return f"parameter server {', '.join(dead)} died"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    # ------------------------------------------------------------------------------ stopping
    def _wait_for_survivors(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(t.returncode() is None for t in self._live()):
            time.sleep(0.2)

    def _stop_all(self, grace_s: float, hung: list[Task] = ()) -> None:
        """Stop every task, members first (a coordinator task saves through its ps servers), then
        the ``hung`` ones (SIGKILL), then the others; one line per task saying how it ended."""
        for task in self._live():
            if task.returncode() is None:
                self._states[id(task)] = TaskState.STOPPED
        for task in self._members:
            self._launcher.stop(task, grace_s=grace_s)
        for task in hung:  # a stopped process would not act on SIGTERM
            self._hang.kill(task, None)
        self._launcher.stop_all(grace_s=grace_s)
        tasks = [t for t in self._launcher.tasks
                 if self._states.get(id(t)) is not TaskState.RESTARTED]
        log.warning("the cluster stopped:\n" + "\n".join(
            stop_line(t, self._states.get(id(t), TaskState.STOPPED)) for t in tasks))
        if self.spec.after_stop is not None:
            self.spec.after_stop(list(self._launcher.tasks))

    def _root_cause(self, first: Task) -> Task:
        """The task whose failure caused the others': one that failed on its own (class ``fatal``
        or ``bad_input``, e.g. the worker whose shard holds a bad label) before the peers that
        merely lost it; else the first task that failed."""
        own = [t for t in self._launcher.tasks if t.returncode() not in (None, 0)
               and status.failure_class(t.status_path) not in RETRYABLE]
        return own[0] if own else first

    def _describe(self, first: Task) -> Failure:
        others = [t for t in self._launcher.tasks if t is not first
                  and t.returncode() not in (None, 0)
                  and self._states.get(id(t)) is not TaskState.RESTARTED]
        hung = self._hang.hung
        lines = [why(first, hung)] + [f"then {why(t, hung)}" for t in others]
        report = "; ".join(lines) + f"; log {first.log_path}\n{self._launcher.tail(first)}"
        reported = status.read(first.status_path) or {}
        killed, reported_lost = set(), set()
        for task in [first, *others]:
            got = status.read(task.status_path)
            if got is None and task.returncode() != EXIT_INTERRUPTED:
                killed.add(task.name)  # no status written: killed (signal, OOM killer)
            reported_lost.update((got or {}).get("lost_tasks") or [])
        # a chief is a replica of multi-worker training, but a coordinator where there are ps
        # tasks: losing it loses no worker
        replicas = ("worker:",) if any(name.startswith("ps:") for name in self._plans) \
            else ("worker:", "chief:")
        lost = {name for name in (killed or reported_lost) if name.startswith(replicas)}
        return Failure(report=report, failure_class=status.failure_class(first.status_path),
                       message=reported.get("message", ""), error=reported.get("error", ""),
                       lost=tuple(sorted(lost)), task=first.name)


__all__ = ["Supervisor"]

"""The sweep driver's bookkeeping (issue 44) with trials simulated in this process (no TensorFlow
run): the gate protocol answered epoch by epoch, PRUNED / FAIL / COMPLETE recorded, the
``max_failed_trials`` bound, exactly ``trials`` finished, and an interrupted (RUNNING) trial
resumed under its own number and parameters, not counted twice. The same with real ``kerasdist
fit`` trials: tests/multiprocess/test_sweep.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from test_sweep_config import write_sweep

from kerasdist._signals import Terminated
from kerasdist.sweep import gate
from kerasdist.sweep.driver import Driver
from kerasdist.sweep.plan import load_sweep

optuna = pytest.importorskip("optuna")


class FakeTrial:
    """A trial that trains one epoch per poll: the chief's value file, then (with a pruner) the
    wait for the driver's decision; ``value(lr, epoch)`` gives the objective; ``fail`` exits 1."""

    def __init__(self, recipe: Path, log: Path, *, value, epochs: int, fail=False, wait=True):
        raw = yaml.safe_load(recipe.read_text())
        self.lr = raw["optimizer"]["learning_rate"]
        self.gate_dir = Path(raw["callbacks"][-1]["config"]["gate_dir"])
        self.run_dir = Path(raw["output"]["run_dir"])
        self.log, self.value, self.epochs, self.fail, self.waits = log, value, epochs, fail, wait
        self.epoch, self.code, self.history = self._done_epochs(), None, []
        self.starts = 1

    def _done_epochs(self) -> int:
        done = 0
        while gate.decision_path(self.gate_dir, done + 1).exists():
            done += 1
        return done

    def poll(self):
        if self.code is not None:
            return self.code
        if self.fail:
            self.log.write_text(self.fail if isinstance(self.fail, str) else
                                "kerasdist: failed: InvalidArgumentError: label 11 out of range\n")
            self.code = 1
            return self.code
        number = self.epoch + 1
        if not gate.value_path(self.gate_dir, number).exists():
            value = self.value(self.lr, number)
            self.history.append(value)
            gate.write_atomic(gate.value_path(self.gate_dir, number),
                              json.dumps({"epoch": number, "value": value, "step": number}))
            return None
        decision = gate.decision_path(self.gate_dir, number)
        if self.waits and not decision.exists():
            return None
        self.epoch = number
        if number == self.epochs or (decision.exists() and decision.read_text() == gate.PRUNE):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "metrics.json").write_text(json.dumps(
                {"history": {"val_loss": self.history}}))
            self.code = 0
        return self.code

    def stop(self):
        self.code = -15

    def wait(self, timeout_s=0):
        return self.code


def _driver(tmp_path, monkeypatch, *, value, epochs=3, fails=(), fail_log=True, **sweep):
    monkeypatch.setattr("kerasdist.sweep.driver.POLL_S", 0.0)
    monkeypatch.chdir(tmp_path)
    plan = load_sweep(write_sweep(tmp_path, **sweep))
    started: list[FakeTrial] = []

    def start(backend, *, recipe, log, cores):
        trial = FakeTrial(recipe, log, value=value, epochs=epochs,
                          fail=len(started) in fails and fail_log,
                          wait=plan.config.pruner.name != "none")
        started.append(trial)
        return trial

    lines: list[str] = []
    return Driver(plan, echo=lines.append, backend_start=start), started, lines


def _study(tmp_path):
    return optuna.load_study(study_name="kerasdist-sweep",
                             storage=f"sqlite:///{tmp_path / 'out' / 'study.db'}")


def test_a_pruned_trial_is_recorded_pruned_at_the_epoch_the_pruner_chose(tmp_path, monkeypatch):
    # the loss is the learning rate itself: a trial above the running median is pruned
    driver, started, lines = _driver(
        tmp_path, monkeypatch, value=lambda lr, epoch: lr * 100 / epoch, trials=4, parallel=1,
        sampler={"name": "random", "seed": 1},
        pruner={"name": "threshold", "warmup_epochs": 1, "options": {"upper": 1.0}})
    assert driver.run() == 0
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials].count("COMPLETE") + \
        [t.state.name for t in trials].count("PRUNED") == 4 == len(trials)
    for trial in trials:
        values = trial.intermediate_values
        if trial.state.name == "PRUNED":  # the first epoch past warmup over the threshold
            stop = max(values)
            assert values[stop] > 1.0 and stop >= 2 and stop < 3, values
            decision = gate.decision_path(Path(trial.user_attrs["dir"]) / "gate", stop)
            assert decision.read_text() == gate.PRUNE
        else:
            assert sorted(values) == [1, 2, 3] and trial.value == pytest.approx(values[3])
    assert {t.state.name for t in trials} == {"PRUNED", "COMPLETE"}, [t.params for t in trials]
    out = tmp_path / "out"
    assert (out / "trials.csv").read_text().count("\n") == 5
    assert "pruned after epoch 2" in "\n".join(lines)


def test_failed_trials_are_recorded_with_their_log_and_bounded(tmp_path, monkeypatch):
    driver, started, lines = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr, fails=(0, 1),
                                     trials=2, max_failed_trials=1)
    assert driver.run() == 1  # the second failure is past max_failed_trials=1
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"]
    assert "label 11 out of range" in trials[0].user_attrs["failure"]
    assert trials[0].user_attrs["log"].endswith("trial-0000/trial.log")

    (tmp_path / "again").mkdir()
    driver, started, lines = _driver(tmp_path / "again", monkeypatch, value=lambda lr, e: lr,
                                     fails=(0,), trials=2, max_failed_trials=1)
    assert driver.run() == 0  # one failure, then two trials that finish
    states = [t.state.name for t in _study(tmp_path / "again").trials]
    assert states == ["FAIL", "COMPLETE", "COMPLETE"]


def test_a_failed_trials_reason_is_the_failed_line_of_its_log(tmp_path, monkeypatch):
    # the log as `kerasdist fit` ends it: the error, then the closing paragraph
    import contextlib
    import io

    from kerasdist._log import LAUNCHED_ENV
    from kerasdist.cli import _failed
    from kerasdist.errors import TrainingError
    from kerasdist.launch import explain

    monkeypatch.delenv(LAUNCHED_ENV, raising=False)  # as a trial's own `kerasdist fit`
    monkeypatch.setitem(explain.RUN, "run_dir", str(tmp_path / "run"))
    text = io.StringIO()
    with contextlib.redirect_stderr(text):
        _failed(TrainingError("the loss is NaN at global step 3"), "fit")
    assert "kerasdist: the run failed." in text.getvalue()
    driver, _, lines = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr, fails=(0,),
                               fail_log=text.getvalue(), trials=1, max_failed_trials=0)
    assert driver.run() == 1
    why = "kerasdist: failed: the loss is NaN at global step 3"
    assert why in _study(tmp_path).trials[0].user_attrs["failure"]
    assert why in (tmp_path / "out" / "trials.csv").read_text()
    assert any("trial 0 FAIL: " in line and why in line for line in lines), lines


def test_a_grid_sweep_of_every_point_ends_with_its_outputs(tmp_path, monkeypatch):
    driver, _, _ = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr, trials=2,
                           sampler={"name": "grid"},
                           space={"data.batch_size": {"type": "categorical", "choices": [8, 16]}})
    assert driver.run() == 0
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert sorted(t.params["data.batch_size"] for t in trials) == [8, 16]
    out = tmp_path / "out"
    assert (out / "trials.csv").is_file() and (out / "best.yaml").is_file()
    assert (out / "optimization_history.png").is_file()


def test_a_second_sweep_on_the_storage_of_a_running_one_is_refused(tmp_path, monkeypatch,
                                                                    capsys):
    # two sweeps, two output.dirs, one storage: the second must not take the first's trials
    import threading

    from kerasdist.cli import EXIT_BAD_INPUT, main

    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    (tmp_path / "a").mkdir()
    release = threading.Event()
    driver, started, _ = _driver(  # its trial blocks the first driver until released
        tmp_path / "a", monkeypatch, value=lambda lr, e: release.wait(60) and lr, trials=1,
        output={"dir": str(tmp_path / "a" / "out"), "storage": shared})
    codes: list[int] = []
    first = threading.Thread(target=lambda: codes.append(driver.run()))
    first.start()
    try:
        for _ in range(600):
            if started:
                break
            first.join(0.1)
        second = tmp_path / "b.yaml"  # the same sweep, another output.dir
        raw = yaml.safe_load((tmp_path / "a" / "sweep.yaml").read_text())
        second.write_text(yaml.safe_dump({**raw, "output": {"dir": str(tmp_path / "b" / "out"),
                                                            "storage": shared}}))
        for mode in (("--dry-run",), ()):
            assert main(["sweep", str(second), *mode]) == EXIT_BAD_INPUT
            err = capsys.readouterr().err
            assert "output.storage: another kerasdist sweep runs study" in err, err
            assert f"output.dir '{tmp_path / 'a' / 'out'}'" in err and shared in err
        assert not (tmp_path / "b" / "out").exists()
    finally:
        release.set()
        first.join(60)
    assert codes == [0]
    from kerasdist.sweep.storage import DRIVER_ATTR

    assert optuna.load_study(study_name="kerasdist-sweep", storage=shared).user_attrs[
        DRIVER_ATTR] is None  # the first driver ended: its mark is cleared


def test_an_interrupted_trial_is_resumed_with_its_number_and_parameters(tmp_path, monkeypatch):
    driver, started, _ = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr / e, trials=2,
                                 sampler={"name": "random", "seed": 0},
                                 pruner={"name": "median", "options": {"n_startup_trials": 5}})
    # a driver that was killed: trial 0 RUNNING in the storage, its epoch 1 answered
    from kerasdist.sweep.storage import open_study
    from kerasdist.sweep.study import suggest, trial_dir, trial_recipe

    study = open_study(driver.plan)  # an earlier driver asked trial 0
    trial = study.ask()
    params = suggest(trial, driver.plan.config)
    folder = trial_dir(driver.plan, trial.number)
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(trial_recipe(driver.plan, 0, params)))
    trial.report(params["optimizer.learning_rate"], 1)
    gate.write_atomic(gate.value_path(folder / "gate", 1), json.dumps({"epoch": 1, "value": 1.0}))
    gate.write_atomic(gate.decision_path(folder / "gate", 1), gate.CONTINUE)
    assert driver.run() == 0
    trials = _study(tmp_path).trials
    assert [t.number for t in trials] == [0, 1]  # not counted twice
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert trials[0].params == params
    assert trials[1].params != params  # the re-run's sampler does not repeat the first draw
    assert started[0].epoch == 3 and len(started[0].history) == 2  # went on from epoch 2
    assert sorted(trials[0].intermediate_values) == [1, 2, 3]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_landing_in_a_weakref_callback_still_stops_the_sweep(
        tmp_path, monkeypatch, signal_in_a_weakref_callback, signum):
    # in the real run SQLAlchemy's clean-up callback: a handler that raised there lost the stop
    # and the sweep finished its trial (exit 0, not 130)
    driver, started, lines = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr, trials=1)
    polls = []

    def poll(trial, original=FakeTrial.poll):
        polls.append(1)
        if len(polls) == 1:
            signal_in_a_weakref_callback(signum)
        return original(trial)

    monkeypatch.setattr(FakeTrial, "poll", poll)
    before = signal.getsignal(signum)
    with pytest.raises(KeyboardInterrupt) as raised:
        driver.run()
    assert isinstance(raised.value, Terminated) == (signum == signal.SIGTERM)
    assert [t.code for t in started] == [-15]  # stopped, not finished
    (trial,) = _study(tmp_path).trials
    assert trial.state.name == "RUNNING"  # resumed by the next run
    assert "stopped trial(s) 0" in "\n".join(lines)
    assert signal.getsignal(signum) is before  # the driver's handler is gone


def test_trials_are_written_by_number_through_optunas_public_interfaces(tmp_path, monkeypatch):
    # another study first in the same storage: storage ids and trial numbers differ
    from kerasdist.sweep.storage import TrialBook

    driver, _, _ = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr, trials=2,
                           pruner={"name": "threshold", "options": {"upper": 0.5}})
    url = driver.plan.config.storage_url()
    (tmp_path / "out").mkdir()
    other = optuna.create_study(storage=url, study_name="other")
    for _ in range(3):
        other.tell(other.ask(), 1.0)
    book = TrialBook.open(driver.plan)
    book.study.ask()  # trials 0 and 1, as asked by a driver now gone
    second = book.study.ask()
    assert second.number == 1
    assert book.report(1, 1, 0.25) and not book.report(1, 1, 9.0)  # a reported step stands
    assert not book.should_prune(1)
    assert book.report(1, 2, 0.75) and book.should_prune(1)  # over the threshold's upper 0.5
    book.set_user_attr(1, "dir", "trial-0001")
    again = optuna.load_study(study_name="kerasdist-sweep", storage=url).trials
    assert again[1].intermediate_values == {1: 0.25, 2: 0.75}
    assert again[1].user_attrs == {"dir": "trial-0001"} and again[0].user_attrs == {}
    assert all(not t.intermediate_values for t in other.trials)
    with pytest.raises(KeyError):
        book.trial(2)


def test_the_sweep_reads_no_private_optuna_attribute():
    # e.g. FrozenTrial._trial_id / Trial._trial_id: a restarted driver re-attaches by number
    import re

    import kerasdist.sweep as sweep

    for path in Path(sweep.__file__).parent.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\._trial_id|\._study_id|\._storage\b", text), path


def test_a_trials_end_is_polled_until_its_code_or_the_timeout():
    import time

    from kerasdist.sweep.processes import poll_until_exit

    codes = iter([None, None, 0])
    assert poll_until_exit(lambda: next(codes), 5.0, interval_s=0.01) == 0
    started = time.monotonic()
    assert poll_until_exit(lambda: None, 0.3, interval_s=0.05) is None
    assert 0.3 <= time.monotonic() - started < 3.0

#!/usr/bin/env python3
"""Soak: run many small recipes back to back through the real command line and count every run
by outcome (issue 39).

Each run is ``python -m kerasdist fit RECIPE`` as a subprocess in a session (process group) of its
own, in a fresh run directory; the plan (``tools/soak_plan.py``) cycles through the strategies
``default``, ``mirrored`` (2 logical CPUs), ``multi_worker`` (2 local workers) and
``parameter_server`` (1 ps + 2 workers), each with an in-memory source (``synthetic_linear``) and
the streaming sources ``csv`` and ``image_folder`` (written once into ``<out>/data``), a share of
them tracked with MLflow into SQLite, a share beside a CPU hog (``--hog``), and optionally
deliberately failing runs (``--expected-failures``: a csv with a bad label must exit 2 with its
message; a run sent SIGINT after its first checkpoint must exit 130).

A run that matches its expectation is a success or an expected failure; anything else (another
exit code, a missing message or output file, no exit within ``--timeout-s``) is a **spurious
failure**: its console log (stdout + stderr) and its run directory's ``logs/`` are kept under
``<out>/spurious/<run>/``. A run over ``--timeout-s`` is killed (its process group, and any
process it started that left the group) and counted as spurious, reason ``hang``.

Writes ``<out>/runs.jsonl`` (one record per run, as it ends), prints the summary table (runs,
successes, expected failures, spurious failures, seconds per run; per strategy and per hog state)
and, with ``--report``, writes it into a Markdown file between markers (replacing the section a
previous soak wrote). The harness ends only processes it started; on Ctrl-C it stops the current
run and the hog, writes the partial table and exits 130.

Usage (2 shared cores: be nice)::

    nice -n 10 python tools/soak.py --runs-per-strategy 4 --hog --out runs/soak-trial
    nice -n 10 python tools/soak.py --hog --expected-failures 2 --report docs/reliability.md

Exit status: 0 when no run was a spurious failure, 1 otherwise, 2 for bad options, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak_plan  # noqa: E402 - the sibling modules, found through the line above
import soak_report  # noqa: E402
from soak_plan import FAILURE_KINDS, FULL_RUNS, SOURCES, STRATEGIES, RunSpec  # noqa: E402
from soak_report import Outcome, Verdict  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.2
SIGINT_MARK = Path("checkpoints") / "checkpoint"  # the first checkpoint: training is under way


# --- options ---------------------------------------------------------------------------------

def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer. Received: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}. Received: {value}")
        return value
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1]. Received: {text!r}") from None
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be in [0, 1]. Received: {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds. Received: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 86400 s. Received: {text}")
    return value


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        unknown = [n for n in names if n not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"a comma-separated list of {', '.join(allowed)}. Received: {text!r}")
        return tuple(dict.fromkeys(names))
    return parse


def _runs(text: str) -> dict[str, int]:
    counts = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in STRATEGIES or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"STRATEGY=N[,...] with STRATEGY one of {', '.join(STRATEGIES)} and N >= 0. "
                f"Received: {item!r}")
        counts[name.strip()] = int(value)
    if not counts:
        raise argparse.ArgumentTypeError(f"STRATEGY=N[,...]. Received: {text!r}")
    return counts


def build_parser() -> argparse.ArgumentParser:
    """The soak's options; each type refuses a bad value naming its flag (exit 2)."""
    p = argparse.ArgumentParser(prog="tools/soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=_runs, default=None, metavar="STRATEGY=N,...",
                   help="ordinary runs per strategy (default: " +
                   ",".join(f"{k}={v}" for k, v in FULL_RUNS.items()) + ", the full soak)")
    p.add_argument("--runs-per-strategy", type=_int_at_least(1), default=None, metavar="N",
                   help="the same number of ordinary runs for every strategy (instead of --runs)")
    p.add_argument("--strategies", type=_names(STRATEGIES), default=STRATEGIES,
                   help="comma-separated strategies to run (default: all four)")
    p.add_argument("--sources", type=_names(SOURCES), default=SOURCES,
                   help="data sources to cycle through (default: memory,csv,image_folder)")
    p.add_argument("--expected-failures", type=_int_at_least(0), default=0, metavar="N",
                   help="deliberately failing runs per strategy, added to the ordinary ones")
    p.add_argument("--failure-kinds", type=_names(FAILURE_KINDS), default=FAILURE_KINDS,
                   help="kinds the failing runs cycle through (default: bad_label,sigint)")
    p.add_argument("--mlflow-fraction", type=_fraction, default=0.5,
                   help="share of the runs tracked with MLflow into SQLite (default 0.5)")
    p.add_argument("--hog", action="store_true", help="run a CPU hog beside a share of the runs")
    p.add_argument("--hog-fraction", type=_fraction, default=None,
                   help="share of the runs beside the hog (default 0.5; needs --hog)")
    p.add_argument("--hog-processes", type=_int_at_least(1), default=None,
                   help="busy-loop processes of the hog (default 1; needs --hog)")
    p.add_argument("--timeout-s", type=_seconds, default=300.0,
                   help="seconds a run may take before it is killed as a hang (default 300)")
    p.add_argument("--seed", type=_int_at_least(0), default=0, help="seeds the plan (default 0)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder, new or empty (default runs/soak-<UTC time>)")
    p.add_argument("--report", type=Path, default=None,
                   help="Markdown file to write the table into (e.g. docs/reliability.md)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the options; bad values exit 2 naming the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs_per_strategy is not None:
        parser.error("argument --runs: not allowed with --runs-per-strategy")
    for flag, value in (("--hog-fraction", args.hog_fraction), ("--hog-processes", args.hog_processes)):
        if value is not None and not args.hog:
            parser.error(f"argument {flag}: needs --hog. Received: {flag} {value} without --hog")
    if args.runs_per_strategy is not None:
        counts = {s: args.runs_per_strategy for s in args.strategies}
    else:
        counts = {s: n for s, n in (args.runs or FULL_RUNS).items() if s in args.strategies}
    if not counts or (not any(counts.values()) and not args.expected_failures):
        parser.error("argument --runs/--strategies: no run left to do")
    args.counts = counts
    args.hog_fraction = (0.5 if args.hog_fraction is None else args.hog_fraction) if args.hog else 0.0
    args.hog_processes = args.hog_processes or 1
    args.out = args.out or Path("runs") / _dt.datetime.now(_dt.timezone.utc).strftime("soak-%Y%m%d-%H%M%S")
    _check_paths(parser, args.out, args.report)
    return args


def _check_paths(parser: argparse.ArgumentParser, out: Path, report: Path | None) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"argument --out: {out} exists and is not an empty folder")
    if report is None:
        return
    if report.suffix != ".md":
        parser.error(f"argument --report: a Markdown file (.md). Received: {report}")
    if report.exists() and not report.is_file():
        parser.error(f"argument --report: {report} is not a file")
    if not report.resolve().parent.is_dir():
        parser.error(f"argument --report: the folder of {report} does not exist")


# --- processes ---------------------------------------------------------------------------------

def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - gone already, or no psutil: the group kill is what is left
        return []


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL, *, wait_s: float = 30.0) -> None:
    """Send ``sig`` to the process group ``proc`` leads (it was started in a session of its own)
    and to every process descended from it that left the group (local cluster tasks start
    sessions of their own); wait up to ``wait_s`` seconds to reap ``proc``."""
    family = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for child in family:
        try:
            child.send_signal(sig)
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass


def _running_in(folder: Path) -> list:
    """Processes (not zombies) whose working directory is ``folder`` or inside it: every run and
    the tasks it starts work in ``<out>/work``, and nothing else does."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cwd", "status"]):
        cwd = proc.info.get("cwd") or ""
        if (cwd == str(folder) or cwd.startswith(f"{folder}/")) and \
                proc.info.get("status") != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def reap_leftovers(folder: Path, *, grace_s: float = 5.0) -> int:
    """After a run ended: the processes still running in ``folder`` (its tasks) are given
    ``grace_s`` seconds to end on their own (a task is ended by its parent's death asynchronously),
    then killed; return how many were still running after the grace."""
    deadline = time.monotonic() + grace_s
    while (left := _running_in(folder)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for proc in left:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
    return len(left)


def _as_from_a_terminal() -> None:  # runs in the child between fork and exec
    """A session of its own (its process group is what a timeout kills; a Ctrl-C meant for the
    soak does not reach it), and SIGINT at its default, as a command typed in a terminal has it:
    a soak started in the background of a non-interactive shell has SIGINT ignored, which its
    children would inherit (Python then installs no KeyboardInterrupt handler)."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Hog:
    """A CPU hog: ``processes`` busy-loop subprocesses, each in a session of its own, started by
    :meth:`on` and killed by :meth:`off` (idempotent both)."""

    def __init__(self, processes: int = 1):
        self.processes = processes
        self.procs: list[subprocess.Popen] = []

    def on(self) -> None:
        while len(self.procs) < self.processes:
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def off(self) -> None:
        for proc in self.procs:
            kill_tree(proc)
        self.procs = []


class Soak:
    """Runs the plan one run at a time and records each run.

    Args:
        out: the output folder (``data/``, ``recipes/``, ``work/``, ``logs/``, ``spurious/``,
            ``runs.jsonl``).
        timeout_s: seconds per run before it is killed as a hang.
        hog: the CPU hog switched on for the runs planned beside it.
    """

    def __init__(self, out: Path, *, timeout_s: float, hog: Hog):
        self.out, self.timeout_s, self.hog = out, timeout_s, hog
        self.records: list[dict] = []
        self.current: subprocess.Popen | None = None
        self.signalled_s: float | None = None  # when the current run was sent SIGINT

    def run(self, spec: RunSpec) -> dict:
        """Run ``spec`` to its end (or kill it at the timeout), judge it, keep its logs if it was
        spurious, append its record to ``runs.jsonl`` and return the record."""
        run_dir = self.out / "work" / spec.name
        recipe = soak_plan.write_recipe(self.out / "recipes" / f"{spec.name}.yaml", soak_plan.recipe(
            spec, data_dir=self.out / "data", run_dir=run_dir))
        log_path = self.out / "logs" / f"{spec.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        (self.hog.on if spec.hog else self.hog.off)()
        load = os.getloadavg()[0]
        start = time.monotonic()
        self.signalled_s = None
        exit_code, timed_out, aborted = self._execute(spec, recipe, run_dir, log_path)
        seconds = time.monotonic() - start
        leftover = 0 if aborted else reap_leftovers(run_dir.parent)
        console = log_path.read_text(encoding="utf-8", errors="replace")
        expected = spec.expectation()
        verdict = soak_report.classify(expected, exit_code=exit_code, console=console,
                                       timed_out=timed_out, aborted=aborted, leftover=leftover,
                                       present=[f for f in expected.files if (run_dir / f).exists()])
        record = {"index": spec.index, "strategy": spec.strategy, "source": spec.source,
                  "kind": spec.kind, "mlflow": spec.mlflow, "hog": spec.hog, "seed": spec.seed,
                  "exit_code": exit_code, "expected": expected.describe(),
                  "outcome": verdict.outcome.value, "reason": verdict.reason,
                  "seconds": round(seconds, 2), "load_1min": round(load, 2),
                  "sigint_at_s": self.signalled_s,
                  "log": str(self._keep(spec, verdict, log_path, run_dir))}
        if verdict.outcome != Outcome.SUCCESS:
            record["first_line"] = soak_report.first_meaningful_line(console)
        self.records.append(record)
        with open(self.out / "runs.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        return record

    def _execute(self, spec: RunSpec, recipe: Path, run_dir: Path,
                 log_path: Path) -> tuple[int | None, bool, bool]:
        """Start the run, send SIGINT to a ``sigint`` run once its first checkpoint exists, wait
        at most ``timeout_s``; return (exit code, timed out, aborted)."""
        cmd = [sys.executable, "-m", "kerasdist", "fit", str(recipe)]
        with open(log_path, "wb") as log:
            self.current = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.out / "work",
                                            preexec_fn=_as_from_a_terminal)
        proc, start, signalled = self.current, time.monotonic(), False
        try:
            while proc.poll() is None:
                if time.monotonic() - start > self.timeout_s:
                    kill_tree(proc)
                    return proc.returncode, True, False
                if spec.kind == "sigint" and not signalled and (run_dir / SIGINT_MARK).exists():
                    proc.send_signal(signal.SIGINT)  # as Ctrl-C to `kerasdist fit`, as the tests do
                    signalled, self.signalled_s = True, round(time.monotonic() - start, 2)
                time.sleep(POLL_S)
            return proc.returncode, False, False
        except KeyboardInterrupt:
            kill_tree(proc, signal.SIGTERM, wait_s=10)
            kill_tree(proc)
            self._record_aborted(spec, log_path)
            raise
        finally:
            self.current = None

    def _record_aborted(self, spec: RunSpec, log_path: Path) -> None:
        record = {"index": spec.index, "strategy": spec.strategy, "source": spec.source,
                  "kind": spec.kind, "mlflow": spec.mlflow, "hog": spec.hog, "seed": spec.seed,
                  "exit_code": None, "expected": spec.expectation().describe(),
                  "outcome": Outcome.ABORTED.value, "reason": "the soak was interrupted",
                  "seconds": None, "log": str(log_path)}
        self.records.append(record)
        with open(self.out / "runs.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def _keep(self, spec: RunSpec, verdict: Verdict, log_path: Path, run_dir: Path) -> Path:
        """A spurious run's console log and run-dir ``logs/`` (and small JSON files) go to
        ``spurious/<run>/``; every run directory is then removed (disk stays small)."""
        kept = log_path
        if verdict.outcome == Outcome.SPURIOUS:
            target = self.out / "spurious" / spec.name
            target.mkdir(parents=True, exist_ok=True)
            kept = Path(shutil.copy2(log_path, target / "console.log"))
            if (run_dir / "logs").is_dir():
                shutil.copytree(run_dir / "logs", target / "logs", dirs_exist_ok=True)
            for extra in run_dir.glob("*.json") if run_dir.is_dir() else ():
                shutil.copy2(extra, target / extra.name)
        shutil.rmtree(run_dir, ignore_errors=True)
        return kept


# --- the soak ------------------------------------------------------------------------------------

def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=REPO, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=REPO, timeout=30).stdout.strip()
        return done.stdout.strip() + ("+changes" if dirty else "") if done.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _meta(args, records, started: float, loads: list[float], partial: bool) -> dict:
    """What the report says about the soak: date, commit (taken at the start), cores, load,
    niceness, the command, wall seconds."""
    run_loads = [r["load_1min"] for r in records if r.get("load_1min") is not None]
    mean = f", mean over the runs' starts {statistics.mean(run_loads):.2f}" if run_loads else ""
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": args.commit, "cores": os.cpu_count(),
            "load": f"{loads[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end{mean} "
                    f"(1 min; the soak ran at niceness {os.nice(0)})",
            "command": "python " + shlex.join([_shown(sys.argv[0]), *sys.argv[1:]]),
            "seconds": time.monotonic() - started, "partial": partial, "out": str(args.out)}


def _shown(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def _progress(record: dict, total: int) -> str:
    flags = f"mlflow={'on' if record['mlflow'] else 'off'} hog={'on' if record['hog'] else 'off'}"
    tail = f" -- {record['reason']}: {record.get('first_line', '')}" if record["outcome"] == "spurious" \
        else ""
    return (f"[{record['index']}/{total}] {record['strategy']:<16} {record['source']:<12} "
            f"{record['kind']:<9} {flags}: exit {record['exit_code']} {record['outcome']} "
            f"in {record['seconds']:.1f} s{tail}")


def _finish(args, soak: Soak, started: float, loads: list[float], *, partial: bool) -> None:
    records = soak.records
    print(soak_report.table(records))
    spurious = soak_report.spurious_list(records)
    if spurious:
        print(f"\nspurious failures (logs under {args.out / 'spurious'}):\n{spurious}")
    meta = _meta(args, records, started, loads, partial)
    (args.out / "summary.md").write_text(soak_report.section(records, meta) + "\n", encoding="utf-8")
    if args.report is not None:
        soak_report.write_section(args.report, soak_report.section(records, meta))
        print(f"wrote the table into {args.report}")
    estimate = soak_report.estimate_s(records, FULL_RUNS)
    if estimate is not None:
        print("at these runs' mean seconds, the full soak (" +
              ", ".join(f"{k}={v}" for k, v in FULL_RUNS.items()) + f") takes {estimate / 60:.0f} min")
    print(f"records: {args.out / 'runs.jsonl'}; {meta['seconds'] / 60:.1f} min in all")


def main(argv: list[str] | None = None) -> int:
    """Run the soak; return 0 (no spurious failure), 1 (some) or 130 (interrupted)."""
    args = parse_args(argv)
    specs = soak_plan.plan(args.counts, sources=args.sources, mlflow_fraction=args.mlflow_fraction,
                           hog_fraction=args.hog_fraction, failures=args.expected_failures,
                           failure_kinds=args.failure_kinds, seed=args.seed)
    args.commit = _commit()  # what the runs run, before anyone commits during the soak
    args.out.mkdir(parents=True, exist_ok=True)
    args.out = args.out.resolve()
    (args.out / "work").mkdir()
    soak_plan.write_data(args.out / "data", seed=args.seed)
    print(f"soak: {len(specs)} runs into {args.out}", flush=True)
    soak = Soak(args.out, timeout_s=args.timeout_s, hog=Hog(args.hog_processes))
    started, loads = time.monotonic(), [os.getloadavg()[0]]
    # Ctrl-C (even if the soak was started with SIGINT ignored) and SIGTERM stop the soak
    previous = [signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)]
    try:
        for spec in specs:
            print(_progress(soak.run(spec), len(specs)), flush=True)
    except KeyboardInterrupt:
        if soak.current is not None:  # interrupted between its start and its watch
            kill_tree(soak.current)
        soak.hog.off()
        print("soak: interrupted; the partial table follows", flush=True)
        _finish(args, soak, started, loads, partial=True)
        return 130
    finally:
        soak.hog.off()
        for sig, handler in zip((signal.SIGINT, signal.SIGTERM), previous, strict=True):
            signal.signal(sig, handler)
    _finish(args, soak, started, loads, partial=False)
    return 1 if any(r["outcome"] == Outcome.SPURIOUS.value for r in soak.records) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The pure half of ``tools/soak.py``: what a run was expected to do, how its outcome is judged, and
the summary table the soak prints and writes into ``docs/reliability.md``.

Nothing here starts a process or imports TensorFlow, so ``tests/unit/test_soak_units.py`` checks
it in milliseconds.

Outcomes (:class:`Outcome`):

* ``success``: a run expected to exit 0 did, and wrote ``metrics.json`` and ``model.keras``;
* ``expected_failure``: a deliberately failing run exited with its expected code and printed its
  expected message (a csv with a bad label: 2 and ``labels must be in``; SIGINT mid-training:
  130);
* ``spurious``: anything else -- another exit code, a missing message or output file, a process
  of the run still running after it ended, or no exit within the per-run timeout (reason
  ``hang``: the run's process group was killed);
* ``aborted``: the soak itself was interrupted during the run (Ctrl-C); not counted.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import statistics
from pathlib import Path
from typing import Iterable, Mapping, Sequence

BEGIN_MARK = "<!-- BEGIN soak table: written by tools/soak.py --report; do not edit by hand -->"
END_MARK = "<!-- END soak table -->"

DOC_HEAD = """# Reliability

`tools/soak.py` runs many small recipes back to back through the real command line
(`python -m kerasdist fit`), each in a fresh run directory, under every strategy, with an
in-memory and streaming sources, half of them tracked with MLflow into SQLite and (with `--hog`)
half of them beside a CPU hog, and counts every run by outcome: **success**, **expected failure**
(a deliberately bad run that exited with its expected code and message) and **spurious failure**
(anything else: a wrong exit code, a missing message or output, a hang). Each spurious failure's
console log and task logs are kept under the soak's `--out` folder.

"""


class Outcome(str, enum.Enum):
    """How a run ended, judged against its :class:`Expectation`."""

    SUCCESS = "success"
    EXPECTED_FAILURE = "expected_failure"
    SPURIOUS = "spurious"
    ABORTED = "aborted"


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What a run must do to count as a success or an expected failure.

    Attributes:
        exit_code: the exit status ``python -m kerasdist fit`` must end with (0, 2, 130).
        needle: text the console output (stdout + stderr) must hold, or ``None``.
        forbid: texts the console output must not hold (e.g. ``Traceback`` for bad input).
        files: files the run directory must hold afterwards (relative paths).
    """

    exit_code: int
    needle: str | None = None
    forbid: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def describe(self) -> str:
        """Short text for tables and logs: ``exit 2 + 'labels must be in'``."""
        return f"exit {self.exit_code}" + (f" + {self.needle!r}" if self.needle else "")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The judged outcome of one run and, for a spurious one, why."""

    outcome: Outcome
    reason: str = ""


def classify(expected: Expectation, *, exit_code: int | None, console: str, timed_out: bool = False,
             aborted: bool = False, present: Iterable[str] = (), leftover: int = 0) -> Verdict:
    """Judge one finished (or killed) run against its expectation.

    Args:
        expected: what the run had to do.
        exit_code: the process's exit status (negative: killed by that signal; ``None``: never
            collected).
        console: the run's console output, stdout and stderr together.
        timed_out: the run outlived the soak's ``--timeout-s`` and was killed.
        aborted: the soak itself was interrupted during the run.
        present: which of ``expected.files`` exist in the run directory.
        leftover: processes of the run still running after it ended (then killed by the soak).

    Returns:
        ``ABORTED`` if ``aborted``; ``SPURIOUS`` with reason ``hang`` if ``timed_out``; else
        ``SUCCESS`` (expected exit 0) or ``EXPECTED_FAILURE`` when the exit code, the needle, the
        forbidden texts and the files all match and no process was left running; else
        ``SPURIOUS`` naming the first mismatch.
    """
    if aborted:
        return Verdict(Outcome.ABORTED, "the soak was interrupted during this run")
    if timed_out:
        return Verdict(Outcome.SPURIOUS, "hang")
    if exit_code != expected.exit_code:
        return Verdict(Outcome.SPURIOUS, f"exit {exit_code} (expected {expected.exit_code})")
    if expected.needle and expected.needle not in console:
        return Verdict(Outcome.SPURIOUS, f"exit {exit_code} without {expected.needle!r} in the console")
    for text in expected.forbid:
        if text in console:
            return Verdict(Outcome.SPURIOUS, f"exit {exit_code} with {text!r} in the console")
    missing = sorted(set(expected.files) - set(present))
    if missing:
        return Verdict(Outcome.SPURIOUS, f"exit {exit_code} but no {', '.join(missing)} in the run dir")
    if leftover:
        return Verdict(Outcome.SPURIOUS, f"exit {exit_code} but {leftover} process(es) of the run "
                                         "still running after it ended")
    return Verdict(Outcome.SUCCESS if expected.exit_code == 0 else Outcome.EXPECTED_FAILURE)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SIGNS = ("Error", "error:", "failed", "INTERNAL", "Fatal", "fatal", "Segmentation", "Aborted",
          "core dumped", "exited with code", "was killed", "Traceback")
_NOISE = ("ran out of data", "WARNING: All log messages before absl", "oneDNN", "cuda",
          "rebuild TensorFlow", "computation placer")


def first_meaningful_line(console: str, *, limit: int = 300) -> str:
    """The first line of ``console`` that looks like the failure (an error class, ``failed``,
    ``INTERNAL``, a task exit), skipping the known harmless warnings; else the last non-empty line.

    Args:
        console: a run's console output.
        limit: longest line returned, in characters.

    Returns:
        The line, stripped of ANSI colours and surrounding blanks; ``""`` for an empty console.
    """
    lines = [_ANSI.sub("", line).strip() for line in console.splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if any(sign in line for sign in _SIGNS) and not any(n in line for n in _NOISE):
            return line[:limit]
    return lines[-1][:limit] if lines else ""


def _counts(records: Sequence[Mapping]) -> dict:
    counted = [r for r in records if r["outcome"] != Outcome.ABORTED.value]
    by = {o.value: sum(r["outcome"] == o.value for r in counted) for o in Outcome}
    seconds = [r["seconds"] for r in counted if r["kind"] == "normal" and r["outcome"] == "success"]
    return {"runs": len(counted), "success": by["success"],
            "expected_failure": by["expected_failure"], "spurious": by["spurious"],
            "median_s": statistics.median(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None}


def summarize(records: Sequence[Mapping]) -> list[tuple[str, dict]]:
    """Rows of the summary table: one per strategy (in order of first appearance), one per hog
    state, and the total.

    Args:
        records: the soak's run records (dicts with ``strategy``, ``hog``, ``kind``, ``outcome``,
            ``seconds``), aborted ones included (they are not counted).

    Returns:
        ``[(label, counts)]``; counts hold ``runs``, ``success``, ``expected_failure``,
        ``spurious`` and the median and largest seconds of the successful ordinary runs.
    """
    rows = []
    for strategy in dict.fromkeys(r["strategy"] for r in records):
        rows.append((f"strategy {strategy}", _counts([r for r in records if r["strategy"] == strategy])))
    for hog in (False, True):
        rows.append((f"hog {'on' if hog else 'off'}", _counts([r for r in records if r["hog"] == hog])))
    rows.append(("all", _counts(records)))
    return rows


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def estimate_s(records: Sequence[Mapping], counts: Mapping[str, int]) -> float | None:
    """Seconds a soak of ``counts`` ordinary runs per strategy would take at the mean seconds of
    the successful ordinary runs of each strategy in ``records`` (with the hog share those runs
    had); ``None`` if a strategy of ``counts`` has no such run."""
    total = 0.0
    for strategy, n in counts.items():
        done = [r for r in records if r["strategy"] == strategy and r["kind"] == "normal"
                and r["outcome"] == Outcome.SUCCESS.value]
        if not done:
            return None
        total += n * statistics.mean(r["seconds"] for r in done)
    return total


def table(records: Sequence[Mapping]) -> str:
    """The summary as a Markdown table (see :func:`summarize`)."""
    lines = ["| runs of | runs | successes | expected failures | spurious failures | "
             "s per run (median / max) |", "| --- | --- | --- | --- | --- | --- |"]
    for label, c in summarize(records):
        spurious = f"**{c['spurious']}**" if c["spurious"] else "0"
        lines.append(f"| {label} | {c['runs']} | {c['success']} | {c['expected_failure']} | "
                     f"{spurious} | {_seconds(c['median_s'])} / {_seconds(c['max_s'])} |")
    return "\n".join(lines)


def spurious_list(records: Sequence[Mapping]) -> str:
    """One Markdown bullet per spurious failure: run, strategy, source, MLflow, hog, reason, first
    meaningful console line and where its logs are kept; ``""`` when there is none."""
    lines = []
    for r in records:
        if r["outcome"] != Outcome.SPURIOUS.value:
            continue
        line = (r.get("first_line") or "").replace("`", "'")
        lines.append(f"* run {r['index']} ({r['strategy']}, {r['source']}, {r['kind']}, "
                     f"mlflow {'on' if r['mlflow'] else 'off'}, hog {'on' if r['hog'] else 'off'}): "
                     f"{r['reason']}; `{line}` (logs: `{r['log']}`)")
    return "\n".join(lines)


def section(records: Sequence[Mapping], meta: Mapping) -> str:
    """The report section written between the markers: when, where, the command, the table, the
    spurious failures.

    Args:
        records: the run records.
        meta: ``date``, ``commit``, ``cores``, ``load`` (text), ``command``, ``seconds`` (wall of the
            whole soak), ``partial`` (interrupted), ``out`` (the output folder).

    Returns:
        Markdown text starting with :data:`BEGIN_MARK` and ending with :data:`END_MARK`.
    """
    aborted = sum(r["outcome"] == Outcome.ABORTED.value for r in records)
    partial = " **Interrupted: partial results.**" if meta.get("partial") else ""
    if aborted:
        partial += f" {aborted} run(s) cut short by the interruption, not counted."
    spurious = spurious_list(records) or "None."
    return "\n".join([
        BEGIN_MARK, "",
        f"Soak ended {meta['date']} at commit `{meta['commit']}`, {meta['cores']} CPU core(s), "
        f"load average {meta['load']}; {meta['seconds'] / 60:.1f} min in all.{partial}", "",
        "```bash", meta["command"], "```", "",
        table(records), "",
        f"Spurious failures (logs under `{meta['out']}`):", "", spurious, "",
        END_MARK])


def write_section(path: str | Path, text: str) -> None:
    """Put ``text`` (a :func:`section`) into the Markdown file ``path``: replace the section
    between the markers if the file has one, else append it (a new file gets a short heading).

    Raises:
        ValueError: the file has a begin marker without an end marker after it (left untouched).
    """
    path = Path(path)
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    start = old.find(BEGIN_MARK)
    if start >= 0:
        end = old.find(END_MARK, start)
        if end < 0:
            raise ValueError(f"{path}: '{BEGIN_MARK}' without '{END_MARK}' after it; fix the file")
        new = old[:start] + text + old[end + len(END_MARK):]
    elif old:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    else:
        new = DOC_HEAD + text + "\n"
    path.write_text(new, encoding="utf-8")

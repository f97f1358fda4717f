"""The recipe lifecycle: :func:`run_session` (one process's part of a run), :class:`RunResult`,
atomic run-directory outputs and the end-of-run summary."""

from kerasdist.training.result import RunResult, summary_text
from kerasdist.training.session import run_session

__all__ = ["RunResult", "run_session", "summary_text"]

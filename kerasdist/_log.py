"""kerasdist's logging: Python ``logging`` under the ``kerasdist`` logger, chief-only by default.

* :func:`get_logger` is what every module uses instead of ``print``.
* :func:`configure` is called once per process (the CLI, :func:`kerasdist.fit`, a spawned task):
  it maps ``--verbose`` to a level and prefixes the lines of a cluster task with its name
  (``kerasdist[worker:1]: ...``). On tasks that are not the chief the level is ``WARNING`` unless
  ``verbose == 2``, so a console sees one copy of each message (Accelerate's
  ``main_process_only`` idea); spawned local tasks run with ``--verbose 2`` and log everything
  into their own log files.

===========  ====================  ======================
verbose      chief / one process   other tasks
===========  ====================  ======================
0            WARNING               WARNING
1, auto      INFO                  WARNING
2            RECORD                RECORD
===========  ====================  ======================

:data:`RECORD` (below ``INFO``): verification records (weights digests), shown at ``--verbose 2``
only, as a local cluster's task logs are written; the chief's are in ``metrics.json`` too.
"""

from __future__ import annotations

import logging
import re
import sys

LOGGER_NAME = "kerasdist"
_HANDLER_MARK = "_kerasdist_handler"
# Set by kerasdist's local launcher in every task it starts (kerasdist.launch.status): such a
# task's standard output is a log file of its own, not a console other tasks write too.
LAUNCHED_ENV = "KERASDIST_STATUS_FILE"


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at emit time (so redirection and capture work)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


RECORD = 15
"""The level of verification records (see the module docs)."""
logging.addLevelName(RECORD, "RECORD")
_RECORD_LINE = re.compile(r"^kerasdist(\[[\w:]+\])?: .*\bweights sha256 [0-9a-f]{64}$")


def is_record(line: str) -> bool:
    """Whether ``line`` (without its newline) is one of kerasdist's verification records: a
    line of its logger carrying a weights digest (:data:`RECORD`)."""
    return bool(_RECORD_LINE.match(line))


def get_logger(name: str | None = None) -> logging.Logger:
    """The ``kerasdist`` logger, or its child ``kerasdist.<name>``."""
    return logging.getLogger(LOGGER_NAME if not name else f"{LOGGER_NAME}.{name}")


def level_for(verbose, *, is_chief: bool = True) -> int:
    """The logging level for a ``--verbose`` value (0, 1, 2, ``'auto'`` or None; see module docs)."""
    if verbose == 0:
        return logging.WARNING
    if verbose == 2:
        return RECORD
    return logging.INFO if is_chief else logging.WARNING


def one_line_deprecations() -> None:
    """Print a :class:`~kerasdist.errors.RecipeDeprecationWarning` as one line on stderr
    (``kerasdist: deprecated: ...``), not Python's two-line warning with a source line."""
    import warnings

    from kerasdist.errors import RecipeDeprecationWarning

    shown = warnings.showwarning
    if getattr(shown, "_kerasdist", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, RecipeDeprecationWarning):
            print(f"kerasdist: deprecated: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    show._kerasdist = True
    warnings.showwarning = show


def configure(verbose=None, *, task: str | None = None, is_chief: bool = True) -> logging.Logger:
    """Set up the ``kerasdist`` logger for this process (idempotent: replaces its own handler).

    Args:
        verbose: ``--verbose`` value: 0, 1, 2, ``'auto'`` or None (= 1).
        task: this process's task name (``worker:1``) for the line prefix; None in one process.
        is_chief: whether this process writes the run's outputs (chief-only default level).

    Returns:
        The configured logger. Lines go to standard output (beside Keras's progress bar and the
        summary), flushed per record.
    """
    logger = get_logger()
    for handler in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(handler)
    handler = _StdoutHandler()
    setattr(handler, _HANDLER_MARK, True)
    prefix = f"kerasdist[{task}]" if task else "kerasdist"
    handler.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level_for(verbose, is_chief=is_chief))
    logger.propagate = False
    return logger


def ensure_configured() -> None:
    """Configure with the defaults when nobody has (library use without the CLI)."""
    if not any(getattr(h, _HANDLER_MARK, False) for h in get_logger().handlers):
        configure()


def shared_console() -> bool:
    """Whether this process's standard output is a console that the cluster's other tasks may
    write too: every task not started by kerasdist's local launcher (a Slurm step's output file,
    a pod's log, Ray's forwarded output, a terminal of ``fit --this-task``)."""
    import os

    return not os.environ.get(LAUNCHED_ENV)


def keras_verbose(verbose=None, *, is_chief: bool = True):
    """Keras's ``fit`` verbosity for this process.

    Args:
        verbose: ``--verbose`` / ``trainer.verbose``: 0, 1, 2, ``'auto'`` or None (= ``'auto'``).
        is_chief: whether this process writes the run's outputs.

    Returns:
        0 for a task other than the chief on a :func:`shared_console` (one task speaks there, so
        its lines need no prefix; the others' warnings keep theirs); otherwise ``'auto'``/None
        becomes 1 (Keras's progress bar) on a terminal and 2 (one line an epoch) elsewhere (a
        file, a pipe: Keras's bar would write its backspaces and colour codes there), and 0, 1
        or 2 are kept.
    """
    if not is_chief and shared_console():
        return 0
    if verbose in (None, "auto"):
        stream = sys.stdout
        return 1 if getattr(stream, "isatty", lambda: False)() else 2
    return verbose

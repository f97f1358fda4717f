"""Exceptions, their classes of failure and the process exit codes: defined here and nowhere else.

Every error names the field, file or task at fault and shows what was received, following the
Keras convention ``"... Received: name=value"``. Failures are classified by **type**, never by
message text (:func:`classify`; the table with what each class costs: docs/guarantees.md):
``bad_input`` (a :class:`KerasdistError` raised before anything starts, exit 2, not retried),
``peer_lost`` (:class:`TaskFailedError` or a TensorFlow ``Unavailable``/``DeadlineExceeded``/
``Aborted``/``Cancelled``, exit 1, retried), ``fatal`` (any other error during training and
:class:`TrainingError`, exit 1, not retried), ``preempted`` (SIGTERM or Ctrl-C, exit 130, retried;
SIGTERM during start-up, :class:`Interrupted`, exits 143). The one exception to "by type": an
``InternalError``/``UnknownError`` whose message carries the RPC layer's own words
(:data:`TRANSIENT_RPC_MARKERS`) is a lost peer (:func:`is_transient_rpc_error`).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
"""128 + SIGINT, the shell's code for an interrupted command; also a preempted (SIGTERM) run."""

BAD_INPUT, PEER_LOST, FATAL, PREEMPTED = "bad_input", "peer_lost", "fatal", "preempted"
RETRYABLE = frozenset({PEER_LOST, PREEMPTED})
"""Failure classes after which restarting the cluster can succeed."""

_PEER_ERROR_NAMES = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError")
_RPC_ERROR_NAMES = ("InternalError", "UnknownError")
TRANSIENT_RPC_MARKERS = ("Unable to parse request", "EagerService/", "WorkerService/",
                         "Socket closed", "Connection reset by peer", "Stream removed",
                         "failed to connect to all addresses")
"""Words of TensorFlow's gRPC layer (``grpc_util.h``, ``eager_service.proto`` method names) that
mark an ``InternalError``/``UnknownError`` as a request lost or garbled between two tasks, not an
error of the computation: re-running the step on a fresh connection succeeds."""


class KerasdistError(Exception):
    """Base class of every error kerasdist raises on purpose: about its input (exit code 2),
    except :class:`TaskFailedError` and :class:`TrainingError`, raised during training (exit
    code 1; :func:`classify`)."""


class RecipeError(KerasdistError, ValueError):
    """A recipe (YAML file, ``--set`` override or Python config) is invalid."""


class DataError(KerasdistError, ValueError):
    """A data source is missing, unreadable or inconsistent with the recipe."""


class RecipeDeprecationWarning(FutureWarning):
    """A recipe written in a form that is still read for one release (e.g. the flat ``data``
    section, :func:`kerasdist.config.data_configs.lift_flat_source`); the message names the new
    form. ``kerasdist`` commands print it as one line on standard error."""


class ClusterError(KerasdistError, RuntimeError):
    """A cluster spec is invalid, or a task could not start."""


class RunDirError(KerasdistError, RuntimeError):
    """The run directory holds outputs that the requested run would overwrite or cannot resume."""


class UnsupportedFeatureError(KerasdistError, ValueError):
    """A Keras feature kerasdist cannot run correctly under a strategy, refused before training.

    The message names the feature, the strategy and why (e.g. "`gradient_accumulation_steps` is
    not supported under ParameterServerStrategy: ..."). Exit code 2 in recipes; the conformance
    matrix (``kerasdist conformance``) lists such cells as refused.
    """


class TaskFailedError(ClusterError):
    """A task of a running cluster died, hung or was lost during training (class ``peer_lost``).

    Not bad input: the CLI exits with code 1 ("failure during training") and kerasdist's launcher
    restarts the cluster up to ``cluster.max_restarts`` times; re-running resumes from the last
    checkpoint.
    """


class TrainingError(KerasdistError, RuntimeError):
    """A task of a local cluster failed deterministically during training (class ``fatal``): its
    launcher does not restart it and re-raises the task's own message (exit code 1)."""


class Preempted(KeyboardInterrupt):
    """Training stopped on SIGTERM or SIGINT (Ctrl-C) after a checkpoint at global ``step`` was
    saved (exit 130).

    A ``KeyboardInterrupt`` so that it passes ``except Exception`` handlers as Ctrl-C does.
    """

    def __init__(self, step: int):
        super().__init__(f"preempted: checkpoint saved at global step {step}; re-run to resume")
        self.step = step


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during start-up (the recipe, imports, the data checks and counting pass,
    the tracker check, waiting for a cluster), before training: there was nothing to save.

    The process exits with 128 + the signal's number, 130 (SIGINT) or 143 (SIGTERM)
    (:func:`exit_code`). A ``KeyboardInterrupt``, so that it passes ``except Exception`` handlers
    as Ctrl-C does.

    Args:
        signum: the signal received (``signal.SIGINT`` or ``signal.SIGTERM``).
        during: what the process was doing, for the message ("counting the examples of ...").
    """

    def __init__(self, signum: int, during: str):
        import signal

        self.signum = int(signum)
        super().__init__(f"{signal.Signals(self.signum).name} received while {during}")


def _tf_error_of(err: BaseException, names: tuple[str, ...]) -> bool:
    """``err`` is a TensorFlow error of a class named in ``names`` (by type, via the MRO names so
    that this module never imports TensorFlow)."""
    return any(cls.__name__ in names and cls.__module__.startswith("tensorflow")
               for cls in type(err).__mro__)


def is_transient_rpc_error(err: BaseException) -> bool:
    """A TensorFlow ``InternalError``/``UnknownError`` that came from the RPC layer between tasks
    (its message holds one of :data:`TRANSIENT_RPC_MARKERS`), e.g. ``INTERNAL: Unable to parse
    request`` from ``/tensorflow.eager.EagerService/RunComponentFunction``."""
    if not _tf_error_of(err, _RPC_ERROR_NAMES):
        return False
    text = str(err)
    return any(marker in text for marker in TRANSIENT_RPC_MARKERS)


def classify(err: BaseException) -> str:
    """The failure class of ``err``: ``bad_input``, ``peer_lost``, ``fatal`` or ``preempted``."""
    if isinstance(err, KeyboardInterrupt):
        return PREEMPTED
    if isinstance(err, TaskFailedError) or _tf_error_of(err, _PEER_ERROR_NAMES) or \
            is_transient_rpc_error(err):
        return PEER_LOST
    if isinstance(err, KerasdistError) and not isinstance(err, TrainingError):
        return BAD_INPUT
    return FATAL


def exit_code(failure_class: str, err: BaseException | None = None) -> int:
    """The process exit code of a failure class (see module docs); an :class:`Interrupted`
    ``err`` (a signal during start-up) exits 128 + its signal's number (130 or 143)."""
    if isinstance(err, Interrupted):
        return 128 + err.signum
    return {BAD_INPUT: EXIT_BAD_INPUT, PREEMPTED: EXIT_INTERRUPTED}.get(failure_class, EXIT_FAILED)

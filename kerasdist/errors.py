"""Exceptions raised by kerasdist.

Every error names the field, file or task at fault and shows what was received, following the
Keras convention ``"... Received: name=value"``. The CLI maps :class:`KerasdistError` subclasses to
exit code 2 (bad input) and prints only the message, never a traceback.
"""

from __future__ import annotations


class KerasdistError(Exception):
    """Base class of every error kerasdist raises on purpose."""


class RecipeError(KerasdistError, ValueError):
    """A recipe (YAML file, ``--set`` override or Python config) is invalid."""


class DataError(KerasdistError, ValueError):
    """A data source is missing, unreadable or inconsistent with the recipe."""


class ClusterError(KerasdistError, RuntimeError):
    """A cluster spec is invalid, or a task failed, hung or could not start."""


class RunDirError(KerasdistError, RuntimeError):
    """The run directory holds outputs that the requested run would overwrite."""


class TaskFailedError(ClusterError):
    """A task of a running cluster died, hung or was lost during training.

    Unlike other :class:`ClusterError` s this is not bad input: the CLI exits with code 1
    ("failure during training"), so schedulers that retry failed jobs (e.g. Kubeflow's
    ``restartPolicy``) retry it. Re-running resumes from the last checkpoint.
    """

"""The protocol of a cluster kind (``cluster.kind``): what it checks before anything starts, where
a task's role comes from, and how a run is started.

The kind's fields and traits (who starts the tasks, where roles come from, elastic, requeues)
are declared on its config class (:mod:`kerasdist.config.cluster_configs`); this object is the
code that runs it, found by :func:`kerasdist.launch.clusters.of`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerasdist.errors import ClusterError

if TYPE_CHECKING:
    from kerasdist.cluster.spec import TFConfig
    from kerasdist.config import Recipe
    from kerasdist.training import RunResult


class ClusterKind:
    """One cluster kind; subclasses give :meth:`run`, and :meth:`check` and :meth:`role` where
    they apply.

    Attributes:
        kind: the ``cluster.kind`` value it runs.
    """

    kind: str = ""

    def check(self, recipe: Recipe) -> None:
        """The kind's own checks that read nothing and start nothing (``kerasdist validate``
        and the launcher's preflight run them): nothing by default.

        Raises:
            ClusterError: bad input (exit code 2), naming the fields and their values.
        """

    def role_note(self, recipe: Recipe) -> str | None:
        """What ``kerasdist validate`` says about this machine's role in the cluster (and checks:
        a role variable that is set must be valid): None by default.

        Raises:
            ClusterError: a role set here that is invalid (exit code 2).
        """
        return None

    def role(self, recipe: Recipe, tf_config: TFConfig | None) -> TFConfig:
        """This task's role: ``tf_config`` when given, else read from the task's environment.

        Raises:
            ClusterError: the kind's tasks take no role from their environment, or the
                environment does not give a valid one (names what is wrong).
        """
        if tf_config is not None:
            return tf_config
        raise ClusterError(f"cluster.kind '{recipe.cluster.kind}' takes no task role from the "
                           "environment. Received: no TF_CONFIG given")

    def run(self, recipe: Recipe, *, overwrite: bool, verbose, callbacks, echo: bool,
            tf_config: TFConfig | None) -> RunResult | None:
        """Run ``recipe`` (the arguments of :func:`kerasdist.launch.run_recipe`); the
        :class:`RunResult` in the process that owns the outputs, ``None`` in other tasks."""
        raise NotImplementedError


__all__ = ["ClusterKind"]

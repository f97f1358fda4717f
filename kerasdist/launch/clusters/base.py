"""The protocol of a cluster kind: what it checks before anything starts, where a task's role
comes from, how a run is started. The kind's fields and traits are on its config class
(:mod:`kerasdist.config.cluster_configs`); :func:`kerasdist.launch.clusters.of` finds this object."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerasdist.errors import ClusterError

if TYPE_CHECKING:
    from kerasdist.cluster.spec import TFConfig
    from kerasdist.config import Recipe
    from kerasdist.training import RunResult


class ClusterKind:
    """One cluster kind (``kind``: the ``cluster.kind`` it runs); subclasses give :meth:`run`."""

    kind: str = ""

    def check(self, recipe: Recipe) -> None:
        """The kind's checks that read nothing and start nothing (``kerasdist validate``, the
        launcher's preflight): none by default.

        Raises:
            ClusterError: bad input (exit code 2), naming the fields and their values.
        """

    def role_note(self, recipe: Recipe) -> str | None:
        """What ``kerasdist validate`` says of this machine's role (a role set here is checked):
        None by default.

        Raises:
            ClusterError: a role set here that is invalid (exit code 2).
        """
        return None

    def role(self, recipe: Recipe, tf_config: TFConfig | None) -> TFConfig:
        """This task's role: ``tf_config`` when given, else :meth:`environment_role`."""
        return tf_config if tf_config is not None else self.environment_role(recipe)

    def environment_role(self, recipe: Recipe) -> TFConfig:
        """The role this kind's task reads from its environment (``TF_CONFIG``, Slurm...).

        Raises:
            ClusterError: none there, or an invalid one (names what is wrong).
        """
        raise ClusterError(f"cluster.kind '{recipe.cluster.kind}' takes no task role from the "
                           "environment. Received: no TF_CONFIG given")

    def run(self, recipe: Recipe, *, overwrite: bool, verbose, callbacks, echo: bool,
            tf_config: TFConfig | None) -> RunResult | None:
        """Run ``recipe`` (the arguments of :func:`kerasdist.launch.run_recipe`): the
        :class:`RunResult` where this process owns the outputs, else None."""
        raise NotImplementedError


__all__ = ["ClusterKind"]

"""The protocol of a cluster kind: what it checks before anything starts, where a task's role
comes from, how a run is started. The kind's fields and traits are on its config class
(:mod:`kerasdist.config.cluster_configs`); :func:`kerasdist.launch.clusters.of` finds this object."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerasdist import _log
from kerasdist._signals import startup
from kerasdist._timeline import mark
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

    def enter(self, recipe: Recipe, *, overwrite: bool, isolated: bool = False) -> Recipe:
        """The checks made once per run, where it enters (the command that starts the tasks, or
        the chief task): ``output.run_dir``'s path, one probe of the tracking store
        (:func:`kerasdist.tracking.check`; ``isolated``: the tasks run in a private network
        namespace), a warning when the run directory holds a complete run (``overwrite``: none).
        Reads only. Returns ``recipe``, without ``output.tracking`` when its store cannot be used
        and is not required.

        Raises:
            RunDirError, RecipeError: bad input (exit code 2).
        """
        from kerasdist import tracking
        from kerasdist.training.rundir import RunDir

        mark("entry checks")
        run_dir = RunDir.of(recipe)
        with startup("checking the run directory and the tracking server"):  # no TensorFlow yet
            run_dir.check_path()
            recipe = tracking.check(recipe, isolated=isolated)
        complete = run_dir.complete_notice(recipe, overwrite=overwrite)
        if complete:  # one line: a re-run of a finished run trains nothing
            _log.get_logger("training").warning(complete)
        return recipe

    def run(self, recipe: Recipe, *, overwrite: bool, verbose, callbacks, echo: bool,
            tf_config: TFConfig | None) -> RunResult | None:
        """Run ``recipe`` (the arguments of :func:`kerasdist.launch.run_recipe`): the
        :class:`RunResult` where this process owns the outputs, else None."""
        raise NotImplementedError


__all__ = ["ClusterKind"]

"""``cluster.kind: this_process``: this process is the whole job (strategies ``default`` and
``mirrored``): the run lifecycle runs here (:func:`kerasdist.training.run_session`)."""

from __future__ import annotations

from kerasdist.launch.clusters.base import ClusterKind
from kerasdist.training import run_session


class ThisProcessKind(ClusterKind):
    """Runs the lifecycle in this process; no role, no task started."""

    def run(self, recipe, *, overwrite, verbose, callbacks, echo, tf_config):
        recipe = self.enter(recipe, overwrite=overwrite)
        return run_session(recipe, overwrite=overwrite, verbose=verbose, callbacks=callbacks,
                           entry_checked=True)


__all__ = ["ThisProcessKind"]

"""Process launching: run a recipe wherever its cluster says (:func:`run_recipe`).

Who owns what. ``launch/`` owns the cluster kinds: one module per ``cluster.kind`` in
:mod:`kerasdist.launch.clusters` (what the kind checks before anything starts, where a task's
role comes from, how a run is started), the dispatch to them (:mod:`.run`), and everything a
cluster started from this machine needs: the private network namespace (:mod:`.isolation`),
forked tasks (:mod:`.forking`), the one supervisor of every local cluster
(:mod:`.supervisor`: restarts, elastic worker counts, status files) and ``kerasdist launch``
scripts. ``cluster/`` keeps the low-level pieces the kinds use and that know no kind: the
``TF_CONFIG`` model (``spec.py``), task servers, the liveness probe and watch, task counts and
rank order, in-process clusters and the manifest exports. A new scheduler goes into
``launch/clusters/`` (one config class, one module, one registry line: docs/architecture.md,
"Adding a cluster kind").
"""

from kerasdist.launch.run import preflight, run_recipe

__all__ = ["preflight", "run_recipe"]

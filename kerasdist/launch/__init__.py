"""Process launching: run a recipe wherever its cluster says (:func:`run_recipe`).

``launch/`` owns the cluster kinds (:mod:`kerasdist.launch.clusters`) and everything a cluster
started from this machine needs; ``cluster/`` keeps the low-level pieces that know no kind
(docs/architecture.md, "Layers" and "Adding a cluster kind").
"""

from kerasdist.launch.run import preflight, run_recipe

__all__ = ["preflight", "run_recipe"]

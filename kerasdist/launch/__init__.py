"""Process launching: run a recipe wherever its cluster says (:func:`run_recipe`); every local
cluster (peers, a coordinator with ps/worker servers, ``kerasdist launch`` scripts) is run by one
supervisor (:mod:`kerasdist.launch.supervisor`: restarts, elastic worker counts, status files)."""

from kerasdist.launch.run import preflight, run_recipe

__all__ = ["preflight", "run_recipe"]

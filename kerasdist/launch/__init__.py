"""Process launching: run a recipe wherever its cluster says (:func:`run_recipe`), local clusters
of peers or of a coordinator with ps/worker servers, restarts, task status files."""

from kerasdist.launch.run import preflight, run_recipe

__all__ = ["preflight", "run_recipe"]

"""kerasdist: distributed training of Keras 3 models on TensorFlow 2.

Public API::

    recipe = kerasdist.load_recipe("recipes/mnist_cnn.yaml", overrides=["trainer.epochs=1"])
    result = kerasdist.fit(recipe)        # RunResult: history, evaluation, throughput, paths

Subpackages: ``config`` (recipes), ``models`` (builders), ``data`` (sources, tf.data pipelines),
``strategies`` (registry), ``training`` (loops, callbacks, atomic outputs).
"""

__version__ = "0.1.0"

from kerasdist.config import Recipe, load_recipe  # noqa: E402
from kerasdist.errors import (  # noqa: E402
    ClusterError,
    DataError,
    KerasdistError,
    RecipeError,
    RunDirError,
)


def fit(recipe, **kwargs):
    """Train a recipe; see :func:`kerasdist.training.fit`. Imports TensorFlow on first call."""
    from kerasdist.training import fit as _fit

    return _fit(recipe, **kwargs)


__all__ = ["ClusterError", "DataError", "KerasdistError", "Recipe", "RecipeError", "RunDirError",
           "__version__", "fit", "load_recipe"]

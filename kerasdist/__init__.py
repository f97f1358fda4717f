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


def enable() -> None:
    """Opt in: plain ``model.fit``/``evaluate`` under every supported strategy (see
    :func:`kerasdist.training.dispatch.enable`). Imports Keras/TensorFlow."""
    from kerasdist.training.dispatch import enable as _enable

    _enable()


def fit(recipe, **kwargs):
    """Run a recipe wherever its strategy and cluster say (see :func:`kerasdist.training.run.run`);
    returns the RunResult in the process that owns the outputs. Imports TensorFlow."""
    from kerasdist.training.run import run as _run

    return _run(recipe, **kwargs)


__all__ = ["ClusterError", "DataError", "KerasdistError", "Recipe", "RecipeError", "RunDirError",
           "__version__", "enable", "fit", "load_recipe"]

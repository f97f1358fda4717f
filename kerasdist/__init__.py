"""kerasdist: distributed training of Keras 3 models on TensorFlow 2.

Public API::

    recipe = kerasdist.load_recipe("recipes/mnist_cnn.yaml", overrides=["trainer.epochs=1"])
    result = kerasdist.fit(recipe)        # RunResult: history, evaluation, throughput, paths
    kerasdist.enable()                    # plain model.fit under every supported strategy

Layers (each imports only those below it): ``config``, ``models``, ``data``, ``keras`` (Keras-level
pieces usable without recipes), ``strategies`` (one object per kind), ``training`` (the one run
lifecycle), ``launch`` (processes, restarts), ``cluster`` (TF_CONFIG, Slurm, export), ``_compat``
(every patch of Keras/TF internals). Importing ``kerasdist`` does not import TensorFlow.
"""

from kerasdist._version import __version__
from kerasdist.config import Recipe, load_recipe
from kerasdist.errors import (
    ClusterError,
    DataError,
    KerasdistError,
    RecipeError,
    RunDirError,
    TaskFailedError,
)


def enable() -> list[str]:
    """Opt in: plain ``model.fit``/``evaluate`` under every supported strategy (see
    :func:`kerasdist.keras.enable`). Imports Keras/TensorFlow."""
    from kerasdist.keras import enable as _enable

    return _enable()


def fit(recipe: Recipe, *, overwrite: bool = False, verbose=None, tf_config=None, callbacks=()):
    """Run a recipe wherever its strategy and cluster say (:func:`kerasdist.launch.run_recipe`);
    returns the :class:`~kerasdist.training.RunResult` in the process that owns the outputs, None
    in other tasks. Imports TensorFlow.

    Raises:
        RecipeError, DataError, RunDirError, ClusterError: bad input, before anything starts.
        TaskFailedError: a task was lost during training.
    """
    from kerasdist.launch import run_recipe

    return run_recipe(recipe, overwrite=overwrite, verbose=verbose, tf_config=tf_config,
                      callbacks=callbacks)


__all__ = ["ClusterError", "DataError", "KerasdistError", "Recipe", "RecipeError", "RunDirError",
           "TaskFailedError", "__version__", "enable", "fit", "load_recipe"]

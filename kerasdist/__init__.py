"""kerasdist: distributed training of Keras 3 models on TensorFlow 2.

Public API::

    recipe = kerasdist.load_recipe("recipes/mnist_cnn.yaml", overrides=["trainer.epochs=1"])
    result = kerasdist.fit(recipe)        # RunResult: history, evaluation, throughput, paths
    kerasdist.enable()                    # plain model.fit under every supported strategy

The layers, each importing only those below it: docs/architecture.md. Importing ``kerasdist``
does not import TensorFlow.
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


def fit(recipe, *, overwrite: bool = False, verbose=None, tf_config=None, callbacks=()):
    """Run a recipe wherever its strategy and cluster say (:func:`kerasdist.launch.run_recipe`);
    returns the :class:`~kerasdist.training.RunResult` in the process that owns the outputs, None
    in other tasks. Imports TensorFlow.

    Args:
        recipe: a validated :class:`Recipe` (:func:`load_recipe`), the path of a YAML recipe
            (``str`` or ``os.PathLike``; read and validated as :func:`load_recipe` does), or a
            mapping with the recipe's sections (validated as a YAML recipe would be).
        overwrite: start afresh (``kerasdist fit --overwrite``).
        verbose: Keras progress verbosity (0, 1, 2); default the recipe's.
        tf_config: this task's role on a real cluster (:func:`kerasdist.launch.run_recipe`).
        callbacks: extra Keras callbacks.

    Raises:
        TypeError: ``recipe`` is none of the above (names what was received).
        RecipeError, DataError, RunDirError, ClusterError: bad input, before anything starts.
        TaskFailedError: a task was lost during training.

    Example::

        result = kerasdist.fit("recipes/mnist_cnn.yaml")
    """
    from kerasdist.launch import run_recipe

    return run_recipe(_as_recipe(recipe), overwrite=overwrite, verbose=verbose,
                      tf_config=tf_config, callbacks=callbacks)


def _as_recipe(recipe) -> Recipe:
    """``recipe`` as a validated :class:`Recipe` (:func:`fit`'s first argument)."""
    import os
    from collections.abc import Mapping

    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, (str, os.PathLike)):
        return load_recipe(recipe)
    if isinstance(recipe, Mapping):
        from kerasdist.config import validate_recipe

        return validate_recipe(dict(recipe), source="<mapping passed to kerasdist.fit>")
    raise TypeError("kerasdist.fit takes a Recipe (kerasdist.load_recipe(path)), the path of a "
                    "YAML recipe, or a mapping of recipe sections. Received: "
                    f"{type(recipe).__name__} {recipe!r:.80}")


__all__ = ["ClusterError", "DataError", "KerasdistError", "Recipe", "RecipeError", "RunDirError",
           "TaskFailedError", "__version__", "enable", "fit", "load_recipe"]

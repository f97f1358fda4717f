"""The recipe's Keras model, optimizer and loss: built and compiled the same way for every strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerasdist.errors import RecipeError

if TYPE_CHECKING:
    from kerasdist.config import Recipe


def make_optimizer(config, num_replicas: int = 1):
    """A Keras 3 optimizer from an ``OptimizerConfig``; applies linear LR scaling if asked."""
    import keras

    lr = config.learning_rate * (num_replicas if config.scale_lr_by_replicas else 1)
    if config.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=config.momentum, nesterov=config.nesterov)
    if config.name == "rmsprop":
        return keras.optimizers.RMSprop(lr, momentum=config.momentum)
    if config.name == "adamw":
        return keras.optimizers.AdamW(lr)
    return keras.optimizers.Adam(lr)


def make_loss(name: str):
    """Keras loss from an identifier; ``sparse_categorical_crossentropy_from_logits`` is the seed
    CNN's (softmax cross-entropy on logits)."""
    import keras

    if name == "sparse_categorical_crossentropy_from_logits":
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    try:
        return keras.losses.get(name)
    except ValueError as err:
        raise RecipeError(f"model.loss: {err}. Received: loss='{name}'") from None


def build_compiled_model(recipe: Recipe, num_replicas: int = 1, **compile_kwargs):
    """Build and compile the recipe's model. Call inside ``strategy.scope()``.

    Args:
        recipe: the validated recipe (``model``, ``optimizer``).
        num_replicas: replicas in sync (for ``optimizer.scale_lr_by_replicas``).
        compile_kwargs: extra ``model.compile`` arguments (e.g. ``steps_per_execution``).

    Returns:
        The compiled ``keras.Model``; its optimizer is not built yet.

    Raises:
        RecipeError: unknown builder/loss, or a builder that does not return a ``keras.Model``.
    """
    import keras

    from kerasdist.models import registry

    spec = registry.check(recipe.model)
    model = spec.build(**recipe.model.params)
    if not isinstance(model, keras.Model):
        raise RecipeError(f"model.name: builder '{recipe.model.name}' must return an uncompiled "
                          f"keras.Model. Received: {type(model).__name__}")
    model.compile(optimizer=make_optimizer(recipe.optimizer, num_replicas),
                  loss=make_loss(spec.loss), metrics=list(spec.metrics), **compile_kwargs)
    return model

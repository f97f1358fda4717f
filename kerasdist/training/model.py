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


_COMPILE_ALIASES = frozenset({"accuracy", "acc", "crossentropy", "ce"})
"""Metric names ``model.compile`` resolves itself from the loss and output shapes."""


def check_metrics(names) -> None:
    """Refuse metric identifiers Keras cannot resolve (Keras itself only finds out at the first
    training step, after the run directory has been written).

    Raises:
        RecipeError: naming ``model.metrics`` and the unknown name.
    """
    import keras

    for name in names:
        if str(name).lower() in _COMPILE_ALIASES:
            continue
        try:
            keras.metrics.get(name)
        except (ValueError, TypeError) as err:
            raise RecipeError(f"model.metrics: unknown metric ({err}). Received: "
                              f"metrics={list(names)!r}") from None


def build_model(recipe: Recipe):
    """Call the recipe's builder and check what it returned (no compile).

    Returns:
        ``(model, spec)``: the uncompiled ``keras.Model`` and its registry ``ModelSpec``.

    Raises:
        RecipeError: unknown builder; the builder refused ``model.params`` (a ``ValueError`` or
            ``TypeError``, e.g. ``dropout: 2.0``); it returned no ``keras.Model`` or a compiled one.
    """
    import keras

    from kerasdist.models import registry

    config = recipe.model
    spec = registry.check(config)
    try:
        model = spec.build(**config.params)
    except (ValueError, TypeError) as err:
        raise RecipeError(f"model.params: builder '{config.name}' refused its parameters: {err}. "
                          f"Received: params={dict(config.params)!r}") from None
    if not isinstance(model, keras.Model):
        raise RecipeError(f"model.name: builder '{config.name}' must return an uncompiled "
                          f"keras.Model. Received: {type(model).__name__}")
    if getattr(model, "compiled", False) or getattr(model, "optimizer", None) is not None:
        raise RecipeError(f"model.name: builder '{config.name}' must return an uncompiled "
                          "keras.Model (kerasdist compiles it with the recipe's optimizer, loss and "
                          "metrics). Received: a model compiled with optimizer "
                          f"{type(getattr(model, 'optimizer', None)).__name__}")
    return model, spec


def build_compiled_model(recipe: Recipe, num_replicas: int = 1, **compile_kwargs):
    """Build and compile the recipe's model. Call inside ``strategy.scope()``.

    Args:
        recipe: the validated recipe (``model``, ``optimizer``).
        num_replicas: replicas in sync (for ``optimizer.scale_lr_by_replicas``).
        compile_kwargs: extra ``model.compile`` arguments (e.g. ``steps_per_execution``).

    Returns:
        The compiled ``keras.Model``; its optimizer is not built yet.

    Raises:
        RecipeError: unknown builder, loss or metric; parameters the builder refuses; a builder
            that does not return an uncompiled ``keras.Model`` (see :func:`build_model`).
    """
    model, spec = build_model(recipe)
    loss = make_loss(spec.loss)
    check_metrics(spec.metrics)
    model.compile(optimizer=make_optimizer(recipe.optimizer, num_replicas),
                  loss=loss, metrics=list(spec.metrics), **compile_kwargs)
    return model

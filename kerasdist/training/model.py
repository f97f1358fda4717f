"""The recipe's Keras model, optimizer and loss: built and compiled the same way for every strategy."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Sequence

from kerasdist._log import get_logger
from kerasdist.errors import RecipeError

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = get_logger("training")


def make_optimizer(config, num_replicas: int = 1):
    """A Keras 3 optimizer from an ``OptimizerConfig``
    (:func:`kerasdist.training.keras_objects.make_optimizer`)."""
    from kerasdist.training.keras_objects import make_optimizer as build

    return build(config, num_replicas)


def make_loss(spec):
    """Keras loss from ``model.loss`` (:func:`kerasdist.training.keras_objects.make_loss`);
    ``sparse_categorical_crossentropy_from_logits`` is the seed CNN's (softmax cross-entropy on
    logits)."""
    from kerasdist.training.keras_objects import make_loss as build

    return build(spec)


def _load_saved(config, precision):
    """``model.from``: the saved ``.keras`` model, uncompiled."""
    import keras

    from kerasdist.keras.precision import policy_scope

    try:
        with policy_scope(precision):
            return keras.saving.load_model(config.from_, compile=False)
    except Exception as err:  # noqa: BLE001 - Keras raises ValueError, TypeError, OSError ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise RecipeError(f"model.from: Keras cannot load this model: {first}. Received: "
                          f"from='{config.from_}'") from None


def build_model(recipe: Recipe):
    """Call the recipe's builder under the ``trainer.precision`` dtype policy and check what it
    returned (no compile; see :mod:`kerasdist.keras.precision`).

    With ``model.from`` the saved model is loaded instead of calling the builder; then the
    layers ``model.trainable_layers`` does not match are frozen.

    Returns:
        ``(model, spec)``: the uncompiled ``keras.Model`` and its registry ``ModelSpec``.

    Raises:
        RecipeError: unknown builder; the builder refused ``model.params`` (a ``ValueError`` or
            ``TypeError``, e.g. ``dropout: 2.0``); it returned no ``keras.Model`` or a compiled one;
            ``model.from`` cannot be loaded; ``model.trainable_layers`` matches no layer.
    """
    import keras

    from kerasdist.keras.precision import float32_output, policy_scope
    from kerasdist.models import registry

    config, precision = recipe.model, recipe.trainer.precision
    spec = registry.check(config)
    if config.from_ is not None:
        model = _load_saved(config, precision)
    else:
        try:
            with policy_scope(precision):
                model = spec.build(**config.params)
        except (ValueError, TypeError) as err:
            raise RecipeError(f"model.params: builder '{config.name}' refused its parameters: "
                              f"{err}. Received: params={dict(config.params)!r}") from None
    if not isinstance(model, keras.Model):
        raise RecipeError(f"model.name: builder '{config.name}' must return an uncompiled "
                          f"keras.Model. Received: {type(model).__name__}")
    if getattr(model, "compiled", False) or getattr(model, "optimizer", None) is not None:
        raise RecipeError(f"model.name: builder '{config.name}' must return an uncompiled "
                          "keras.Model (kerasdist compiles it with the recipe's optimizer, loss and "
                          "metrics). Received: a model compiled with optimizer "
                          f"{type(getattr(model, 'optimizer', None)).__name__}")
    freeze_layers(model, config.trainable_layers)
    return float32_output(model, precision), spec


def build_compiled_model(recipe: Recipe, num_replicas: int = 1, **compile_kwargs):
    """Build and compile the recipe's model. Call inside ``strategy.scope()``.

    Args:
        recipe: the validated recipe (``model``, ``optimizer``).
        num_replicas: replicas in sync (for ``optimizer.scale_lr_by_replicas``).
        compile_kwargs: extra ``model.compile`` arguments (e.g. ``steps_per_execution``).

    Returns:
        The compiled ``keras.Model``; its optimizer is not built yet. With
        ``trainer.precision: mixed_float16`` the optimizer is a ``LossScaleOptimizer``; with
        ``trainer.gradient_accumulation_steps: k > 1`` each training step runs ``k`` micro-batches
        per replica and applies the optimizer once (:mod:`kerasdist.keras.accumulation`).

    Raises:
        RecipeError: unknown builder, loss or metric; parameters the builder refuses; a builder
            that does not return an uncompiled ``keras.Model`` (see :func:`build_model`); a global
            batch that does not divide by ``num_replicas x gradient_accumulation_steps``.
    """
    from kerasdist.keras.accumulation import accumulate_gradients, check_divisible
    from kerasdist.keras.precision import wrap_optimizer

    trainer = recipe.trainer
    check_divisible(recipe.data.batch_size, num_replicas, trainer.gradient_accumulation_steps)
    model, spec = build_model(recipe)
    from kerasdist.training.keras_objects import make_metrics

    loss = make_loss(spec.loss)  # float32 (floatx) whatever the policy: casts the logits
    metrics = make_metrics(spec.metrics)
    optimizer = wrap_optimizer(make_optimizer(recipe.optimizer, num_replicas), trainer.precision)
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, **compile_kwargs)
    steps = trainer.gradient_accumulation_steps
    if steps > 1 or trainer.precision != "float32":
        log.info(f"precision {trainer.precision}; gradient accumulation: {steps} micro-batch(es) "
                 f"of {recipe.data.batch_size // (num_replicas * steps)} examples per replica "
                 "per optimizer update")
    return accumulate_gradients(model, steps)


def freeze_layers(model, patterns: Sequence[str] | None) -> None:
    """Freeze every top-level layer of ``model`` whose name matches none of ``patterns``
    (``fnmatch`` globs; ``model.trainable_layers``). None leaves the model as it is.

    Raises:
        RecipeError: a pattern matching no layer, or no trainable weight left.
    """
    if patterns is None:
        return
    names = [layer.name for layer in model.layers]
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise RecipeError(f"model.trainable_layers: '{pattern}' matches no layer of the model "
                              f"(its layers: {', '.join(names)}). Received: "
                              f"trainable_layers={list(patterns)!r}")
    for layer in model.layers:
        layer.trainable = any(fnmatch.fnmatchcase(layer.name, p) for p in patterns)
    if not model.trainable_weights:
        raise RecipeError("model.trainable_layers: the layers it names hold no trainable weight, "
                          f"so nothing would train. Received: trainable_layers={list(patterns)!r}")

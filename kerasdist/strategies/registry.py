"""Registry of strategy objects (:class:`kerasdist.strategies.base.Strategy`), one per kind.

Built-in kinds are registered by module path and imported on first use, so listing or validating
strategies never imports TensorFlow. :func:`register` adds a kind from anywhere (a user package, a
test module): its config class becomes valid in recipes and the run lifecycle runs it unchanged.

Example::

    from kerasdist import strategies
    strategies.get("mirrored").traits.topology   # 'single'
"""

from __future__ import annotations

from kerasdist._registry import LazyRegistry
from kerasdist.config.schema import register_strategy_config, strategy_config_classes
from kerasdist.errors import RecipeError
from kerasdist.strategies.base import Strategy

_BUILTIN: dict[str, str] = {
    "default": "kerasdist.strategies.default:DefaultStrategy",
    "mirrored": "kerasdist.strategies.mirrored:MirroredStrategy",
    "multi_worker": "kerasdist.strategies.multi_worker:MultiWorkerStrategy",
    "parameter_server": "kerasdist.strategies.parameter_server:ParameterServerStrategy",
}
_KINDS = LazyRegistry(_BUILTIN, unknown=lambda kind: RecipeError(
    f"strategy.kind: unknown strategy '{kind}'. Available: {', '.join(available())}"))


def register(strategy: Strategy | type[Strategy]) -> Strategy:
    """Register a strategy object (or class, instantiated with no arguments) under its ``kind``;
    its ``config_class`` becomes valid as the recipe's ``strategy`` section. Returns the object.

    Raises:
        RecipeError: not a :class:`Strategy`, or no ``kind`` / ``config_class``.
    """
    obj = strategy() if isinstance(strategy, type) else strategy
    if not isinstance(obj, Strategy) or not getattr(obj, "kind", None) \
            or not hasattr(obj, "config_class"):
        raise RecipeError("register() takes a kerasdist.strategies.Strategy with `kind` and "
                          f"`config_class`. Received: {strategy!r}")
    register_strategy_config(obj.config_class)
    return _KINDS.register(obj.kind, obj)


def available() -> list[str]:
    """Registered strategy kinds, sorted."""
    return sorted(set(_KINDS.available()) | set(strategy_config_classes()))


get = _KINDS.get
"""``get(kind)``: the strategy object of ``kind``; an unknown kind is a ``RecipeError`` listing the
available ones."""


def for_recipe(recipe) -> Strategy:
    """The strategy object of a recipe's ``strategy.kind``."""
    return get(recipe.strategy.kind)


def build(strategy_config, **kwargs):
    """Build the ``tf.distribute.Strategy`` a strategy config section describes (``kwargs``:
    ``cluster_resolver=`` for cluster kinds)."""
    return get(strategy_config.kind).build(strategy_config, **kwargs)

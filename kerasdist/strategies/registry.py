"""Registry of strategies, one module each. ``get(kind)`` returns the module's ``build`` function.

Each strategy module defines ``build(strategy_config, **kwargs) -> tf.distribute.Strategy``. Modules are
imported lazily, so listing or validating strategies never imports TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from kerasdist.errors import RecipeError

_MODULES: dict[str, str] = {
    "default": "kerasdist.strategies.default",
    "mirrored": "kerasdist.strategies.mirrored",
    "multi_worker": "kerasdist.strategies.multi_worker",
    "parameter_server": "kerasdist.strategies.parameter_server",
}


def register(kind: str, module: str) -> None:
    """Register strategy ``kind`` implemented by ``module`` (which defines ``build``)."""
    _MODULES[kind] = module


def available() -> list[str]:
    """Registered strategy kinds, sorted."""
    return sorted(_MODULES)


def get(kind: str) -> Callable[[Any], Any]:
    """The ``build`` function of strategy ``kind``.

    Raises:
        RecipeError: unknown kind; the message lists the available ones.
    """
    if kind not in _MODULES:
        raise RecipeError(f"strategy.kind: unknown strategy '{kind}'. "
                          f"Available: {', '.join(available())}")
    return importlib.import_module(_MODULES[kind]).build


def build(strategy_config: Any, **kwargs: Any):
    """Build the ``tf.distribute.Strategy`` described by a strategy config section.

    ``kwargs`` go to the strategy's ``build`` (e.g. ``cluster_resolver=`` for cluster strategies).
    """
    return get(strategy_config.kind)(strategy_config, **kwargs)

"""Strategy objects, one module per kind, found through a registry (``default``, ``mirrored``,
``multi_worker``, ``parameter_server``); :class:`Strategy` is the base of new kinds."""

from kerasdist.strategies.base import Strategy
from kerasdist.strategies.context import RunContext
from kerasdist.strategies.registry import available, build, for_recipe, get, register

__all__ = ["RunContext", "Strategy", "available", "build", "for_recipe", "get", "register"]

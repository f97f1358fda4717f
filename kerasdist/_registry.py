"""Objects found by a kind's name, the built-in kinds imported on first use: the one registry of
strategies (:mod:`kerasdist.strategies.registry`), data sources (:mod:`kerasdist.data.sources`)
and cluster kinds (:mod:`kerasdist.launch.clusters`). Listing or validating kinds imports none of
their modules (nor TensorFlow)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


class LazyRegistry:
    """The object of each kind: built in, or registered from anywhere (a user package, a test).

    Args:
        builtin: ``{kind: 'package.module:Name'}``; ``Name`` is imported and instantiated with
            no arguments the first time :meth:`get` asks for its kind.
        unknown: ``unknown(kind)`` -> the exception :meth:`get` raises for a kind neither built
            in nor registered (the caller's error class and words, listing the available kinds).
        adopt: ``adopt(kind, obj)`` -> the object to keep, for every object registered, built-in
            ones included (checks it, names it); default: ``obj`` as it is.
    """

    def __init__(self, builtin: Mapping[str, str], *, unknown: Callable[[str], Exception],
                 adopt: Callable[[str, Any], Any] | None = None):
        self._builtin = builtin
        self._unknown = unknown
        self._adopt = adopt
        self._objects: dict[str, Any] = {}

    def available(self) -> list[str]:
        """The built-in and registered kinds, sorted."""
        return sorted(set(self._builtin) | set(self._objects))

    def register(self, kind: str, obj: Any) -> Any:
        """Keep ``obj`` (through ``adopt``) as the object of ``kind``, replacing an earlier one;
        returns what is kept. Raises what ``adopt`` raises."""
        self._objects[kind] = obj if self._adopt is None else self._adopt(kind, obj)
        return self._objects[kind]

    def get(self, kind: str) -> Any:
        """The object of ``kind``. Raises ``unknown(kind)`` for a kind not there."""
        if kind not in self._objects:
            if kind not in self._builtin:
                raise self._unknown(kind)
            module, _, name = self._builtin[kind].partition(":")
            self.register(kind, getattr(importlib.import_module(module), name)())
        return self._objects[kind]


__all__ = ["LazyRegistry"]

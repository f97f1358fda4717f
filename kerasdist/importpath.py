"""Import a user's object from a recipe's import path ``package.module:Name``.

One loader for every recipe field that names user code (``model.name``, ``data.function``,
``optimizer.name``, a loss, metric or callback ``class_name``), so each gets the same checks and
the same messages: the field, what went wrong, and the text received.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any


def is_builtin(obj: Any) -> bool:
    """True for a Python built-in (``os:system``, ``builtins:eval``...), which a recipe may not
    name as its own code."""
    return inspect.isbuiltin(obj) or getattr(obj, "__module__", None) == "builtins"


def import_attribute(path: str, *, field: str, error: type[Exception], received: str,
                     what: str = "") -> Any:
    """The object ``Name`` of ``package.module:Name`` (``Name`` may be dotted: ``Outer.Inner``).

    Args:
        path: the import path as written in the recipe.
        field: the recipe field, first in every message (``model.name``).
        error: the exception class raised (``RecipeError``, ``DataError``).
        received: how the message shows the input (``name='pkg.mod:fn'``).
        what: what ``Name`` must be, for the "has no" message (``callable``, ``Python
            function``); empty: any attribute.

    Raises:
        error: the module cannot be imported, its import raised, it has no such name, or the
            name is a Python built-in.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise error(f"{field}: cannot import module '{module_name}' ({err}). "
                    f"Received: {received}") from None
    except Exception as err:  # noqa: BLE001 - the module's own code failed while being imported
        raise error(f"{field}: importing module '{module_name}' raised "
                    f"{type(err).__name__}: {err}. Received: {received}") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None or (what and not callable(obj)):
            kind = f"{what} " if what else ""
            raise error(f"{field}: module '{module_name}' has no {kind}'{attr}'. "
                        f"Received: {received}")
    return obj

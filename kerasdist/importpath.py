"""Import a user's object from a recipe's import path ``package.module:Name``.

One loader for every recipe field that names user code, so each gets the same checks and messages
(docs/own-model-and-data.md, "Import paths: where they are found and what runs when").
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Iterator, Sequence

_SEARCH: list[tuple[str, ...]] = []
"""The folders of the innermost :func:`user_code_on_path` block (a stack: blocks nest)."""


def user_folders(recipe: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The folders import paths are looked up in before ``PYTHONPATH``: the working directory
    and, when given, the recipe file's folder; absolute, without repeats."""
    folders = [os.getcwd()]
    if recipe:
        folders.append(str(Path(recipe).resolve().parent))
    return tuple(dict.fromkeys(folders))


@contextlib.contextmanager
def user_code_on_path(recipe: str | os.PathLike | None = None) -> Iterator[tuple[str, ...]]:
    """Within this block, :func:`user_folders` lead ``sys.path`` and :func:`child_pythonpath`
    hands them to every task started; afterwards ``sys.path`` is as it was.

    Args:
        recipe: the recipe file, whose folder is searched after the working directory (None: not).

    Yields:
        The folders, first searched first.
    """
    folders = user_folders(recipe)
    added = [folder for folder in folders if folder not in sys.path]
    sys.path[:0] = added
    _SEARCH.append(folders)
    try:
        yield folders
    finally:
        _SEARCH.pop()
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def child_pythonpath(current: str | None) -> str:
    """``PYTHONPATH`` for a task started inside :func:`user_code_on_path`: its folders first, then
    ``current`` (the value the task would otherwise get), without repeats. Outside such a block,
    ``current`` unchanged ("" for None)."""
    folders = _SEARCH[-1] if _SEARCH else ()
    entries = [*folders, *(current or "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(entry for entry in entries if entry))


def _not_found(module_name: str, err: ImportError) -> str:
    """What a not-found message adds: where it looked and how to fix it; for a module found
    whose own import of another module failed, that module's name."""
    missing = getattr(err, "name", None) or ""
    if missing and missing != module_name and not module_name.startswith(f"{missing}."):
        return (f"module '{module_name}' was found, but its own import of '{missing}' failed "
                f"({err}); install '{missing}' or fix that import")
    folders = [entry or os.getcwd() for entry in sys.path]
    shown = ", ".join(folders[:4]) + (f" and {len(folders) - 4} more" if len(folders) > 4 else "")
    return (f"no module '{module_name}' in the working directory, the recipe's folder, "
            f"PYTHONPATH or the installed packages (looked in {shown}); run kerasdist from the "
            f"folder that holds '{module_name.partition('.')[0]}', put it beside the recipe, add "
            "its folder to PYTHONPATH, or pip install it")


def is_builtin(obj: Any) -> bool:
    """True for a Python built-in (``os:system``, ``builtins:eval``...), which a recipe may not
    name as its own code."""
    return inspect.isbuiltin(obj) or getattr(obj, "__module__", None) == "builtins"


def is_standard_library(obj: Any, module_name: str = "") -> bool:
    """True when ``obj`` (or the module ``module_name`` it was imported from) belongs to Python's
    standard library (``subprocess:Popen``): its file lies in ``sysconfig``'s ``stdlib``/
    ``platstdlib`` or it has none, so a user's ``test.py`` shadowing a standard name is not."""
    library = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    for name in (module_name, getattr(obj, "__module__", None) or ""):
        top = name.partition(".")[0]
        if top not in sys.stdlib_module_names:
            continue
        file = getattr(sys.modules.get(top), "__file__", None)
        if file is None or any(folder in Path(file).resolve().parents for folder in library):
            return True
    return False


def describe(obj: Any) -> str:
    """How a message names an imported object: ``class subprocess.Popen``, ``function
    my_pkg.build``, ``module json``, ``an instance of Foo``."""
    if inspect.isclass(obj):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if inspect.ismodule(obj):
        return f"module {obj.__name__}"
    if inspect.isroutine(obj):
        module = getattr(obj, "__module__", None) or "?"
        return f"function {module}.{getattr(obj, '__qualname__', repr(obj))}"
    return f"an instance of {type(obj).__qualname__}"


def takes_positional(fn: Any, counts: Sequence[int]) -> bool:
    """Whether ``fn`` can be called with one of ``counts`` positional arguments (its signature is
    bound, nothing is called). A callable without a readable signature counts as taking them."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    for count in counts:
        try:
            signature.bind(*[None] * count)
            return True
        except TypeError:
            continue
    return False


def require_kind(obj: Any, path: str, *, field: str, error: type[Exception], what: str,
                 classes: tuple[type, ...] = (),
                 function_args: Sequence[int] | None = None) -> Any:
    """Check an imported object against what its recipe field documents, before anything
    constructs or calls it: a subclass or instance of one of ``classes``, or a callable taking
    ``function_args``; never a built-in or anything of the standard library.

    Args:
        obj: what :func:`import_attribute` returned for ``path``.
        path: the import path as written in the recipe (``pkg.mod:Name``).
        field: the recipe field, first in the message (``callbacks.0``).
        error: the exception class raised (``RecipeError``, ``DataError``).
        what: the documented kind, for the message (``a keras.callbacks.Callback subclass``).
        classes: the accepted base classes (default none: functions only).
        function_args: the accepted numbers of positional arguments of a function; empty: any
            function; None (default): no function accepted.

    Returns:
        ``obj``, unchanged.

    Raises:
        error: ``obj`` is not of the documented kind; the message names ``field``, says what
            ``obj`` is and that nothing was built or called, and shows ``path``.
    """
    if inspect.isclass(obj):
        fits = bool(classes) and issubclass(obj, classes)
    elif classes and isinstance(obj, classes):
        fits = True
    else:
        fits = function_args is not None and callable(obj) and not inspect.ismodule(obj) and \
            (not function_args or takes_positional(obj, function_args))
    if fits and (is_builtin(obj) or is_standard_library(obj, path.partition(":")[0])):
        raise error(f"{field}: '{path}' is {describe(obj)} of Python's standard library, not code "
                    f"of your own; it is refused unbuilt and uncalled. Received: {path!r}")
    if not fits:
        raise error(f"{field}: must name {what}; '{path}' is {describe(obj)}, so it is refused "
                    f"unbuilt and uncalled. Received: {path!r}")
    return obj


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
        error: the module cannot be imported, its import raised, or it has no such name.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise error(f"{field}: cannot import module '{module_name}': "
                    f"{_not_found(module_name, err)}. Received: {received}") from None
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

"""The one way a mend installs and removes its patches: under one lock, marked, recorded.

A mend lists its targets as :class:`Patch` ``(owner, attribute, wrap)`` (``owner`` a class or a
module, ``wrap(original) -> replacement``); :func:`uninstall` puts back exactly what was there,
whatever order the mends were installed in, and :func:`original` gives a probe the upstream object
even while the mend is in place. Nothing here imports Keras or TensorFlow.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

MARK = "_kerasdist_mend"
"""The attribute each replacement carries: the name of the mend that installed it."""

_LOCK = threading.RLock()
_ABSENT = object()  # the owner had no attribute of its own (it inherited it)
_RECORD: dict[tuple[int, str], tuple[str, Any, str, Any]] = {}  # (id(owner), attr) -> entry


class Patch(NamedTuple):
    """One target of a mend: ``owner.attribute`` becomes ``wrap(<the upstream object>)``."""

    owner: Any
    attribute: str
    wrap: Callable[[Any], Any]


def _own(owner, attribute: str):
    return vars(owner).get(attribute, _ABSENT)


def is_patched(owner, attribute: str, mend: str) -> bool:
    """Whether ``owner.attribute`` is ``mend``'s replacement (its own attribute, not inherited)."""
    return getattr(_own(owner, attribute), MARK, None) == mend


def original(owner, attribute: str):
    """The upstream ``owner.attribute``: what a mend replaced, or what is there when none did."""
    with _LOCK:
        entry = _RECORD.get((id(owner), attribute))
        if entry is not None and entry[1] is owner:
            return _inherited(owner, attribute) if entry[3] is _ABSENT else entry[3]
        own = _own(owner, attribute)
        return own if own is not _ABSENT else getattr(owner, attribute)


def _inherited(owner, attribute: str):
    for base in owner.__mro__[1:]:
        if attribute in vars(base):
            return vars(base)[attribute]
    raise AttributeError(f"{_name(owner, attribute)}: no base class has it")


def installed(mend: str, patches: Iterable[Patch]) -> bool:
    """Whether every target of ``patches`` holds ``mend``'s replacement."""
    patches = list(patches)
    return bool(patches) and all(is_patched(p.owner, p.attribute, mend) for p in patches)


def install(mend: str, patches: Iterable[Patch], bug_present: Callable[[], bool] | None = None) -> bool:
    """Replace every target of ``patches`` (those not yet replaced) when ``bug_present()`` says
    the bug is there (None: install unconditionally). Idempotent and thread-safe.

    Returns:
        True when the mend is in effect after the call, False when the probe found no bug.

    Raises:
        RuntimeError: a target already holds another mend's replacement (two mends on one
            target would be put back in the wrong order).
    """
    with _LOCK:
        patches = list(patches)
        if installed(mend, patches):
            return True
        if bug_present is not None and not bug_present():
            return False
        for owner, attribute, wrap in patches:
            if is_patched(owner, attribute, mend):
                continue
            own = _own(owner, attribute)
            other = getattr(own, MARK, None)
            if other is not None and (id(owner), attribute) in _RECORD:
                raise RuntimeError(f"{_name(owner, attribute)} is already patched by mend {other!r}; "
                                   f"mend {mend!r} cannot patch it too")
            replacement = wrap(own if own is not _ABSENT else getattr(owner, attribute))
            setattr(replacement, MARK, mend)
            _RECORD[(id(owner), attribute)] = (mend, owner, attribute, own)
            setattr(owner, attribute, replacement)
        return True


def uninstall(mend: str) -> None:
    """Put back every target ``mend`` replaced (tests only). Idempotent."""
    with _LOCK:
        for key, (name, owner, attribute, own) in list(_RECORD.items()):
            if name != mend:
                continue
            if own is _ABSENT:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, own)
            del _RECORD[key]


@contextlib.contextmanager
def swapped(owner, attribute: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """Within the block only, ``owner.attribute`` is ``wrap(<its own attribute>)`` (a mend that
    applies to one call, not the process); the attribute is put back on exit, also after an error.

    Raises:
        KeyError: ``owner`` has no attribute of its own by that name (it inherits it).
    """
    own = vars(owner)[attribute]
    setattr(owner, attribute, wrap(own))
    try:
        yield
    finally:
        setattr(owner, attribute, own)


def records() -> list[dict[str, str]]:
    """``[{"mend": name, "target": "module.Class.attribute"}, ...]`` for every replaced target."""
    with _LOCK:
        return [{"mend": name, "target": _name(owner, attribute)}
                for name, owner, attribute, _ in _RECORD.values()]


def _name(owner, attribute: str) -> str:
    module = getattr(owner, "__module__", None)
    qualname = getattr(owner, "__qualname__", getattr(owner, "__name__", repr(owner)))
    return f"{module}.{qualname}.{attribute}" if module and isinstance(owner, type) else \
        f"{qualname}.{attribute}"


def signature(obj) -> str:
    """``str(inspect.signature(obj))``, or the object's type name when it has none."""
    import inspect

    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return type(obj).__name__


def functions(module_name: str):
    """``(installed, install, uninstall)`` for the mend module ``module_name``, which defines
    ``NAME``, ``bug_present()`` and ``_patches()`` (a list of :class:`Patch`), looked up at call
    time: :func:`installed`, :func:`install` with the probe, :func:`uninstall` (tests only)."""
    import sys

    def module():
        return sys.modules[module_name]

    def installed_() -> bool:
        return installed(module().NAME, module()._patches())

    def install_() -> bool:
        return install(module().NAME, module()._patches(), module().bug_present)

    def uninstall_() -> None:
        uninstall(module().NAME)

    return installed_, install_, uninstall_

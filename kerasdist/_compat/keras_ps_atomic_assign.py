"""Mend: Keras 3 ``Variable.assign_add``/``assign_sub`` are a read then a write, not one atomic op.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21, CPU): a model compiled under
``ParameterServerStrategy`` with 2 workers, 60 ``train_step`` calls scheduled through
``ClusterCoordinator.schedule``: ``optimizer.iterations`` ends short of 60 (53 once), the metrics'
``count`` variables short by as much. Keras's ``Variable.assign_add`` is ``self.assign(self +
value)``: two workers running it on one ps variable at once lose an update, where
``tf.Variable.assign_add`` is one ``AssignAddVariableOp`` on the ps.

:func:`atomic_updates` patches only the given variable *objects* (not the Keras class) during a
``with`` block in which kerasdist traces its parameter-server steps; the traced graphs keep the
atomic ops. Probe: :func:`bug_present` (``assign_add`` still reads then writes).
"""

from __future__ import annotations

import contextlib
import inspect
import types
from typing import Iterable, Iterator

NAME = "keras-ps-atomic-assign"
ISSUE = "no upstream issue; reproduction in this module's docstring"
_NAMES = ("assign_add", "assign_sub")


def bug_present() -> bool:
    """Whether Keras's variable ``assign_add``/``assign_sub`` are still ``assign(self +/- value)``."""
    from keras.src.backend.common.variables import Variable

    sources = ["".join(inspect.getsource(getattr(Variable, name)).split()) for name in _NAMES]
    return all("returnself.assign(self" in source for source in sources)


def _atomic(variable, name: str):
    original = getattr(variable, name)

    def method(self, value):
        from keras.src.backend.common.stateless_scope import in_stateless_scope

        if self._value is None or in_stateless_scope():  # symbolic build, stateless calls
            return original(value)
        return getattr(self._value, name)(self._convert_to_tensor(value, dtype=self._dtype))

    return types.MethodType(method, variable)


@contextlib.contextmanager
def atomic_updates(variables: Iterable) -> Iterator[list]:
    """Within the block, ``assign_add``/``assign_sub`` of these Keras variables are single atomic
    ``tf.Variable`` ops. Yields the patched variables; removes the instance attributes on exit.
    A no-op when :func:`bug_present` is False (upstream fixed)."""
    unique = list({id(v): v for v in variables if hasattr(v, "_value")}.values())
    if not bug_present():
        yield []
        return
    for variable in unique:
        for name in _NAMES:
            setattr(variable, name, _atomic(variable, name))
    try:
        yield unique
    finally:
        for variable in unique:
            for name in _NAMES:
                variable.__dict__.pop(name, None)

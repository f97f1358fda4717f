"""Keras's "Your input ran out of data" warning at the normal end of an input of unknown size.

Upstream: https://github.com/keras-team/keras/pull/23360 ("Only warn about running out of data
when ``steps_per_epoch`` was set"; merged after Keras 3.15.1). Reproduction (Keras 3.15.1 / TF
2.21): ``model.evaluate`` of a ``tf.data.Dataset`` of unknown cardinality (read from files,
``filter``, ``distribute_datasets_from_function``) reads it to its end, as documented, then warns
``UserWarning: Your input ran out of data; interrupting training``:
``EpochIterator.catch_stop_iteration`` warns on every ``StopIteration``, although no ``steps``
were asked for. kerasdist meets it in every run with a held-out split of unknown size.

Not a patch: :func:`quiet_end_of_input` ignores that one warning while kerasdist's own loop runs
``fit``/``evaluate`` with no evaluation ``steps`` (its training input is endless, so only the
finite evaluation input can end there); with ``trainer.validation_steps`` set it is kept. Probe:
:func:`bug_present`; ``tests/unit/test_quiet_input.py`` fails once upstream's fix is installed.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Iterator

NAME = "keras#23360"
ISSUE = "https://github.com/keras-team/keras/pull/23360"
MESSAGE = r"Your input ran out of data"
"""The start of the warning's text (a regular expression for ``warnings.filterwarnings``)."""


def bug_present() -> bool:
    """Whether Keras's ``EpochIterator.catch_stop_iteration`` warns on every ``StopIteration``,
    without asking whether ``steps_per_epoch`` was set (source check)."""
    from keras.src.trainers import epoch_iterator

    source = inspect.getsource(epoch_iterator.EpochIterator.catch_stop_iteration)
    return "_interrupted_warning()" in source and "steps_per_epoch" not in source


@contextlib.contextmanager
def quiet_end_of_input(*, steps_declared: bool) -> Iterator[None]:
    """Within this block, Keras's "ran out of data" warning is ignored, unless
    ``steps_declared`` (evaluation ``steps`` were asked for: then it means what it says) or the
    installed Keras no longer has the bug. Other warnings are untouched.

    Args:
        steps_declared: whether the ``fit``/``evaluate`` calls of the block pass evaluation
            steps (``validation_steps``/``steps``; kerasdist: ``trainer.validation_steps``).
    """
    if steps_declared or not bug_present():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MESSAGE, category=UserWarning)
        yield

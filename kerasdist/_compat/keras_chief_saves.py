"""Mend: ``Model.save`` / ``save_weights`` / ``export`` written by every worker corrupt the file.

Upstream: no Keras issue found (Keras 3.15 has no chief/worker logic in saving); reproduction: a
script ending with ``model.save("out/model.keras")`` after ``fit``, run unchanged by ``kerasdist
launch --workers 2``: both workers write the same path at once and a later ``load_model`` raises
``BadZipFile: Truncated file header``; ``save_weights`` and ``export`` race the same way.

Mend (installed by :func:`kerasdist.keras.enable`), in multi-worker mode
(:func:`kerasdist._compat._fakes.is_multi_worker`), by the protocol of
:mod:`kerasdist._compat._worker_saves`: the chief (task ``chief``, else ``worker`` 0) writes the
user's path atomically (staged next to it, then ``os.replace``); every other worker runs the same
save (reading distributed values may need collectives) into a staging folder of its own; every
worker then passes a barrier the chief enters only after its file is in place (a ``load_model``
right after any worker's call never sees a partial file); a worker that then does not see the
chief's file at its path (a disk of its own) moves its copy into place, one that sees it drops
its copy. The same applies to ``keras.saving.save_model(model, path)``. Outside multi-worker mode,
for remote paths (``gs://`` ...) and inside the chief-aware callbacks (which stage their own
saves), Keras's own code runs unchanged.
"""

from __future__ import annotations

import functools
import os

from kerasdist._compat import _patch
from kerasdist._compat import _worker_saves as saves
from kerasdist._compat import keras_chief_callbacks as chief
from kerasdist._compat._fakes import is_multi_worker
from kerasdist._compat._worker_saves import inside, passthrough

NAME = "keras-chief-saves"
ISSUE = "no upstream issue found; reproduction in this module's docstring"
_METHODS = ("save", "save_weights", "export")


def _model_class():
    from keras.src.models.model import Model

    return Model


def _saving_modules():
    import keras
    from keras.src.saving import saving_api

    return keras.saving, saving_api


def _distributed_save(model, call, filepath) -> object:
    target = os.path.abspath(os.fspath(filepath))
    if chief.role(model) == "chief":
        with saves.chief_turn(model):
            return saves.staged_write(call, target)
    parent = os.path.dirname(target) or "."
    with saves.worker_save(model, parent) as save:
        return call(os.path.join(save.folder, os.path.basename(target)))


def _applies(model, filepath) -> bool:
    if inside() or not isinstance(filepath, (str, os.PathLike)):
        return False
    strategy = getattr(model, "distribute_strategy", None)
    return is_multi_worker(strategy) and not chief._is_remote(os.fspath(filepath))


def _mended(original):
    """``Model.save``/``save_weights``/``export`` (``model`` is ``self``) and
    ``keras.saving.save_model(model, filepath, ...)``, distributed as the module docs say."""
    @functools.wraps(original)
    def save(model, filepath, *args, **kwargs):
        if not _applies(model, filepath):
            return original(model, filepath, *args, **kwargs)
        with passthrough():
            return _distributed_save(
                model, lambda path: original(model, path, *args, **kwargs), filepath)

    return save


def bug_present() -> bool:
    """Whether Keras's ``Model.save`` still has no chief/worker logic (source check, no TF op)."""
    import inspect

    model = _model_class()
    source = "".join(inspect.getsource(_patch.original(model, name)) for name in _METHODS)
    return "cluster_resolver" not in source and "is_chief" not in source


def _patches():
    model = _model_class()
    return ([_patch.Patch(model, name, _mended) for name in _METHODS]
            + [_patch.Patch(module, "save_model", _mended) for module in _saving_modules()])


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions

"""Mend: Keras 3's ``ModelCheckpoint`` and ``BackupAndRestore`` are not multi-worker safe, and
their saves are not atomic.

Upstream: no Keras 3 issue for the multi-worker part (no Keras 3.15 callback has chief/worker
logic; tf_keras had non-chief workers write temporary copies). Reproduction:
``tests/scripts/mwms_backup_restore.py`` (ONE shared ``backup_dir`` and ``ModelCheckpoint`` path, as
TensorFlow's multi-worker tutorial) under ``kerasdist launch --workers 2`` without this mend: both
workers write the same files and one fails (h5py's "unable to lock file", ``BadZipFile``,
``FileExistsError``, or a ``CollectiveBcastRecv`` abort while loading a half-written file). Not
atomic: ``.keras`` and ``.weights.h5`` saves truncate the target before the new content exists, so
a crash mid-save loses the previous file (keras-team/keras#20463, closed by #20465 with the opt-in
``double_checkpoint``, not an atomic write).

Mend (installed by :func:`kerasdist.keras.enable`): every write of the user's path is staged in
the target's folder (``.kerasdist-staging-*``) and moved over it with ``os.replace`` (weights
first, then ``training_metadata.json``). In multi-worker mode
(:func:`kerasdist._compat._fakes.is_multi_worker`) the chief (task ``chief``, else ``worker`` 0)
writes the user's path; every other worker still runs the save (reading distributed values may
need collectives) and keeps its copy only on a disk of its own
(:mod:`kerasdist._compat._worker_saves`). ``BackupAndRestore`` there: every worker restores at
train begin and nobody writes the backup folder then (the ``double_checkpoint`` fallback loads the
``.bkp`` files instead of copying them back); at a successful train end the chief deletes the
shared backup, a worker one of its own. Remote paths (``gs://`` ...) are written in place by the
chief. Subclasses that override ``_save_model`` are not affected.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile

from kerasdist._compat import _patch
from kerasdist._compat._fakes import fake_multi_worker_strategy, is_multi_worker
from kerasdist._compat._worker_saves import (  # passthrough: the callbacks stage their own saves
    chief_turn,
    passthrough,
    staged_write,
    worker_save,
)
from kerasdist._compat._worker_saves import folder as _folder

NAME = "keras-chief-callbacks"
ISSUE = ("no upstream issue for the multi-worker race (reproduction: tests/scripts/"
         "mwms_backup_restore.py under `kerasdist launch --workers 2`); the lost file after a "
         "crash mid-save: https://github.com/keras-team/keras/issues/20463")
_SINGLE, _CHIEF, _OTHER = "single", "chief", "other"


def _classes():
    from keras.src.callbacks.backup_and_restore import BackupAndRestore
    from keras.src.callbacks.model_checkpoint import ModelCheckpoint

    return BackupAndRestore, ModelCheckpoint


def _is_chief(resolver) -> bool:
    """TF's rule: task ``chief`` if the cluster has that job, else ``worker`` 0."""
    jobs = resolver.cluster_spec().as_dict()
    if "chief" in jobs:
        return resolver.task_type == "chief"
    return resolver.task_type == "worker" and int(resolver.task_id or 0) == 0


def role(model) -> str:
    """``'single'`` (no multi-worker strategy), ``'chief'`` or ``'other'`` for ``model``'s strategy."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or not is_multi_worker(strategy):
        return _SINGLE
    return _CHIEF if _is_chief(strategy.cluster_resolver) else _OTHER


@contextlib.contextmanager
def _swapped(obj, **attributes):
    """Set ``attributes`` on ``obj`` for the block, then put the previous values back."""
    previous = {name: getattr(obj, name) for name in attributes}
    for name, value in attributes.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(obj, name, value)


def _is_remote(path) -> bool:
    from keras.src.utils import file_utils

    return file_utils.is_remote_path(path)


# --- BackupAndRestore -------------------------------------------------------------------------


def _keep_previous(callback, stage: str) -> None:
    """``double_checkpoint``: copy the current backup files to their ``.bkp`` names, atomically."""
    pairs = ((callback._weights_path, callback._prev_weights_path),
             (callback._training_metadata_path, callback._prev_training_metadata_path))
    for current, previous in pairs:
        if os.path.exists(current):
            staged = os.path.join(stage, os.path.basename(previous))
            shutil.copyfile(current, staged)
            os.replace(staged, previous)


def _backup_save(original):
    @functools.wraps(original)
    def _save_model(self):
        kind = role(self.model)
        if _is_remote(self.backup_dir):
            return original(self) if kind != _OTHER else None
        if kind == _OTHER:  # to its own disk, or dropped on the chief's shared folder
            with worker_save(self.model, self.backup_dir) as save:
                _staged_backup(self, original, save.folder, publish=False)
            if save.published:  # a backup of its own: it deletes it itself at train end
                self._kerasdist_own = True
            return None
        with _turn(self.model, kind), _folder(self.backup_dir) as folder:
            _staged_backup(self, original, folder, publish=True)
        return None

    return _save_model


def _staged_backup(callback, original, folder: str, *, publish: bool) -> None:
    """One backup written into ``folder``; with ``publish``, moved over the backup files (weights
    first: a crash between the two replays an epoch, never skips one)."""
    targets = (callback._weights_path, callback._training_metadata_path)
    if publish and callback.double_checkpoint:
        _keep_previous(callback, folder)
    staged = [os.path.join(folder, os.path.basename(path)) for path in targets]
    with _swapped(callback, backup_dir=folder, _weights_path=staged[0],
                  _training_metadata_path=staged[1], double_checkpoint=False), passthrough():
        original(callback)
    if publish:
        for source, target in zip(staged, targets, strict=True):
            if os.path.exists(source):
                os.replace(source, target)


def _load_previous(callback) -> None:
    """Load the ``double_checkpoint`` copies (``*.bkp``) without writing the shared folder: Keras
    loads weights only from a ``.weights.h5`` name, so the copy is read from a private one."""
    with _folder() as folder:
        weights = os.path.join(folder, os.path.basename(callback._weights_path))
        shutil.copyfile(callback._prev_weights_path, weights)
        with _swapped(callback, _weights_path=weights,
                      _training_metadata_path=callback._prev_training_metadata_path):
            callback._load_model()


def _backup_restore(original):
    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        if role(self.model) == _SINGLE:
            return original(self, logs)
        try:  # every worker reads; nobody writes the shared folder here
            self._load_model()
        except OSError:
            if not os.path.exists(self._prev_weights_path):
                raise
            _load_previous(self)
        return None

    return on_train_begin


def _backup_cleanup(original):
    @functools.wraps(original)
    def on_train_end(self, logs=None):
        if role(self.model) == _OTHER and not getattr(self, "_kerasdist_own", False):
            return None  # the chief deletes the shared backup
        return original(self, logs)

    return on_train_end


def _turn(model, kind: str):
    return chief_turn(model) if kind == _CHIEF else contextlib.nullcontext()


# --- ModelCheckpoint ---------------------------------------------------------------------------


class _StagedSaves:
    """Stands in for the model during one ``ModelCheckpoint._save_model`` call on the chief (or a
    single process): ``save`` and ``save_weights`` write into a staging folder next to the target,
    then move the finished file over it; every other attribute is the model's."""

    def __init__(self, model):
        self._kerasdist_model = model

    def __getattr__(self, name):
        return getattr(self._kerasdist_model, name)

    def _write(self, method, filepath, args, kwargs):
        if _is_remote(filepath):
            return method(filepath, *args, **kwargs)
        return staged_write(lambda path: method(path, *args, **kwargs),
                            os.path.abspath(os.fspath(filepath)))

    def save(self, filepath, *args, **kwargs):
        return self._write(self._kerasdist_model.save, filepath, args, kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        return self._write(self._kerasdist_model.save_weights, filepath, args, kwargs)


def _target_folder(callback, epoch, batch, logs) -> str:
    """The folder this save of ``callback`` (a ModelCheckpoint) writes into, with the path's
    placeholders (``{epoch}``, metrics) filled in as Keras fills them."""
    try:  # a private Keras method: if it goes, the templated-folder test of
        path = callback._get_file_path(epoch, batch, logs or {})  # test_chief_callbacks fails
    except (AttributeError, KeyError, IndexError, ValueError):  # Keras raises its own in the call
        path = callback.filepath
    return os.path.dirname(os.path.abspath(os.fspath(path)))


def _checkpoint_save(original):
    @functools.wraps(original)
    def _save_model(self, epoch, batch, logs):
        kind = role(self.model)
        parent = None if _is_remote(self.filepath) else _target_folder(self, epoch, batch, logs)
        if parent is not None and kind != _SINGLE:  # made before any barrier: Keras's own
            os.makedirs(parent, exist_ok=True)  # exists-then-makedirs on the chief cannot race
            # a worker's staging folder in the same place (FileExistsError)
        if kind != _OTHER:  # remote paths: written in place by the chief, no barrier
            turn = _turn(self.model, kind if parent is not None else _SINGLE)
            with turn, _swapped(self, _model=_StagedSaves(self._model)), passthrough():
                return original(self, epoch, batch, logs)
        if _is_remote(self.filepath):
            with _folder() as folder:  # a private folder, dropped
                private = os.path.join(folder, os.path.basename(self.filepath))
                with _swapped(self, filepath=private), passthrough():
                    return original(self, epoch, batch, logs)
        with worker_save(self.model, parent) as save:
            staged = os.path.join(save.folder, os.path.basename(self.filepath))
            with _swapped(self, filepath=staged), passthrough():
                return original(self, epoch, batch, logs)

    return _save_model


# --- install / probe ---------------------------------------------------------------------------


def _patches():
    backup, checkpoint = _classes()
    return [_patch.Patch(backup, "_save_model", _backup_save),
            _patch.Patch(backup, "on_train_begin", _backup_restore),
            _patch.Patch(backup, "on_train_end", _backup_cleanup),
            _patch.Patch(checkpoint, "_save_model", _checkpoint_save)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions


class _Recorder:
    """A stand-in model that records the paths it is asked to save to (writes nothing)."""

    def __init__(self, strategy):
        self.distribute_strategy, self.paths = strategy, []

    def save(self, filepath, *args, **kwargs):
        self.paths.append(os.fspath(filepath))

    save_weights = save


def bug_present() -> bool:
    """Probe: do the unmodified callbacks hand the user's own path to ``save``/``save_weights`` on
    a NON-chief worker (``worker:1`` of a fake 2-worker strategy)? That one symptom shows both
    defects: every worker writes the shared path, and it writes it in place.

    Calls the upstream ``_save_model`` of both callbacks on a recording stand-in model (no
    cluster, no TF op; the backup's json goes to a temporary folder, removed). Returns False when
    the methods are gone or no longer hand over the shared path, i.e. upstream changed them.
    """
    backup_cls, checkpoint_cls = _classes()
    model = _Recorder(fake_multi_worker_strategy(task_id=1))
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = checkpoint_cls(os.path.join(folder, "model.keras"))
        backup = backup_cls(os.path.join(folder, "backup"))
        try:
            for callback in (checkpoint, backup):
                callback.set_model(model)
            _patch.original(checkpoint_cls, "_save_model")(checkpoint, epoch=0, batch=None, logs={})
            _patch.original(backup_cls, "_save_model")(backup)
        except (AttributeError, TypeError, KeyError):
            return False
        shared = {checkpoint.filepath, backup._weights_path}
    return bool(shared & set(model.paths))

"""Keras's own ``ModelCheckpoint`` / ``BackupAndRestore`` with :mod:`kerasdist._compat.
keras_chief_callbacks`: atomic writes, chief-only writes of the shared path, no cluster.

The callbacks' hooks are called directly on a small real Keras model. Multi-worker roles come from
a fake (never initialised) 2-worker ``MultiWorkerMirroredStrategy`` set as the model's strategy,
seen from ``worker:0`` (the chief) or ``worker:1``. A crash mid-save is injected by making Keras's
``saving_lib._save_state`` raise once the target file is open for writing. The mends' barrier (an
all-reduce on a real cluster) is a no-op while one simulated worker runs, and a
``threading.Barrier`` where :func:`_as_two_workers` runs the chief and worker 1 in two threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

import keras
import numpy as np
import pytest

from kerasdist._compat import _fakes
from kerasdist._compat import keras_chief_callbacks as mend


@pytest.fixture
def mended():
    before = mend.installed()
    assert mend.install()
    yield
    if not before:
        mend.uninstall()


@pytest.fixture
def pristine():
    before = mend.installed()
    mend.uninstall()
    yield
    if before:
        mend.install()


@pytest.fixture(autouse=True)
def workers_barrier():
    """The mends' barrier for the fake strategies (module docs); yields the state that
    :func:`_as_two_workers` sets."""
    from kerasdist._compat import _worker_saves

    state = {"barrier": None}

    def barrier(strategy):
        if state["barrier"] is not None:
            state["barrier"].wait(timeout=60)

    with pytest.MonkeyPatch.context() as patch:  # not the tests' monkeypatch: they undo theirs
        patch.setattr(_worker_saves, "barrier", barrier)
        yield state


def _as_two_workers(state, chief_call, other_call):
    """Run the chief's and worker 1's call at once (two threads meeting at the barriers)."""
    state["barrier"] = threading.Barrier(2)
    raised = []

    def run(call):
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            raised.append(err)
            state["barrier"].abort()

    threads = [threading.Thread(target=run, args=(call,)) for call in (chief_call, other_call)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    state["barrier"] = None
    if raised:
        raise raised[0]


def _load(path, weights_only):
    if not weights_only:
        return keras.saving.load_model(path)
    model = _model()
    model.load_weights(path)
    return model


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """This process's system temp folder, so a test can see non-chief copies come and go."""
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _model(task_id=None):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    if task_id is not None:  # worker:<task_id> of a 2-worker cluster
        model._distribute_strategy = _fakes.fake_multi_worker_strategy(task_id)
    return model


def _bump(model, by=1.0):
    model.set_weights([w + by for w in model.get_weights()])
    return model.get_weights()


def _crash_mid_save(monkeypatch):
    from keras.src.saving import saving_lib

    def crash(*args, **kwargs):
        raise RuntimeError("injected crash mid-save")

    monkeypatch.setattr(saving_lib, "_save_state", crash)


def _same(left, right):
    return all(np.array_equal(a, b) for a, b in zip(left, right, strict=True))


def test_upstream_callbacks_still_write_the_shared_path_from_every_worker(pristine):
    assert mend.bug_present(), (
        "upstream Keras's ModelCheckpoint/BackupAndRestore no longer hand the shared path to a "
        "non-chief worker's save: check they are chief-aware and write atomically, then remove "
        "kerasdist/_compat/keras_chief_callbacks.py and its install in kerasdist.keras.enable")


def test_install_is_idempotent_and_enable_installs_it(pristine):
    from kerasdist._compat import keras_ps_dispatch
    from kerasdist.keras import enable

    dispatch_before = keras_ps_dispatch.is_enabled()
    method = keras.callbacks.ModelCheckpoint._save_model
    try:
        enable()
        assert mend.installed()
        wrapped = keras.callbacks.ModelCheckpoint._save_model
        assert mend.install() and keras.callbacks.ModelCheckpoint._save_model is wrapped
        mend.uninstall()
        assert keras.callbacks.ModelCheckpoint._save_model is method
    finally:
        if not dispatch_before:
            keras_ps_dispatch.disable()


def test_probe_runs_no_tensorflow_op():
    code = ("from kerasdist._compat import keras_chief_callbacks as m; m.bug_present(); m.install(); "
            "from tensorflow.python.eager import context; "
            "print('initialized' if context.context()._initialized else 'clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("clean"), out.stderr[-2000:]


@pytest.mark.parametrize("task_id", [None, 0], ids=["no-strategy", "chief"])
@pytest.mark.parametrize("weights_only", [False, True], ids=["keras", "weights.h5"])
def test_a_crash_mid_checkpoint_leaves_the_previous_file(mended, monkeypatch, tmp_path, task_id,
                                                         weights_only):
    path = tmp_path / "ckpt" / ("model.weights.h5" if weights_only else "model.keras")
    model = _model(task_id)
    callback = keras.callbacks.ModelCheckpoint(str(path), save_weights_only=weights_only)
    callback.set_model(model)
    callback.on_epoch_end(0, {"loss": 1.0})
    saved = model.get_weights()
    _bump(model)
    _crash_mid_save(monkeypatch)
    with pytest.raises(RuntimeError, match="injected crash"):
        callback.on_epoch_end(1, {"loss": 0.5})
    monkeypatch.undo()
    restored = _model()
    if weights_only:
        restored.load_weights(path)
    else:
        restored = keras.saving.load_model(path)
    assert _same(restored.get_weights(), saved)
    assert os.listdir(path.parent) == [path.name]  # the staging folder is gone


@pytest.mark.parametrize("task_id", [None, 0], ids=["no-strategy", "chief"])
def test_a_crash_mid_backup_leaves_the_previous_backup(mended, monkeypatch, tmp_path, task_id):
    backup_dir = tmp_path / "backup"
    model = _model(task_id)
    callback = keras.callbacks.BackupAndRestore(str(backup_dir))
    callback.set_model(model)
    callback.on_epoch_end(0)
    saved = model.get_weights()
    _bump(model)
    _crash_mid_save(monkeypatch)
    with pytest.raises(RuntimeError, match="injected crash"):
        callback.on_epoch_end(1)
    monkeypatch.undo()
    assert sorted(os.listdir(backup_dir)) == ["latest.weights.h5", "training_metadata.json"]
    assert json.loads((backup_dir / "training_metadata.json").read_text())["epoch"] == 1
    restored = _model()
    restored.load_weights(backup_dir / "latest.weights.h5")
    assert _same(restored.get_weights(), saved)


def test_upstream_checkpoint_still_truncates_before_writing(pristine, monkeypatch, tmp_path):
    """What the mend prevents (fails once Keras writes atomically itself)."""
    path = tmp_path / "model.keras"
    model = _model()
    callback = keras.callbacks.ModelCheckpoint(str(path))
    callback.set_model(model)
    callback.on_epoch_end(0, {"loss": 1.0})
    _crash_mid_save(monkeypatch)
    with pytest.raises(RuntimeError, match="injected crash"):
        callback.on_epoch_end(1, {"loss": 0.5})
    monkeypatch.undo()
    with pytest.raises(ValueError):  # the previous model is lost
        keras.saving.load_model(path)


def _spy_saves(monkeypatch, model):
    """Record (path, existed after the call) of every model.save / save_weights."""
    calls = []
    for name in ("save", "save_weights"):
        original = getattr(type(model), name)

        def spy(self, filepath, *args, _original=original, **kwargs):
            result = _original(self, filepath, *args, **kwargs)
            calls.append((str(filepath), os.path.exists(filepath)))
            return result

        monkeypatch.setattr(type(model), name, spy)
    return calls


@pytest.mark.parametrize("weights_only", [False, True], ids=["keras", "weights.h5"])
def test_on_a_folder_shared_with_the_chief_only_the_chief_writes(
        mended, workers_barrier, tmp_path, private_tmp, weights_only):
    path = tmp_path / "shared" / ("model.weights.h5" if weights_only else "model.keras")
    chief, other = _model(task_id=0), _model(task_id=1)
    _bump(other, by=5.0)  # tells the two files apart (real replicas hold the same weights)
    callbacks = [keras.callbacks.ModelCheckpoint(str(path), save_weights_only=weights_only)
                 for _ in range(2)]
    for callback, model in zip(callbacks, (chief, other), strict=True):
        callback.set_model(model)
    _as_two_workers(workers_barrier, lambda: callbacks[0].on_epoch_end(0, {"loss": 1.0}),
                    lambda: callbacks[1].on_epoch_end(0, {"loss": 1.0}))
    assert _same(_load(path, weights_only).get_weights(), chief.get_weights())
    assert os.listdir(path.parent) == [path.name]  # no staging folder, no second file
    assert os.listdir(private_tmp) == []


@pytest.mark.parametrize("templated", [False, True], ids=["plain", "epoch-folder"])
def test_the_chief_and_a_worker_never_both_make_a_new_checkpoint_folder(
        mended, workers_barrier, tmp_path, private_tmp, monkeypatch, templated):
    """CI 2026-11-27: Keras's ModelCheckpoint makes a missing folder with check-then-create
    (``os.makedirs`` without ``exist_ok``) while worker 1 makes the same folder for its staging
    files: FileExistsError on the chief. Here the worker's makedirs is held until a
    check-then-create has begun, so the collision happens every time one begins."""
    real_makedirs = os.makedirs
    checked, made = threading.Event(), threading.Event()

    def ordered_makedirs(name, mode=0o777, exist_ok=False):
        if not os.fspath(name).startswith(str(tmp_path / "new")):
            return real_makedirs(name, mode, exist_ok)
        if not exist_ok:  # Keras's: it saw no folder; the worker now makes it first
            checked.set()
            made.wait(timeout=10)
            return real_makedirs(name, mode, exist_ok)
        checked.wait(timeout=0.5)
        try:
            return real_makedirs(name, mode, exist_ok)
        finally:
            made.set()

    monkeypatch.setattr(os, "makedirs", ordered_makedirs)
    template = tmp_path / "new" / ("epoch{epoch}" if templated else "flat") / "model.keras"
    chief, other = _model(task_id=0), _model(task_id=1)
    callbacks = [keras.callbacks.ModelCheckpoint(str(template)) for _ in range(2)]
    for callback, model in zip(callbacks, (chief, other), strict=True):
        callback.set_model(model)
    _as_two_workers(workers_barrier, lambda: callbacks[0].on_epoch_end(0, {"loss": 1.0}),
                    lambda: callbacks[1].on_epoch_end(0, {"loss": 1.0}))
    written = tmp_path / "new" / ("epoch1" if templated else "flat")
    assert os.listdir(written) == ["model.keras"]
    assert os.listdir(tmp_path / "new") == [written.name]  # no literal "{epoch}" folder


@pytest.mark.parametrize("weights_only", [False, True], ids=["keras", "weights.h5"])
def test_a_worker_checkpoint_to_a_folder_of_its_own_is_kept(
        mended, workers_barrier, tmp_path, private_tmp, weights_only):
    """Issue 40, item 2: a path on a worker's own disk (here: another folder than the chief's)
    ends with that worker's complete file; before, it was written to a private folder and
    removed."""
    name = "model.weights.h5" if weights_only else "model.keras"
    paths = [tmp_path / "chief-disk" / name, tmp_path / "worker1-disk" / name]
    models = [_model(task_id=0), _bump_model(_model(task_id=1))]
    callbacks = [keras.callbacks.ModelCheckpoint(str(p), save_weights_only=weights_only)
                 for p in paths]
    for callback, model in zip(callbacks, models, strict=True):
        callback.set_model(model)
    _as_two_workers(workers_barrier, lambda: callbacks[0].on_epoch_end(0, {"loss": 1.0}),
                    lambda: callbacks[1].on_epoch_end(0, {"loss": 1.0}))
    for path, model in zip(paths, models, strict=True):
        assert _same(_load(path, weights_only).get_weights(), model.get_weights()), path
        assert os.listdir(path.parent) == [path.name]
    assert os.listdir(private_tmp) == []


def _bump_model(model, by=5.0):
    _bump(model, by)
    return model


@pytest.mark.parametrize("task_id, writes", [(None, True), (0, True), (1, True)],
                         ids=["no-strategy", "chief", "worker1-own-folder"])
def test_save_best_only_is_kept_and_only_the_chief_writes(mended, tmp_path, private_tmp, task_id,
                                                          writes):
    path = tmp_path / "best.keras"
    model = _model(task_id)
    callback = keras.callbacks.ModelCheckpoint(str(path), monitor="loss", save_best_only=True)
    callback.set_model(model)
    callback.on_epoch_end(0, {"loss": 1.0})
    best = model.get_weights()
    _bump(model)
    callback.on_epoch_end(1, {"loss": 2.0})  # worse: not saved
    assert path.exists() == writes
    if writes:
        assert _same(keras.saving.load_model(path).get_weights(), best)
        assert sorted(os.listdir(tmp_path)) == ["best.keras", "system-tmp"]
    assert os.listdir(private_tmp) == []


@pytest.mark.parametrize("save_freq", ["epoch", 2])
def test_backup_written_by_the_chief_only_and_read_by_every_worker(
        mended, workers_barrier, tmp_path, private_tmp, save_freq):
    backup_dir = tmp_path / "backup"
    chief, other = _model(task_id=0), _model(task_id=1)
    callbacks = []
    for model in (chief, other):
        callback = keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=save_freq)
        callback.set_model(model)
        callbacks.append(callback)
    other_weights = _bump(other, by=5.0)
    hooks = [lambda c: c.on_train_batch_end(0), lambda c: c.on_train_batch_end(1)]
    if save_freq == "epoch":
        hooks.append(lambda c: c.on_epoch_end(0))
    for hook in hooks:  # every worker calls every hook, as in fit
        _as_two_workers(workers_barrier, lambda hook=hook: hook(callbacks[0]),
                        lambda hook=hook: hook(callbacks[1]))
    metadata = json.loads((backup_dir / "training_metadata.json").read_text())
    assert metadata["epoch"] == (1 if save_freq == "epoch" else 0)
    assert sorted(os.listdir(backup_dir)) == ["latest.weights.h5", "training_metadata.json"]
    assert os.listdir(private_tmp) == []
    callbacks[1].on_train_begin()  # the non-chief restores the chief's backup
    assert _same(other.get_weights(), chief.get_weights())
    assert not _same(other.get_weights(), other_weights)
    assert other._initial_epoch == metadata["epoch"]
    callbacks[1].on_train_end()  # only the chief deletes the shared backup
    assert backup_dir.exists()
    callbacks[0].on_train_end()
    assert not backup_dir.exists()


def test_a_worker_backup_in_a_folder_of_its_own_is_kept_then_deleted_by_it(
        mended, workers_barrier, tmp_path, private_tmp):
    dirs = [tmp_path / "chief-disk" / "backup", tmp_path / "worker1-disk" / "backup"]
    models = [_model(task_id=0), _bump_model(_model(task_id=1))]
    callbacks = [keras.callbacks.BackupAndRestore(str(d)) for d in dirs]
    for callback, model in zip(callbacks, models, strict=True):
        callback.set_model(model)
    _as_two_workers(workers_barrier, lambda: callbacks[0].on_epoch_end(0),
                    lambda: callbacks[1].on_epoch_end(0))
    for folder, model in zip(dirs, models, strict=True):
        assert sorted(os.listdir(folder)) == ["latest.weights.h5", "training_metadata.json"]
        restored = _model()
        restored.load_weights(folder / "latest.weights.h5")
        assert _same(restored.get_weights(), model.get_weights()), folder
    callbacks[1].on_train_end()  # its own backup: it deletes it at a successful end
    assert not dirs[1].exists() and dirs[0].exists()


def test_a_damaged_backup_falls_back_to_the_previous_one_without_writing(mended, tmp_path):
    backup_dir = tmp_path / "backup"
    chief = _model(task_id=0)
    callback = keras.callbacks.BackupAndRestore(str(backup_dir), double_checkpoint=True)
    callback.set_model(chief)
    callback.on_epoch_end(0)
    first = chief.get_weights()
    _bump(chief)
    callback.on_epoch_end(1)
    (backup_dir / "latest.weights.h5").write_bytes(b"damaged")
    before = {p.name: p.read_bytes() for p in backup_dir.iterdir()}
    other = _model(task_id=1)
    restore = keras.callbacks.BackupAndRestore(str(backup_dir), double_checkpoint=True)
    restore.set_model(other)
    restore.on_train_begin()
    assert _same(other.get_weights(), first) and other._initial_epoch == 1
    assert {p.name: p.read_bytes() for p in backup_dir.iterdir()} == before


def _checkpoint_run(folder, *, weights_only=False):
    name = "m-{epoch:02d}.weights.h5" if weights_only else "m-{epoch:02d}-{loss:.1f}.keras"
    model = _model()
    callback = keras.callbacks.ModelCheckpoint(str(folder / name), save_weights_only=weights_only)
    callback.set_model(model)
    backup = keras.callbacks.BackupAndRestore(str(folder / "backup"), delete_checkpoint=False)
    backup.set_model(model)
    for epoch in range(2):
        _bump(model)
        callback.on_epoch_end(epoch, {"loss": 1.0 + epoch})
        backup.on_epoch_end(epoch)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_without_a_multi_worker_strategy_the_files_are_upstreams(tmp_path):
    before = mend.installed()
    mend.uninstall()
    upstream = _checkpoint_run(tmp_path / "upstream")
    mend.install()
    try:
        assert _checkpoint_run(tmp_path / "mended") == upstream == [
            "backup", "backup/latest.weights.h5", "backup/training_metadata.json",
            "m-01-1.0.keras", "m-02-2.0.keras"]
    finally:
        if not before:
            mend.uninstall()


@pytest.fixture
def saves_mended():
    from kerasdist._compat import keras_chief_saves

    before = keras_chief_saves.installed()
    assert keras_chief_saves.install()
    yield
    if not before:
        keras_chief_saves.uninstall()


@pytest.mark.parametrize("shared", [True, False], ids=["shared-folder", "own-folders"])
def test_model_save_by_every_worker_one_file_on_a_shared_folder_each_its_own_elsewhere(
        saves_mended, workers_barrier, tmp_path, shared):
    """keras-chief-saves (``Model.save`` / ``save_weights`` / ``export`` by every worker): the
    chief and worker 1 at once, on one folder or each on its own."""
    models = [_model(task_id=0), _bump_model(_model(task_id=1))]
    folders = [tmp_path / "shared"] * 2 if shared else [tmp_path / "chief", tmp_path / "worker1"]

    def save(model, folder):
        model.save(folder / "model.keras")
        model.save_weights(folder / "model.weights.h5")

    _as_two_workers(workers_barrier, lambda: save(models[0], folders[0]),
                    lambda: save(models[1], folders[1]))
    expected = [models[0], models[0]] if shared else models  # shared: the chief's files
    for folder, model in zip(folders, expected, strict=True):
        assert sorted(os.listdir(folder)) == ["model.keras", "model.weights.h5"], folder
        assert _same(keras.saving.load_model(folder / "model.keras").get_weights(),
                     model.get_weights()), folder
        assert _same(_load(folder / "model.weights.h5", True).get_weights(), model.get_weights())

"""What the chief-aware save mends share (:mod:`keras_chief_callbacks`, :mod:`keras_chief_saves`):
staging folders next to a target, atomic moves, the two-barrier protocol by which a non-chief
worker tells a folder shared with the chief from a disk of its own, and the thread-local flag by
which ``Model.save`` runs Keras's own code inside the callbacks (:class:`passthrough`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import types

STAGING_PREFIX = ".kerasdist-staging-"
_LOCAL = threading.local()


def inside() -> bool:
    """True within a :class:`passthrough` block of this thread."""
    return getattr(_LOCAL, "inside", False)


class passthrough:
    """``with passthrough():`` saves run Keras's own code (used by the chief-aware callbacks)."""

    def __enter__(self):
        self.previous = inside()
        _LOCAL.inside = True

    def __exit__(self, *exc):
        _LOCAL.inside = self.previous


@contextlib.contextmanager
def folder(parent: str | None = None):
    """A fresh folder for one save, removed on exit with whatever was not moved out of it: a
    staging folder inside ``parent`` (the target's folder: same file system, so ``os.replace`` is
    atomic), or, with no parent, a non-chief worker's private folder in the system temp folder."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
        path = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)
    else:
        path = tempfile.mkdtemp(prefix="kerasdist-nonchief-save-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def barrier(strategy) -> None:
    """Block until every worker reaches this point (one scalar all-reduce)."""
    import tensorflow as tf

    def one():
        return tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0))

    for value in strategy.experimental_local_results(strategy.run(tf.function(one))):
        value.numpy()


def stamp(path: str):
    """``(inode, size, mtime_ns)`` of ``path``, or None when it does not exist."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _stamps(parent: str) -> dict:
    try:
        return {name: stamp(os.path.join(parent, name)) for name in os.listdir(parent)}
    except OSError:
        return {}


@contextlib.contextmanager
def chief_turn(model):
    """The chief's side of one save of every worker (:func:`worker_save`): a barrier before it
    writes (every worker has looked at its target first) and one after (its files are in place).
    """
    barrier(model.distribute_strategy)
    yield
    barrier(model.distribute_strategy)


@contextlib.contextmanager
def worker_save(model, parent: str):
    """A non-chief worker's side of one save, staged next to the target; yields the save in
    progress: ``.folder`` (stage the files there) and, after the block, ``.published`` (the
    targets moved into place: empty on a folder shared with the chief).

    It notes its target folder's files, passes the first barrier (the chief writes only after it),
    writes into the staging folder, passes the second barrier (the chief's files are in place),
    then moves into place each staged file whose target did not change (the path is on a disk of
    this worker's own); on a folder shared with the chief its copies are dropped. Every worker runs
    the same saves in the same order (callbacks and ``Model.save`` run on all).
    """
    before = _stamps(parent)
    barrier(model.distribute_strategy)
    with folder(parent) as staging:
        save = types.SimpleNamespace(folder=staging, published=[])
        yield save
        barrier(model.distribute_strategy)
        for name in sorted(os.listdir(staging)):
            target = os.path.join(parent, name)
            if stamp(target) == before.get(name):  # the chief's file did not land here
                move_into_place(os.path.join(staging, name), target)
                save.published.append(target)


def staged_write(call, target: str) -> object:
    """The chief's (or a single process's) write: ``call(path)`` writes into a staging folder next
    to ``target``, then every output of that save is moved into ``target``'s folder atomically
    (sharded ``.weights.h5`` saves write several files). Returns what ``call`` returned."""
    parent, base = os.path.dirname(target) or ".", os.path.basename(target)
    stem = base[:-len(".weights.h5")] if base.endswith(".weights.h5") else None
    with folder(parent) as staging:
        result = call(os.path.join(staging, base))
        for name in sorted(os.listdir(staging)):
            if name == base or (stem is not None and name.startswith(stem)):
                move_into_place(os.path.join(staging, name), os.path.join(parent, name))
    return result


def move_into_place(staged: str, target: str) -> None:
    """Replace ``target`` by ``staged`` (a file, or a folder such as a SavedModel) with atomic
    renames."""
    if os.path.isdir(staged) and os.path.isdir(target):
        old = staged + ".previous"
        os.replace(target, old)
        os.replace(staged, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, target)

"""BackupStore.restore on damaged checkpoint folders: newest whole checkpoint wins, nothing
silently restarts from zero (issue 11, point 7)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from kerasdist.errors import TrainingError
from kerasdist.keras.backup import BackupStore

pytestmark = pytest.mark.timeout(120)


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _store(model, directory):
    return BackupStore(model=model, directory=directory, is_chief=True, task_name="chief:0",
                       max_to_keep=5, steps_per_epoch=10)


def _train_and_save(directory, steps=(10, 20, 30)):
    """Three checkpoints at global steps 10/20/30; returns the weights + optimizer state of each."""
    model = _model()
    store = _store(model, directory)
    saved = {}
    x, y = np.ones((10, 4), np.float32), np.zeros((10, 3), np.float32)
    for step in steps:
        model.fit(x, y, batch_size=1, epochs=1, verbose=0)
        store.save(step)
        saved[step] = [v.numpy().copy() for v in model.optimizer.variables] + model.get_weights()
    store.close()
    return saved


def _restored(directory):
    model = _model()
    store = _store(model, directory)
    step = store.restore()
    state = [v.numpy().copy() for v in model.optimizer.variables] + model.get_weights()
    return step, state, store


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_newest_whole_checkpoint_restores_weights_slots_and_step_exactly(tmp_path):
    saved = _train_and_save(tmp_path)
    step, state, _ = _restored(tmp_path)
    assert step == 30 and _same(state, saved[30])


def test_truncated_data_file_is_skipped_and_named(tmp_path, caplog):
    saved = _train_and_save(tmp_path)
    data = next(tmp_path.glob("ckpt-30.data-*"))
    data.write_bytes(data.read_bytes()[:40])
    step, state, store = _restored(tmp_path)
    assert step == 20 and _same(state, saved[20])
    assert "ckpt-30" in caplog.text and "skipped" in caplog.text
    assert store.save(30).endswith("ckpt-30")  # a later save at that step replaces the damage
    assert BackupStore._unreadable(str(tmp_path / "ckpt-30")) is None


@pytest.mark.parametrize("damage", ["missing", "garbled"])
def test_pointer_file_damage_does_not_restart_from_zero(tmp_path, damage):
    saved = _train_and_save(tmp_path)
    pointer = tmp_path / "checkpoint"
    pointer.unlink() if damage == "missing" else pointer.write_bytes(b"\xff\x00garbage {{")
    step, state, _ = _restored(tmp_path)
    assert step == 30 and _same(state, saved[30])


def test_no_readable_checkpoint_is_an_error_naming_the_files(tmp_path):
    _train_and_save(tmp_path)
    for data in tmp_path.glob("ckpt-*.data-*"):
        data.write_bytes(b"\x00" * 8)
    with pytest.raises(TrainingError, match=r"ckpt-30.*ckpt-20.*ckpt-10.*not training from zero"):
        _restored(tmp_path)
    for index in tmp_path.glob("ckpt-*.index"):
        index.unlink()
    (tmp_path / "checkpoint").unlink()
    with pytest.raises(TrainingError, match=r"no index file for ckpt-10.data"):
        _restored(tmp_path)


def test_empty_folder_starts_at_step_zero(tmp_path):
    step, _, _ = _restored(tmp_path / "none")
    assert step == 0


def test_restore_is_verified_against_the_digest_recorded_at_save(tmp_path):
    import json

    from kerasdist.keras.state_digest import DIGESTS_FILE

    _train_and_save(tmp_path)
    digests = json.loads((tmp_path / DIGESTS_FILE).read_text())
    assert sorted(digests) == ["ckpt-10", "ckpt-20", "ckpt-30"]
    _, _, store = _restored(tmp_path)
    assert store.restore_verified and store.restored_digest == digests["ckpt-30"]
    digests["ckpt-30"] = "0" * 64  # the values restored are not the ones saved
    (tmp_path / DIGESTS_FILE).write_text(json.dumps(digests))
    with pytest.raises(TrainingError, match="differ from the ones saved"):
        _restored(tmp_path)

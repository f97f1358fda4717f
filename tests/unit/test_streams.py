"""Multi-worker input streams: sharded, reproducible, and resumable at an exact step."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kerasdist.config import validate_recipe
from kerasdist.data import stream
from kerasdist.data.inputs import build_streaming, resolve_shard_policy
from kerasdist.data.readers import write_tfrecord
from kerasdist.data.sources.memory import memory_units
from kerasdist.errors import RecipeError


def _memory_train_fn(x, y, config, *, shard: bool):
    """The in-memory training stream as every kind builds it (:mod:`kerasdist.data.stream`)."""
    return stream.train_fn(memory_units(x, y, "data" if shard else "off"), config)


def _eval_fn(x, y, config, *, shard: bool):
    return stream.eval_fn(memory_units(x, y, "data" if shard else "off"), config, shard=shard)


def _ctx(pipeline_id: int, pipelines: int = 2):
    return tf.distribute.InputContext(num_input_pipelines=pipelines,
                                      input_pipeline_id=pipeline_id, num_replicas_in_sync=pipelines)


def _labels(ds, batches: int) -> list[list[int]]:
    return [b[1].numpy().ravel().tolist() for b in ds.take(batches)]


def _data(n=40):
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    return x, np.arange(n, dtype=np.int64)


def _config(**data):
    return validate_recipe({"data": {"batch_size": 8, "source": "synthetic_linear", **data},
                            "strategy": {"kind": "multi_worker"},
                            "cluster": {"kind": "local", "workers": 2}}).data


def test_stream_is_reproducible_and_skip_resumes_exactly():
    x, y = _data()
    fn = _memory_train_fn(x, y, _config(), shard=True)
    full = _labels(fn(_ctx(0), 0), 12)  # 12 batches of 4 = 2.4 passes over a 20-example shard
    assert full == _labels(fn(_ctx(0), 0), 12)  # a second iterator: same order
    assert _labels(fn(_ctx(0), 5), 7) == full[5:]  # resume at batch 5 == continuing
    first_pass = sorted(sum(full[:5], []))
    assert first_pass == list(range(0, 40, 2))  # pipeline 0 keeps examples 0, 2, 4, ...
    assert sum(full[5:10], []) != sum(full[:5], [])  # the next pass is reshuffled


def test_small_shuffle_buffer_is_a_buffer_and_still_resumes_exactly():
    x, y = _data()
    fn = _memory_train_fn(x, y, _config(shuffle_buffer=2), shard=True)
    full = _labels(fn(_ctx(0), 0), 12)
    assert full == _labels(fn(_ctx(0), 0), 12)
    assert _labels(fn(_ctx(0), 5), 7) == full[5:]
    # A 2-example buffer can only move an example a little: the first batch of 4 comes from the
    # shard's first 5 examples (0, 2, ..., 8), unlike a full permutation.
    assert set(full[0]) <= {0, 2, 4, 6, 8} and sorted(sum(full[:5], [])) == list(range(0, 40, 2))
    no_shuffle = _memory_train_fn(x, y, _config(shuffle_buffer=0), shard=True)
    assert _labels(no_shuffle(_ctx(0), 0), 2) == [[0, 2, 4, 6], [8, 10, 12, 14]]


def test_shards_are_disjoint_and_off_reads_everything():
    x, y = _data()
    fn = _memory_train_fn(x, y, _config(), shard=True)
    seen = [set(sum(_labels(fn(_ctx(i), 0), 5), [])) for i in (0, 1)]
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(40))
    off = _memory_train_fn(x, y, _config(), shard=False)
    assert sorted(sum(_labels(off(_ctx(1), 0), 10), [])) == list(range(40))


def test_eval_keeps_every_example_once_across_pipelines():
    x, y = _data(21)
    fn = _eval_fn(x, y, _config(), shard=True)
    labels = [v for i in (0, 1) for b in fn(_ctx(i)) for v in b[1].numpy().tolist()]
    assert sorted(labels) == list(range(21))


def test_file_sharding_reads_only_own_files_and_resumes(tmp_path):
    images = np.zeros((12, 2, 2), np.uint8)
    for part in range(4):
        write_tfrecord(images[:3], np.arange(3) + 3 * part, tmp_path / f"train-{part}.tfrecord")
    config = _config(source={"kind": "tfrecord", "path": str(tmp_path)}, train_split="train",
                     shuffle_buffer=4)
    assert resolve_shard_policy(config, num_workers=2) == "file"
    recipe = validate_recipe({"data": {**config.model_dump(mode="json"), "eval_split": None},
                              "strategy": {"kind": "multi_worker"},
                              "cluster": {"kind": "local", "workers": 2}})
    built = build_streaming(recipe, pipelines=2)
    assert built.policy == "file"
    fn = built.train_fn
    stream = _labels(fn(_ctx(1), 0), 9)  # files 1 and 3: labels 3..5 and 9..11
    assert set(sum(stream, [])) == {3, 4, 5, 9, 10, 11}
    assert _labels(fn(_ctx(1), 4), 5) == stream[4:]


def test_shard_policy_auto_and_errors(tmp_path):
    assert resolve_shard_policy(_config(auto_shard="auto"), num_workers=2) == "data"
    assert resolve_shard_policy(_config(auto_shard="off"), num_workers=2) == "off"
    with pytest.raises(RecipeError, match="Received: auto_shard='file'"):
        resolve_shard_policy(_config(auto_shard="file"), num_workers=2)


def test_a_sliced_tfrecord_split_streams_pieces_of_files_and_resumes(tmp_path, monkeypatch):
    """``train[2:10]+test[:25%]`` of the default layout: the records of the slice, never the
    split read into memory; sharded by piece of file and resumed exactly."""
    from kerasdist.data.sources import tfrecord

    images = np.zeros((4, 2, 2), np.uint8)
    for part in range(3):  # train: labels 0..11 in 3 files of 4; test: labels 100..103
        write_tfrecord(images, np.arange(4) + 4 * part, tmp_path / f"train-{part}.tfrecord")
    write_tfrecord(images, np.arange(4) + 100, tmp_path / "test-0.tfrecord")
    monkeypatch.setattr(tfrecord, "load_tfrecord_split", lambda *a: pytest.fail("read whole"))
    recipe = validate_recipe({"data": {"batch_size": 2,
                                       "source": {"kind": "tfrecord", "path": str(tmp_path)},
                                       "train_split": "train[2:10]+test[:25%]",
                                       "eval_split": "train[-2:]", "shuffle_buffer": 4},
                              "strategy": {"kind": "multi_worker"},
                              "cluster": {"kind": "local", "workers": 2}})
    built = build_streaming(recipe, pipelines=2)
    assert built.policy == "file" and built.num_eval == 2  # 4 pieces: 2-3, 4-7, 8-9, 100
    streams = [_labels(built.train_fn(_ctx(i), 0), 8) for i in (0, 1)]
    assert set(sum(streams[0], []) + sum(streams[1], [])) == {*range(2, 10), 100}
    assert set(sum(streams[0], [])) & set(sum(streams[1], [])) == set()
    assert _labels(built.train_fn(_ctx(1), 3), 5) == streams[1][3:]
    evaluated = [b[1].numpy().tolist() for b in built.eval_fn(_ctx(0, 1))]
    assert sum(evaluated, []) == [10, 11]


def test_every_source_rides_the_one_stream():
    """Issue 41 item 2: the per-pass order, the resume skip and the decode live in one module;
    a second stream (a source kind building its own endless, reshuffled dataset) fails here."""
    from pathlib import Path

    import kerasdist

    package = Path(kerasdist.__file__).parent
    markers = ("Dataset.counter", "stateless_shuffle")
    elsewhere = sorted(
        f"{path.relative_to(package)}: {marker}"
        for path in package.rglob("*.py") if path != package / "data" / "stream.py"
        for marker in markers if marker in path.read_text(encoding="utf-8"))
    assert not elsewhere, elsewhere

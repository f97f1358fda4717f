"""Streaming sources (csv, image_folder, tfrecord with a feature spec, python): what they decode,
how they shard, that a resumed stream repeats nothing, and the bad-input messages."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from kerasdist.config import validate_recipe
from kerasdist.data.inputs import build_streaming
from kerasdist.data.writers import write_csv_splits, write_example_tfrecords, write_image_folder
from kerasdist.errors import DataError

COLORS = ("red", "green", "blue")


def _ctx(pipeline_id=0, pipelines=1):
    return tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
                                      num_replicas_in_sync=pipelines)


def _csv(folder, *, files=3, n=90):
    rows = {split: [[f"{i}.5", f"{-i}", COLORS[i % 3], i % 2] for i in range(count)]
            for split, count in (("train", n), ("test", 30))}
    write_csv_splits(folder, ["a", "b", "color", "y"], rows, files_per_split=files)
    return {"source": {"kind": "csv", "path": str(folder), "label": "y", "categorical": ["color"]}}


def _images(folder, n=40):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        x = rng.integers(0, 256, (n, 10, 12), dtype=np.uint8)
        x[:, 0, 0] = np.arange(n)  # pixel (0, 0) numbers the example
        write_image_folder(folder, split, x, np.arange(n) % 4, size=None, rgb=True)
    return {"source": {"kind": "image_folder", "path": str(folder), "image_size": [10, 12],
                       "channels": 3},
            "normalize": False}


SPEC = {"pixels": {"dtype": "string", "shape": [4, 4, 1], "encoding": "png"},
        "extra": {"dtype": "float32", "shape": [2]}, "target": {"dtype": "int64"}}


def _tfrecords(folder, n=60, files=3):
    for split, count in (("train", n), ("test", 12)):
        for k in range(files):
            examples = [{"pixels": tf.io.encode_png(np.full((4, 4, 1), i, np.uint8)).numpy(),
                         "extra": [i, -i], "target": i % 3} for i in range(k, count, files)]
            write_example_tfrecords(folder / f"{split}-{k}.tfrecord", examples,
                                    {"pixels": "string", "extra": "float32", "target": "int64"})
    return {"source": {"kind": "tfrecord", "path": str(folder), "features": SPEC, "label": "target"}}


PY_MODULE = textwrap.dedent("""
    import tensorflow as tf

    def numbers(split):
        n = 80 if split == "train" else 16
        return tf.data.Dataset.range(n).map(lambda i: (tf.cast(tf.stack([i, i]), tf.float32), i % 2))

    def not_a_dataset(split):
        return [1, 2, 3]

    def singles(split):
        return tf.data.Dataset.range(4)
""")


def _python(folder, monkeypatch, function="numbers"):
    (folder / "user_data_mod.py").write_text(PY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    return {"source": {"kind": "python", "function": f"user_data_mod:{function}"}}


def _recipe(tmp_path, data, *, workers=1, **extra):
    data = {"train_split": "train", "eval_split": "test", "batch_size": 8, "shuffle_buffer": 16,
            **data, **extra}
    cluster = {"kind": "local", "workers": workers} if workers > 1 else {}
    strategy = {"kind": "multi_worker"} if workers > 1 else {}
    return validate_recipe({"data": data, "cluster": cluster, "strategy": strategy,
                            "output": {"run_dir": str(tmp_path / "run")}})


def _make(kind, tmp_path, monkeypatch):
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "csv":
        return _csv(folder)
    if kind == "image_folder":
        return _images(folder)
    if kind == "tfrecord":
        return _tfrecords(folder)
    return _python(folder, monkeypatch)


def _key(x, y) -> tuple:
    """One example's identity: its features' bytes and label."""
    flat = np.concatenate([np.asarray(v, np.float64).ravel() for v in tf.nest.flatten(x)])
    return tuple(np.round(flat, 4)) + (int(y),)


def _examples(ds, batches):
    out = []
    for x, y in ds.take(batches):
        for i in range(len(y)):
            out.append(_key(tf.nest.map_structure(lambda t, i=i: t[i].numpy(), x), y[i].numpy()))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["csv", "image_folder", "tfrecord", "python"])
def test_a_resumed_stream_repeats_no_batch_and_skips_none(kind, tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, _make(kind, tmp_path, monkeypatch))
    built = build_streaming(recipe, pipelines=1)
    whole = _examples(built.train_fn(_ctx(), 0), 5)
    resumed = _examples(build_streaming(recipe, pipelines=1).train_fn(_ctx(), 3), 2)
    assert resumed == whole[24:]  # batches 3 and 4 exactly: the same order in a new run
    assert not set(resumed) & set(whole[:24])  # nothing trained on before the restart, this pass
    assert len(set(whole)) == len(whole) == 40  # 40 examples <= one pass: no example twice


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind, policy", [("csv", "file"), ("image_folder", "file"),
                                          ("tfrecord", "file"), ("python", "data")])
def test_two_workers_split_one_pass_between_them(kind, policy, tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, _make(kind, tmp_path, monkeypatch), workers=2, batch_size=4,
                     shuffle_buffer=0)
    built = build_streaming(recipe, pipelines=2)
    assert built.policy == policy
    batches = built.per_pipeline // 2  # per-replica batch 2: one pass over the smaller shard
    seen = [_examples(built.train_fn(_ctx(i, 2), 0), batches) for i in (0, 1)]
    assert all(len(set(s)) == len(s) == 2 * batches for s in seen)  # no example twice in a pass
    assert not set(seen[0]) & set(seen[1])  # disjoint shards


def test_fewer_files_than_workers_shards_by_data_and_says_so(tmp_path, caplog):
    data = _csv(tmp_path / "csv", files=1)
    with caplog.at_level("INFO", logger="kerasdist"):
        built = build_streaming(_recipe(tmp_path, data, workers=2, batch_size=4, shuffle_buffer=0),
                                pipelines=2)
    assert built.policy == "data"
    assert "sharding by data, not by file: split 'train' has 1 file(s), fewer than the 2 workers" \
        in caplog.text
    first = [set(_examples(built.train_fn(_ctx(i, 2), 0), 22)) for i in (0, 1)]
    assert not first[0] & first[1] and len(first[0] | first[1]) == 88


def test_csv_numeric_columns_are_standardized_and_categoricals_one_hot(tmp_path):
    built = build_streaming(_recipe(tmp_path, _csv(tmp_path / "csv"), shuffle_buffer=0), pipelines=1)
    x, y = next(iter(built.eval_fn(_ctx())))
    assert x.shape == (8, 2 + 4) and x.dtype == tf.float32 and y.dtype == tf.int64
    schema = json.loads(built.artifacts["data/csv-schema.json"])
    assert schema["vocabulary"] == {"color": ["blue", "green", "red"]}
    one_hot = x.numpy()[:, 2:]
    assert (one_hot.sum(axis=1) == 1).all() and one_hot[0].tolist() == [0, 0, 0, 1]  # 'red' -> 3
    assert abs(schema["mean"][0] - 45.0) < 1e-9  # mean of 0.5 .. 89.5


def test_a_saved_csv_schema_is_used_instead_of_recomputing(tmp_path):
    data = _csv(tmp_path / "csv")
    first = build_streaming(_recipe(tmp_path, data), pipelines=1)
    schema = json.loads(first.artifacts["data/csv-schema.json"])
    schema["vocabulary"]["color"] = ["red", "green", "blue"]  # other ids than sorted order
    saved = tmp_path / "run" / "data" / "csv-schema.json"
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps(schema), encoding="utf-8")
    again = build_streaming(_recipe(tmp_path, data, shuffle_buffer=0), pipelines=1)
    # the saved schema, not a recomputed one, is what the chief writes (again) into the run
    assert json.loads(again.artifacts["data/csv-schema.json"])["vocabulary"]["color"] == \
        ["red", "green", "blue"]
    x, _ = next(iter(again.eval_fn(_ctx())))
    assert x.numpy()[0, 2:].tolist() == [0, 1, 0, 0]  # 'red' is id 1 in the saved vocabulary


def test_tfrecord_spec_decodes_png_and_float_features_into_a_dict(tmp_path):
    built = build_streaming(_recipe(tmp_path, _tfrecords(tmp_path / "tfr"), shuffle_buffer=0),
                            pipelines=1)
    x, y = next(iter(built.eval_fn(_ctx())))
    assert sorted(x) == ["extra", "pixels"] and x["pixels"].dtype == tf.float32  # uint8 scaled
    assert x["pixels"].shape == (8, 4, 4, 1) and x["extra"].shape == (8, 2)
    assert y.numpy().tolist() == [(v % 3) for v in x["extra"].numpy()[:, 0].astype(int)]


# ------------------------------------------------------------------------------- bad input
def test_a_feature_spec_that_does_not_match_names_file_and_record(tmp_path):
    data = _tfrecords(tmp_path / "tfr")
    data["source"]["features"] = {**SPEC, "extra": {"dtype": "float32", "shape": [3]}}
    with pytest.raises(DataError) as err:
        build_streaming(_recipe(tmp_path, data), pipelines=1)
    text = str(err.value)
    assert "data.source.features does not match file" in text and "train-0.tfrecord' (record 1)" in text
    assert '"extra": {"dtype": "float32", "shape": [3], "encoding": "none"}' in text


def test_a_missing_label_column_names_the_file(tmp_path):
    data = _csv(tmp_path / "csv")
    data["source"]["label"] = "price"
    with pytest.raises(DataError, match=r"data.source.label: column 'price' is not in the header of "
                       r"'.*train-000.csv' \(line 1: a, b, color, y\). Received: label='price'"):
        build_streaming(_recipe(tmp_path, data), pipelines=1)


def test_a_non_number_in_a_numeric_column_names_file_line_and_value(tmp_path):
    data = _csv(tmp_path / "csv")
    path = tmp_path / "csv" / "train-001.csv"
    lines = path.read_text().splitlines()
    lines[4] = "oops,1,red,0"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"column 'a' of '.*train-001.csv' line 5 is not a finite "
                       r"number. Received: 'oops'"):
        build_streaming(_recipe(tmp_path, data), pipelines=1)


def test_an_empty_image_folder_is_refused(tmp_path):
    (tmp_path / "img" / "train").mkdir(parents=True)
    data = {"source": {"kind": "image_folder", "path": str(tmp_path / "img")}}
    with pytest.raises(DataError, match=r"holds no class folders .* for split 'train'"):
        build_streaming(_recipe(tmp_path, data), pipelines=1)


@pytest.mark.parametrize("function, needle", [
    ("no_such_mod_xyz:make", "data.source.function: cannot import module 'no_such_mod_xyz'"),
    ("user_data_mod:missing", "has no Python function 'missing'"),
    ("os:getcwd", "data.source.function: 'os:getcwd' is a Python built-in, not a data function "
     "of your own"),  # the loss and callback paths say "built-in" too
    ("user_data_mod:not_a_dataset", "must return a tf.data.Dataset of unbatched (features, "
     "label). Received: list for split 'train'"),
    ("user_data_mod:singles", "must return a dataset of (features, label) pairs. Received: "
     "element_spec TensorSpec"),
])
def test_a_bad_data_function_is_refused_naming_it(function, needle, tmp_path, monkeypatch):
    _python(tmp_path, monkeypatch)
    with pytest.raises(DataError) as err:
        build_streaming(_recipe(tmp_path, {"source": {"kind": "python", "function": function}}),
                        pipelines=1)
    assert needle in str(err.value)


def test_streaming_sources_take_whole_split_names_only(tmp_path):
    with pytest.raises(ValueError, match="data.train_split of a streaming source .* Received: "
                       "train_split='train\\[:80%\\]'"):
        validate_recipe({"data": {**_csv(tmp_path / "csv"), "train_split": "train[:80%]"}})


ENDLESS_MODULE = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    def endless(split):
        def gen():
            while True:
                yield np.ones(2, "float32"), np.int64(1)
        spec = (tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(gen, output_signature=spec)

    def repeated(split):
        return tf.data.Dataset.range(10).map(lambda i: (tf.ones(2), i % 2)).repeat()

    def generated(split):
        def gen():
            for i in range(40):
                yield np.ones(2, "float32"), np.int64(i % 2)
        spec = (tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(gen, output_signature=spec)
""")


def _endless(folder, monkeypatch, function):
    (folder / "user_endless_mod.py").write_text(ENDLESS_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    return {"source": {"kind": "python", "function": f"user_endless_mod:{function}"}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function", ["endless", "repeated"])
def test_an_endless_python_split_is_not_counted_under_steps_per_epoch(function, tmp_path,
                                                                      monkeypatch):
    """Issue 39: the counting pass over an endless split never ended; with
    ``trainer.steps_per_epoch`` only its first batches are read, and it streams."""
    from kerasdist.data.inputs import build_data

    data = _endless(tmp_path, monkeypatch, function)
    recipe = validate_recipe({"data": {**data, "train_split": "train", "eval_split": None,
                                       "batch_size": 8},
                              "trainer": {"steps_per_epoch": 3},
                              "output": {"run_dir": str(tmp_path / "run")}})
    built = build_data(recipe, replicas=1)
    assert built.steps_per_epoch == 3
    ds = built.train_dataset(tf.distribute.get_strategy(), start_step=0)
    assert [int(y.shape[0]) for _, y in ds.take(5)] == [8] * 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function, needle", [
    ("endless", "has more than 30 examples"), ("repeated", "is endless (cardinality INFINITE)")])
def test_an_endless_python_split_without_steps_per_epoch_is_refused_naming_the_field(
        function, needle, tmp_path, monkeypatch):
    from kerasdist.data.sources import functions

    monkeypatch.setattr(functions, "MAX_COUNTED_EXAMPLES", 30)
    data = _endless(tmp_path, monkeypatch, function)
    with pytest.raises(DataError) as raised:
        build_streaming(_recipe(tmp_path, {**data, "eval_split": None}), pipelines=1)
    message = str(raised.value)
    assert needle in message and "trainer.steps_per_epoch" in message, message
    assert f"user_endless_mod:{function}" in message and "Received:" in message


@pytest.mark.timeout(60)
def test_a_finite_generator_is_counted_and_an_endless_eval_split_is_refused(tmp_path, monkeypatch):
    from kerasdist.data.sources import functions

    monkeypatch.setattr(functions, "MAX_COUNTED_EXAMPLES", 40)
    data = _endless(tmp_path, monkeypatch, "generated")
    assert build_streaming(_recipe(tmp_path, {**data, "eval_split": None}),
                           pipelines=1).per_pipeline == 40  # exactly the bound: counted
    recipe = validate_recipe({"data": {"source": {**data["source"],
                                                  "function": "user_endless_mod:endless"},
                                       "train_split": "train", "eval_split": "test",
                                       "batch_size": 8},
                              "trainer": {"steps_per_epoch": 3},
                              "output": {"run_dir": str(tmp_path / "run")}})
    with pytest.raises(DataError, match="data.eval_split 'test' has more than 40 examples"):
        build_streaming(recipe, pipelines=1)

"""Source ``tfrecord``: ``tf.train.Example`` files parsed with ``data.source.features`` (default: the
MNIST layout), streamed as files or pieces of files (:class:`TFRecordSource`, read with
``tf.data.TFRecordDataset`` and ``tf.io.parse_single_example``); read whole, in the default
layout, as uint8 arrays (:func:`kerasdist.data.readers.load_tfrecord_split`)."""

from __future__ import annotations

import json
from pathlib import Path

from kerasdist.data.readers import (
    corrupt_file,
    load_tfrecord_split,
    parse_square_image,
    parse_square_images,
    tf_message,
)
from kerasdist.data.sources.base import slice_split
from kerasdist.data.sources.files import CHECKED_RECORDS, FileKind, FileSource, split_files
from kerasdist.errors import DataError

PIECE_SEP = "\x00"
"""Separates a file from its record range in a unit of a sliced tfrecord split (``path``, or
``path<SEP>start<SEP>stop``: records ``start`` to ``stop - 1`` of the file)."""


def _piece_records(unit):
    """The raw records of one tfrecord unit: a whole file, or a piece of one (see
    :data:`PIECE_SEP`), read with ``tf.data.TFRecordDataset`` and ``skip``/``take``."""
    import tensorflow as tf

    parts = tf.strings.split(tf.strings.join([unit, f"{PIECE_SEP}0{PIECE_SEP}-1"]), PIECE_SEP)
    start = tf.strings.to_number(parts[1], tf.int64)
    stop = tf.strings.to_number(parts[2], tf.int64)
    return tf.data.TFRecordDataset(parts[0]).skip(start).take(
        tf.where(stop >= 0, stop - start, tf.constant(-1, tf.int64)))


def _file_of(unit: str) -> str:
    return unit.split(PIECE_SEP)[0]


class TFRecordSource(FileSource):
    """``tf.train.Example`` records parsed with ``data.source.features`` (default: MNIST layout).

    A split is a whole split name (its files are the units) or a TFDS slice such as
    ``train[:80%]`` or ``train[:1000]+test[-500:]``: the slice is taken over the split's records
    in file order (each file's records counted once, in one pass, before training), and its units
    are the pieces of files it covers (``file``, first record, end), which the streams shuffle,
    shard and skip as they do whole files. No record is held in memory."""

    def units(self, split):
        from kerasdist.config.data_configs import is_whole_split

        if is_whole_split(split):
            return split_files(self.config, split, "*.tfrecord*")
        return self._pieces(split)

    def _pieces(self, split: str) -> list[str]:
        import re
        import types

        import tensorflow_datasets as tfds

        try:
            instruction = tfds.core.ReadInstruction.from_spec(split)
        except (ValueError, AssertionError) as err:
            raise DataError(f"bad split string {split!r}: {err}. Received: split={split!r}") \
                from None
        names = {re.match(r"\s*([\w-]+)", part).group(1) for part in split.split("+")}
        files = {name: split_files(self.config, name, "*.tfrecord*") for name in names}
        missing = sorted(name for name, found in files.items() if not found)
        if missing:
            return []  # check() names the split
        counts = {name: self.count(found) for name, found in files.items()}
        infos = {name: types.SimpleNamespace(num_examples=sum(c), shard_lengths=c)
                 for name, c in counts.items()}
        try:
            absolute = instruction.to_absolute(infos)
        except (ValueError, AssertionError) as err:
            raise DataError(f"split {split!r}: {err}. Received: split={split!r}") from None
        pieces = []
        for part in absolute:
            offset, first = 0, part.from_ or 0
            last = sum(counts[part.splitname]) if part.to is None else part.to
            for path, count in zip(files[part.splitname], counts[part.splitname], strict=True):
                start, stop = max(first, offset), min(last, offset + count)
                if start < stop:
                    pieces.append(f"{path}{PIECE_SEP}{start - offset}{PIECE_SEP}{stop - offset}")
                offset += count
        if not pieces:
            raise DataError(f"split {split!r} selects no examples. Received: split={split!r}")
        return pieces

    def records(self, units):
        import tensorflow as tf

        units = tf.convert_to_tensor(units, tf.string)
        if units.shape.rank == 0:
            units = tf.reshape(units, [1])
        return tf.data.Dataset.from_tensor_slices(units).flat_map(_piece_records)

    def _parse_spec(self) -> dict:
        """``tf.io.parse_example``'s spec of ``data.source.features``."""
        import tensorflow as tf

        return {name: tf.io.FixedLenFeature([] if s.dtype == "string" else s.shape,
                                            getattr(tf, s.dtype))
                for name, s in self.config.source.feature_specs.items()}

    def _split_label(self, decoded: dict):
        """``(x, y)``: the label feature apart; a single input feature unwrapped from its dict."""
        y = decoded.pop(self.config.source.label_name)
        return (next(iter(decoded.values())) if len(decoded) == 1 else decoded), y

    def decoder(self):
        return self._decoder(batched=False)

    def batch_decoder(self):
        return self._decoder(batched=True)

    def _decoder(self, *, batched: bool):
        """``decode(record) -> (x, y)``, or of a batch of records (``batched``)."""
        import tensorflow as tf

        if self.config.source.features is None:  # the seed layout: a square raw image of any side
            return parse_square_images if batched else parse_square_image
        specs, parse_spec = self.config.source.feature_specs, self._parse_spec()
        parse = tf.io.parse_example if batched else tf.io.parse_single_example

        def decode(records):
            parsed = parse(records, parse_spec)
            return self._split_label({name: _decode_feature(parsed[name], spec, batched=batched)
                                      for name, spec in specs.items()})

        return decode

    def count(self, units):
        import numpy as np
        import tensorflow as tf

        counts = []
        for unit in units:
            piece = unit.split(PIECE_SEP)
            if len(piece) == 3:
                counts.append(int(piece[2]) - int(piece[1]))
            else:
                try:
                    counts.append(int(tf.data.TFRecordDataset(unit).reduce(
                        np.int64(0), lambda n, _: n + 1).numpy()))
                except tf.errors.OpError as err:
                    raise corrupt_file(unit, err) from None
        return counts

    def check(self, split):
        import tensorflow as tf

        units = super().check(split)
        decode = self.decoder()
        for unit in units:
            index, record = 0, None
            try:
                for record in self.records([unit]).take(CHECKED_RECORDS):
                    index += 1
                    decode(record)
            except tf.errors.DataLossError as err:
                raise corrupt_file(_file_of(unit), err) from None
            except (tf.errors.OpError, ValueError) as err:
                detail = tf_message(err)
                if record is not None and self.config.source.features is not None:
                    detail = _size_mismatch(record, self.config) or detail
                raise DataError(
                    f"data.source.features does not match file '{_file_of(unit)}' (record "
                    f"{index}): {detail}. "
                    f"Received: features={_spec_text(self.config)}") from None
        return units


def _size_mismatch(record, config) -> str | None:
    """Which feature of a serialized ``tf.train.Example`` holds another number of values than
    ``data.source.features`` declares (both counts), or None."""
    import tensorflow as tf

    try:
        example = tf.train.Example.FromString(bytes(record.numpy()))
    except Exception:  # noqa: BLE001 - not an Example: the parse error says so
        return None
    for name, spec in config.source.feature_specs.items():
        if spec.dtype == "string" or name not in example.features.feature:
            continue
        feature = example.features.feature[name]
        kind = feature.WhichOneof("kind")
        values = len(getattr(feature, kind).value) if kind else 0
        wanted = 1
        for d in spec.shape:
            wanted *= d
        if values != wanted:
            return (f"feature '{name}' holds {values} values, data.source.features gives shape "
                    f"{list(spec.shape)} ({wanted} values)")
    return None


def _spec_text(config) -> str:
    return json.dumps({k: v.model_dump() for k, v in config.source.feature_specs.items()})


def _decode_feature(value, spec, *, batched: bool = False):
    """One feature of ``data.source.features`` decoded (``raw``: uint8 reshaped to its shape;
    ``png``/``jpeg``: decoded images), of one record or, ``batched``, of a batch of records."""
    import tensorflow as tf

    if spec.encoding == "raw":
        return tf.reshape(tf.io.decode_raw(value, tf.uint8), [-1, *spec.shape] if batched else spec.shape)
    if spec.encoding in ("png", "jpeg") and batched:
        return tf.map_fn(lambda v: _decode_feature(v, spec), value,
                         fn_output_signature=tf.TensorSpec(spec.shape, tf.uint8))
    if spec.encoding in ("png", "jpeg"):
        image = tf.io.decode_image(value, channels=spec.shape[-1], expand_animations=False)
        return tf.ensure_shape(image, spec.shape)
    return value


class TFRecordKind(FileKind):
    kind = "tfrecord"
    source_class = TFRecordSource

    def check_sample(self, config, split, limit):
        # the default MNIST layout is checked as the in-memory sources are, on raw uint8 arrays
        return self.sample(config, split, limit, preprocessed=config.source.features is not None)

    def load(self, config, split):
        if config.source.features is None:  # the MNIST layout as uint8 arrays, as the idx source gives
            return slice_split(split, lambda name: load_tfrecord_split(Path(config.source.path), name))
        return super().load(config, split)

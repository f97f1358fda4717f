"""Streaming file sources: which files hold a split, how a file's records are read, decoded and
counted, and the bad-input checks run on them before training.

Each source is a :class:`FileSource`: ``units(split)`` lists the split's shardable units (files;
for ``image_folder`` each image file), ``records(units)`` reads them as a ``tf.data.Dataset`` of
raw, undecoded elements (a serialized ``tf.train.Example``, a CSV line, an image path), and
``decode(element) -> (x, y)`` turns one element into an example. Shuffling, sharding, skipping
(resume) and batching happen on the raw elements (:mod:`kerasdist.data.streams`), so a resumed
stream skips records without decoding them.

Libraries used, not reimplemented: ``tf.data.TFRecordDataset`` + ``tf.io.parse_single_example``
(tfrecord), ``tf.data.TextLineDataset`` + ``tf.io.decode_csv`` (csv), ``tf.io.decode_image`` +
``tf.image.resize`` (image_folder, the layout and class order of
``keras.utils.image_dataset_from_directory``).
"""

from __future__ import annotations

import csv
import glob
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kerasdist.config.data_configs import is_pattern
from kerasdist.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""The image files ``image_folder`` reads (those ``image_dataset_from_directory`` reads)."""
CHECKED_RECORDS = 8
"""Records (or lines) per file parsed by :meth:`FileSource.check` before training."""
CSV_SCHEMA_FILE = "data/csv-schema.json"
"""Where a csv run keeps its vocabularies and column statistics (relative to output.run_dir)."""


def split_files(config, split: str, pattern: str) -> list[str]:
    """The sorted files of ``split``: ``data.path`` with ``{split}`` replaced, or
    ``<data.path>/<split><pattern>`` for a folder.

    Raises:
        DataError: a glob without ``{split}`` (every split would read the same files).
    """
    path = str(config.path)
    if "{split}" in path:
        return sorted(glob.glob(path.replace("{split}", split)))
    if is_pattern(path):
        raise DataError(f"data.path is a glob without {{split}}: every split would read the same "
                        f"files. Received: path='{path}'; use e.g. '{Path(path).parent}/{{split}}"
                        f"{Path(path).name}'")
    return sorted(str(p) for p in Path(path).glob(f"{split}{pattern}"))


@dataclass
class FileSource:
    """A streaming source (see module docs). ``schema`` holds what the source computed once from
    the training split (csv vocabularies), written to the run directory as ``artifacts``."""

    config: Any
    artifacts: dict[str, str] = field(default_factory=dict)

    def units(self, split: str) -> list[str]:
        raise NotImplementedError

    def records(self, units):
        raise NotImplementedError

    def decoder(self) -> Callable:
        """``decode(element) -> (x, y)``; built inside each dataset function (lookup tables)."""
        raise NotImplementedError

    def batch_decoder(self) -> Callable | None:
        """``decode(records) -> (x, y)`` on a batch of raw records (one vectorized op instead of
        one per record), or None: :meth:`decoder` is mapped over single records."""
        return None

    def count(self, units: list[str]) -> list[int]:
        """Examples in each unit."""
        raise NotImplementedError

    def check(self, split: str) -> list[str]:
        """The split's units, after checking that they exist and their first records decode.

        Raises:
            DataError: naming the field, the file, the record or line, and the value received.
        """
        units = self.units(split)
        if not units:
            raise DataError(f"data.path: no files for split '{split}' of source "
                            f"'{self.config.source}'. Received: path='{self.config.path}'")
        return units


# ------------------------------------------------------------------------------------ tfrecord
class TFRecordSource(FileSource):
    """``tf.train.Example`` records parsed with ``data.features`` (default: MNIST layout)."""

    def units(self, split):
        return split_files(self.config, split, "*.tfrecord*")

    def records(self, units):
        import tensorflow as tf

        return tf.data.TFRecordDataset(units)

    def decoder(self):
        import tensorflow as tf

        if self.config.features is None:  # the seed layout: a square raw image of any side
            from kerasdist.data.sources import parse_square_image

            return parse_square_image
        specs, label = self.config.feature_specs, self.config.label_name
        parse_spec = {name: tf.io.FixedLenFeature(
            [] if s.dtype == "string" else s.shape, getattr(tf, s.dtype)) for name, s in specs.items()}

        def decode(record):
            parsed = tf.io.parse_single_example(record, parse_spec)
            out = {name: _decode_feature(parsed[name], spec) for name, spec in specs.items()}
            y = out.pop(label)
            return (next(iter(out.values())) if len(out) == 1 else out), y

        return decode

    def batch_decoder(self):
        import tensorflow as tf

        if self.config.features is None:
            return _parse_square_images
        specs, label = self.config.feature_specs, self.config.label_name
        parse_spec = {name: tf.io.FixedLenFeature(
            [] if s.dtype == "string" else s.shape, getattr(tf, s.dtype)) for name, s in specs.items()}

        def decode(records):
            parsed = tf.io.parse_example(records, parse_spec)
            out = {name: _decode_batch_feature(parsed[name], spec) for name, spec in specs.items()}
            y = out.pop(label)
            return (next(iter(out.values())) if len(out) == 1 else out), y

        return decode

    def count(self, units):
        import numpy as np
        import tensorflow as tf

        return [int(tf.data.TFRecordDataset(u).reduce(np.int64(0), lambda n, _: n + 1).numpy())
                for u in units]

    def check(self, split):
        import tensorflow as tf

        units = super().check(split)
        decode = self.decoder()
        for unit in units:
            index = 0
            try:
                for record in tf.data.TFRecordDataset(unit).take(CHECKED_RECORDS):
                    index += 1
                    decode(record)
            except (tf.errors.OpError, ValueError) as err:
                detail = getattr(err, "message", str(err)).splitlines()[0][:300]
                raise DataError(
                    f"data.features does not match file '{unit}' (record {index}): {detail}. "
                    f"Received: features={_spec_text(self.config)}") from None
        return units


def _spec_text(config) -> str:
    return json.dumps({k: v.model_dump() for k, v in config.feature_specs.items()})


def _parse_square_images(records):
    """A batch of seed-layout records -> (uint8 ``(b, side, side)``, int64 ``(b,)``)."""
    import tensorflow as tf

    spec = {"image_raw": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    parsed = tf.io.parse_example(records, spec)
    images = tf.io.decode_raw(parsed["image_raw"], tf.uint8)
    side = tf.cast(tf.round(tf.sqrt(tf.cast(tf.shape(images)[1], tf.float32))), tf.int32)
    return tf.reshape(images, [-1, side, side]), parsed["label"]


def _decode_batch_feature(values, spec):
    import tensorflow as tf

    if spec.encoding == "raw":
        return tf.reshape(tf.io.decode_raw(values, tf.uint8), [-1, *spec.shape])
    if spec.encoding in ("png", "jpeg"):
        return tf.map_fn(lambda v: _decode_feature(v, spec), values,
                         fn_output_signature=tf.TensorSpec(spec.shape, tf.uint8))
    return values


def _decode_feature(value, spec):
    import tensorflow as tf

    if spec.encoding == "raw":
        return tf.reshape(tf.io.decode_raw(value, tf.uint8), spec.shape)
    if spec.encoding in ("png", "jpeg"):
        image = tf.io.decode_image(value, channels=spec.shape[-1], expand_animations=False)
        return tf.ensure_shape(image, spec.shape)
    return value


# ----------------------------------------------------------------------------------------- csv
@dataclass
class CsvSchema:
    """Columns of a csv source, the numeric columns' mean and std and the categorical columns'
    vocabularies, computed once from the training split."""

    header: list[str]
    numeric: list[str]
    categorical: list[str]
    mean: list[float]
    std: list[float]
    vocabulary: dict[str, list[str]]

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True)

    @property
    def width(self) -> int:
        """Features per example: numeric columns + one-hot slots (vocabulary + 1 for unseen)."""
        return len(self.numeric) + sum(len(self.vocabulary[c]) + 1 for c in self.categorical)


def _header(path: str) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"data.path: cannot read CSV file '{path}': {err}") from None


def _float(value: str, *, column: str, path: str, line: int) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise DataError(f"data.numeric: column '{column}' of '{path}' line {line} is not a finite "
                        f"number. Received: {value!r}")
    return number


class CsvSource(FileSource):
    """CSV files with a header row (see module docs). ``x`` is float32 ``(width,)``: the numeric
    columns (standardized when ``data.normalize``), then each categorical column one-hot over its
    vocabulary + 1 (slot 0 = a value unseen in the training split)."""

    schema: CsvSchema | None = None

    def units(self, split):
        return split_files(self.config, split, "*.csv")

    def records(self, units):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(units).flat_map(
            lambda f: tf.data.TextLineDataset(f).skip(1))

    def check(self, split):
        units = super().check(split)
        label = self.config.label_name
        first = _header(units[0])
        for unit in units:
            header = _header(unit)
            if label not in header:
                raise DataError(f"data.label: column '{label}' is not in the header of '{unit}' "
                                f"(line 1: {', '.join(header)}). Received: label='{label}'")
            if header != first:
                raise DataError(f"data.path: '{unit}' has other columns than '{units[0]}'. "
                                f"Received: header {header}")
            for column in (self.config.numeric or []) + self.config.categorical:
                if column not in header:
                    raise DataError(f"data.numeric/data.categorical: column '{column}' is not in "
                                    f"the header of '{unit}' ({', '.join(header)}). Received: "
                                    f"'{column}'")
        return units

    def load_schema(self, train_units: list[str], run_dir: Path | None) -> CsvSchema:
        """The run's schema: read from ``<run_dir>/data/csv-schema.json`` when a previous run
        wrote it (every worker and a resumed run use the same ids), else computed in one pass over
        the training split and kept in ``artifacts`` for the chief to write."""
        saved = Path(run_dir) / CSV_SCHEMA_FILE if run_dir is not None else None
        if saved is not None and saved.is_file():
            self.schema = CsvSchema(**json.loads(saved.read_text(encoding="utf-8")))
        else:
            self.schema = self._compute(train_units)
            self.artifacts[CSV_SCHEMA_FILE] = self.schema.to_json()
        return self.schema

    def _compute(self, units: list[str]) -> CsvSchema:
        config = self.config
        header = _header(units[0])
        categorical = list(config.categorical)
        numeric = list(config.numeric) if config.numeric is not None else [
            c for c in header if c != config.label_name and c not in categorical]
        index = {c: header.index(c) for c in header}
        total, sums, squares = 0, [0.0] * len(numeric), [0.0] * len(numeric)
        seen: dict[str, set[str]] = {c: set() for c in categorical}
        for unit in units:
            with open(unit, newline="", encoding="utf-8") as handle:
                rows = csv.reader(handle)
                next(rows, None)
                for line, row in enumerate(rows, start=2):
                    if len(row) != len(header):
                        raise DataError(f"data.path: '{unit}' line {line} has {len(row)} fields, "
                                        f"the header {len(header)}. Received: {row[:8]}")
                    for k, column in enumerate(numeric):
                        value = _float(row[index[column]], column=column, path=unit, line=line)
                        sums[k] += value
                        squares[k] += value * value
                    for column in categorical:
                        seen[column].add(row[index[column]])
                    total += 1
        mean = [s / max(total, 1) for s in sums]
        std = [math.sqrt(max(q / max(total, 1) - m * m, 0.0)) or 1.0
               for q, m in zip(squares, mean, strict=True)]
        return CsvSchema(header=header, numeric=numeric, categorical=categorical, mean=mean,
                         std=std, vocabulary={c: sorted(seen[c]) for c in categorical})

    def decoder(self):
        import tensorflow as tf

        schema, config = self.schema, self.config
        label = config.label_name
        label_dtype = getattr(tf, config.label_dtype)
        defaults = []
        for column in schema.header:
            if column in schema.numeric:
                defaults.append(tf.constant([], tf.float32))
            elif column == label:
                defaults.append(tf.constant([], label_dtype))
            else:
                defaults.append(tf.constant([], tf.string) if column in schema.categorical else "")
        mean = tf.constant(schema.mean if config.normalize else [0.0] * len(schema.numeric))
        std = tf.constant(schema.std if config.normalize else [1.0] * len(schema.numeric))
        tables = {c: tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(schema.vocabulary[c] or [""], tf.string),
            tf.range(1, max(len(schema.vocabulary[c]), 1) + 1, dtype=tf.int64)), default_value=0)
            for c in schema.categorical}
        where = {c: schema.header.index(c) for c in schema.header}

        def decode(lines):  # one line () or a batch of lines (b,): the same ops, axis -1
            fields = tf.io.decode_csv(lines, defaults)
            parts = []
            if schema.numeric:
                numbers = tf.stack([fields[where[c]] for c in schema.numeric], axis=-1)
                parts.append((numbers - mean) / std)
            for column in schema.categorical:
                ids = tables[column].lookup(fields[where[column]])
                parts.append(tf.one_hot(ids, len(schema.vocabulary[column]) + 1, dtype=tf.float32))
            return tf.concat(parts, axis=-1), fields[where[label]]

        return decode

    def batch_decoder(self):
        return self.decoder()  # decode_csv, lookups and one_hot take a vector of lines as well

    def count(self, units):
        counts = []
        for unit in units:
            with open(unit, "rb") as handle:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
                handle.seek(max(handle.tell() - 1, 0))
                ends_open = handle.tell() > 0 and handle.read(1) != b"\n"
            counts.append(max(lines + int(ends_open) - 1, 0))
        return counts


# -------------------------------------------------------------------------------- image_folder
class ImageFolderSource(FileSource):
    """``<path>/<split>/<class_name>/*.png|jpg``: classes are the sorted sub-folder names of the
    training split (as ``keras.utils.image_dataset_from_directory`` orders them); ``x`` is float32
    ``(height, width, channels)`` (in [0, 1] when ``data.normalize``, else [0, 255]), ``y`` int64."""

    classes: list[str] | None = None

    def folder(self, split: str) -> Path:
        path = str(self.config.path)
        return Path(path.replace("{split}", split)) if "{split}" in path else Path(path) / split

    def set_classes(self, train_split: str) -> list[str]:
        folder = self.folder(train_split)
        self.classes = sorted(p.name for p in folder.iterdir() if p.is_dir()) \
            if folder.is_dir() else []
        if not self.classes:
            raise DataError(f"data.path: '{folder}' holds no class folders (<class_name>/*.png|jpg) "
                            f"for split '{train_split}'. Received: path='{self.config.path}'")
        return self.classes

    def units(self, split):
        folder = self.folder(split)
        if not folder.is_dir():
            return []
        return sorted(str(p) for p in folder.glob("*/*")
                      if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())

    def check(self, split):
        units = super().check(split)
        unknown = sorted({Path(u).parent.name for u in units} - set(self.classes))
        if unknown:
            raise DataError(f"data.path: split '{split}' has class folders the training split has "
                            f"not ({', '.join(unknown[:5])}) in '{self.folder(split)}'. Received: "
                            f"classes {unknown[:5]}")
        import tensorflow as tf

        for unit in units[:CHECKED_RECORDS]:
            try:
                tf.io.decode_image(tf.io.read_file(unit), channels=self.config.channels,
                                   expand_animations=False)
            except tf.errors.OpError as err:
                raise DataError(f"data.path: '{unit}' is not a readable image: "
                                f"{err.message.splitlines()[0][:200]}. Received: file '{unit}'") \
                    from None
        return units

    def records(self, units):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(units)

    def decoder(self):
        import tensorflow as tf

        config = self.config
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(self.classes), tf.range(len(self.classes), dtype=tf.int64)), -1)
        scale = 255.0 if config.normalize else 1.0

        def decode(path):
            image = tf.io.decode_image(tf.io.read_file(path), channels=config.channels,
                                       expand_animations=False)
            image = tf.image.resize(image, config.image_size) / scale
            parts = tf.strings.split(path, "/")
            return tf.ensure_shape(image, (*config.image_size, config.channels)), \
                table.lookup(parts[-2])

        return decode

    def count(self, units):
        return [1] * len(units)


def file_source(config) -> FileSource:
    """The :class:`FileSource` of a streaming file source (``tfrecord``, ``csv``, ``image_folder``)."""
    kinds = {"tfrecord": TFRecordSource, "csv": CsvSource, "image_folder": ImageFolderSource}
    return kinds[config.source](config)

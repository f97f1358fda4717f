"""Source ``csv``: CSV files with a header row, read with ``tf.data.TextLineDataset`` and
``tf.io.decode_csv``; categorical columns become ids with a vocabulary computed once from the
training split and kept in the run directory (:data:`CSV_SCHEMA_FILE`). See
:mod:`kerasdist.data.formats` for the :class:`~kerasdist.data.formats.FileSource` protocol."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kerasdist.data.formats import FileSource, split_files
from kerasdist.errors import DataError

CSV_SCHEMA_FILE = "data/csv-schema.json"
"""Where a csv run keeps its vocabularies and column statistics (relative to output.run_dir)."""


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

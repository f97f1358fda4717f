"""Source ``csv``: CSV files with a header row, read with ``tf.data.TextLineDataset`` and
``tf.io.decode_csv`` (:class:`CsvSource`, a :class:`~kerasdist.data.sources.files.FileSource`).

Columns are matched by header name: the training split's first file gives the reference order,
and every file must have the same columns in any order (a unit carries its permutation,
``path<SEP>i,j,...``). Before anything is written every file of a split is read once in Python:
each numeric cell and label must parse, so a bad value is reported with its file, line, column and
value; the training split's pass also computes the numeric columns' mean and std (Welford, in
float64) and the categorical vocabularies, kept in the run directory (:data:`CSV_SCHEMA_FILE`).
A UTF-8 byte order mark is accepted.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from kerasdist.data.sources.files import FileKind, FileSource, split_files
from kerasdist.errors import DataError

CSV_SCHEMA_FILE = "data/csv-schema.json"
"""Where a csv run keeps its vocabularies and column statistics (relative to output.run_dir)."""
UNIT_SEP = "\x00"
"""Separates a csv unit's file from its column permutation (see module docs)."""
FLOAT32_MAX = 3.4028234663852886e38


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


def _open(path: str):
    return open(path, newline="", encoding="utf-8-sig")  # -sig: a UTF-8 BOM is not data


def _header(path: str) -> list[str]:
    try:
        with _open(path) as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"data.source.path: cannot read CSV file '{path}': {err}") from None


def file_of(unit: str) -> str:
    """The file of a csv unit (see :data:`UNIT_SEP`)."""
    return unit.split(UNIT_SEP)[0]


def _number(value: str) -> float:
    """``value`` as a float, NaN when it is not a number."""
    try:
        return float(value)
    except ValueError:
        return math.nan


def _float(value: str, *, column: str, path: str, line: int) -> float:
    number = _number(value)
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        big = " (as float32: at most 3.4e38 in size)" if math.isfinite(number) else ""
        raise DataError(f"data.source.numeric: column '{column}' of '{path}' line {line} is not a finite "
                        f"number{big}. Received: {value!r}")
    return number


def _label(value: str, *, dtype: str, column: str, path: str, line: int) -> None:
    if dtype == "float32":
        number = _number(value)
        if math.isfinite(number) and abs(number) <= FLOAT32_MAX:
            return
        raise DataError(f"data.source.label: column '{column}' of '{path}' line {line} is not a finite "
                        f"number (data.source.label_dtype float32). Received: {value!r}")
    with contextlib.suppress(ValueError):
        int(value.strip())
        return
    try:
        float(value)
        hint = ("; a regression target? Set data.source.label_dtype: float32 (class labels are whole "
                "numbers)")
    except ValueError:
        hint = ""
    raise DataError(f"data.source.label: column '{column}' of '{path}' line {line} is not an integer "
                    f"class id (data.source.label_dtype int64){hint}. Received: {value!r}")


def _input_name(column: str) -> str:
    """A Keras input name for a column (letters, digits, ``_``, ``-`` and ``.`` kept)."""
    import re

    return re.sub(r"[^\w.-]", "_", column) or "column"


_SCANS: dict[tuple, tuple] = {}
"""The pre-pass results of this process by ``(source config, units, files' size and mtime)``: the
launch preflight, the data checks and the stream's build each open the source, and a split whose
files have not changed is read once, not once per step."""
_MAX_SCANS = 16


def _stamp(units: list[str]) -> tuple:
    """Size and modification time (ns) of each unit's file: a file rewritten is read again."""
    stamps = []
    for unit in units:
        try:
            stat = os.stat(file_of(unit))
        except OSError:
            return (None,)  # unreadable: not cached, the read names the error
        stamps.append((stat.st_size, stat.st_mtime_ns))
    return tuple(stamps)


class _Welford:
    """Mean and population std of a stream of float64 values (Welford's algorithm: no sum of
    squares, which overflows or cancels)."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else 0.0


class CsvSource(FileSource):
    """CSV files with a header row (see module docs). ``x`` is float32 ``(width,)``: the numeric
    columns (standardized when ``data.normalize``), then each categorical column one-hot over its
    vocabulary + 1 (slot 0 = a value unseen in the training split)."""

    schema: CsvSchema | None = None
    _reference: tuple[str, list[str]] | None = None
    _scanned: dict[str, tuple] | None = None

    def units(self, split):
        return split_files(self.config, split, "*.csv")

    def reference(self) -> tuple[str, list[str]]:
        """``(file, header)``: the first file of the training split and its columns, the order
        every other file's columns are matched to by name."""
        if self._reference is None:
            files = self.units(self.config.train_split)
            if not files:
                super().check(self.config.train_split)  # names the split and the folder
            self._reference = (files[0], _header(files[0]))
        return self._reference

    def records(self, units):
        import tensorflow as tf

        def lines(unit):
            parts = tf.strings.split(unit, UNIT_SEP)
            perm = tf.strings.to_number(tf.strings.split(parts[1], ","), tf.int64)
            return tf.data.TextLineDataset(parts[0]).skip(1).map(lambda line: (line, perm))

        return tf.data.Dataset.from_tensor_slices(units).flat_map(lines)

    def _columns(self) -> tuple[list[str], list[str]]:
        config = self.config
        _, header = self.reference()
        categorical = list(config.source.categorical)
        numeric = list(config.source.numeric) if config.source.numeric is not None else [
            c for c in header if c != config.source.label_name and c not in categorical]
        return numeric, categorical

    def check(self, split):
        files = super().check(split)
        label = self.config.source.label_name
        first, reference = self.reference()
        if label not in reference:
            raise DataError(f"data.source.label: column '{label}' is not in the header of '{first}' "
                            f"(line 1: {', '.join(reference)}). Received: label='{label}'")
        for column in (self.config.source.numeric or []) + self.config.source.categorical:
            if column not in reference:
                raise DataError(f"data.source.numeric/data.source.categorical: column '{column}' is not in "
                                f"the header of '{first}' ({', '.join(reference)}). Received: "
                                f"'{column}'")
        units = []
        for path in files:
            header = _header(path)
            for column in reference:
                if column not in header:
                    raise DataError(f"data.source.path: '{path}' has no column '{column}', which the "
                                    f"training split's '{first}' has (columns are matched by "
                                    f"name). Received: header {header}")
            for column in header:
                if column not in reference or header.count(column) > 1:
                    what = "twice" if header.count(column) > 1 else \
                        f"which the training split's '{first}' has not"
                    raise DataError(f"data.source.path: '{path}' has a column '{column}' {what} "
                                    f"(columns are matched by name). Received: header {header}")
            units.append(path + UNIT_SEP + ",".join(str(header.index(c)) for c in reference))
        self._scan(split, units)
        return units

    def _scan(self, split: str, units: list[str]) -> tuple:
        """The pre-pass over a split's files (see module docs): checks every numeric cell and
        label, and returns ``(statistics per numeric column, vocabulary sets)``; once per split
        and process while its files are unchanged (:data:`_SCANS`)."""
        if self._scanned is None:
            self._scanned = {}
        if split not in self._scanned:
            key = (repr(self.config.source), tuple(units), _stamp(units))
            if key not in _SCANS:  # not read by an earlier check of this process
                scanned = self._read(units)
                if None in key[2]:
                    return scanned
                _SCANS[key] = scanned
                while len(_SCANS) > _MAX_SCANS:
                    _SCANS.pop(next(iter(_SCANS)))
            self._scanned[split] = _SCANS[key]
        return self._scanned[split]

    def _read(self, units: list[str]) -> tuple:
        config = self.config
        numeric, categorical = self._columns()
        label, dtype = config.source.label_name, config.source.label_dtype
        stats = {c: _Welford() for c in numeric}
        seen: dict[str, set[str]] = {c: set() for c in categorical}
        for unit in units:
            path = file_of(unit)
            with _open(path) as handle:
                rows = csv.reader(handle)
                header = next(rows, [])
                index = {c: header.index(c) for c in header}
                for line, row in enumerate(rows, start=2):
                    if len(row) != len(header):
                        raise DataError(f"data.source.path: '{path}' line {line} has {len(row)} "
                                        f"fields, the header {len(header)}. Received: {row[:8]}")
                    for column in numeric:
                        stats[column].add(_float(row[index[column]], column=column, path=path,
                                                 line=line))
                    _label(row[index[label]], dtype=dtype, column=label, path=path, line=line)
                    for column in categorical:
                        seen[column].add(row[index[column]])
        return stats, seen

    def open(self, run_dir) -> list[str]:
        units = self.check(self.config.train_split)
        self.load_schema(units, run_dir)
        return units

    def load_schema(self, train_units: list[str], run_dir: Path | None) -> CsvSchema:
        """The run's schema: read from ``<run_dir>/data/csv-schema.json`` when a previous run
        wrote it (every worker and a resumed run use the same ids), else computed in one pass over
        the training split; kept in ``artifacts`` for the chief to write either way."""
        saved = Path(run_dir) / CSV_SCHEMA_FILE if run_dir is not None else None
        if saved is not None and saved.is_file():
            self.schema = CsvSchema(**json.loads(saved.read_text(encoding="utf-8")))
            first, reference = self.reference()
            if set(self.schema.header) != set(reference):
                raise DataError(f"data.source.path: the columns of '{first}' ({', '.join(reference)}) "
                                f"are not those the run's '{saved}' was computed on "
                                f"({', '.join(self.schema.header)}). Received: path="
                                f"'{self.config.source.path}'")
        else:
            self.schema = self._compute(train_units)
        # written (again) by the chief: a run that --overwrite moved aside took the old copy along
        self.artifacts[CSV_SCHEMA_FILE] = self.schema.to_json()
        return self.schema

    def _compute(self, units: list[str]) -> CsvSchema:
        numeric, categorical = self._columns()
        stats, seen = self._scan(self.config.train_split, units)
        for column in numeric if self.config.normalize else ():
            if (stats[column].std or 0.0) ** 2 > FLOAT32_MAX:
                raise DataError(
                    f"data.source.path: column '{column}' of split '{self.config.train_split}' "
                    f"(first file '{self.reference()[0]}') has a standard deviation of "
                    f"{stats[column].std:.3g}, whose square (the variance the saved inference "
                    f"model normalizes with) is not finite in float32; rescale the column (e.g. "
                    f"to other units). Received: std={stats[column].std:.3g}")
        return CsvSchema(header=list(self.reference()[1]), numeric=numeric,
                         categorical=categorical, mean=[stats[c].mean for c in numeric],
                         std=[stats[c].std or 1.0 for c in numeric],
                         vocabulary={c: sorted(seen[c]) for c in categorical})

    def decoder(self):
        import tensorflow as tf

        schema, config = self.schema, self.config
        reference = self.reference()[1]
        label_dtype = getattr(tf, config.source.label_dtype)
        mean = tf.constant(schema.mean if config.normalize else [0.0] * len(schema.numeric),
                           tf.float32)
        std = tf.constant(schema.std if config.normalize else [1.0] * len(schema.numeric),
                          tf.float32)
        tables = {c: tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(schema.vocabulary[c] or [""], tf.string),
            tf.range(1, max(len(schema.vocabulary[c]), 1) + 1, dtype=tf.int64)), default_value=0)
            for c in schema.categorical}
        where = {c: reference.index(c) for c in reference}
        defaults = [tf.constant("", tf.string)] * len(reference)

        def decode(lines, perms):  # one line () or a batch of lines (b,) with their permutations
            single = lines.shape.rank == 0
            if single:
                lines, perms = lines[None], perms[None]
            fields = tf.stack(tf.io.decode_csv(lines, defaults), axis=-1)  # (b, columns) as read
            fields = tf.gather(fields, perms, batch_dims=1)  # (b, columns) in the reference order
            parts = []
            if schema.numeric:
                cells = tf.stack([fields[:, where[c]] for c in schema.numeric], axis=-1)
                numbers = tf.strings.to_number(tf.strings.strip(cells), tf.float32)
                parts.append((numbers - mean) / std)
            for column in schema.categorical:
                ids = tables[column].lookup(fields[:, where[column]])
                parts.append(tf.one_hot(ids, len(schema.vocabulary[column]) + 1, dtype=tf.float32))
            x = tf.concat(parts, axis=-1)
            y = tf.strings.to_number(tf.strings.strip(fields[:, where[config.source.label_name]]),
                                     label_dtype)
            return (x[0], y[0]) if single else (x, y)

        return decode

    def serving_model(self, model, run_dir: Path):
        """``model`` behind the run's preprocessing as Keras layers, so that it predicts **raw
        rows**: one input per column used (numeric columns float32 ``(1,)``, categorical ones
        string ``(1,)``), ``keras.layers.Normalization`` with the training split's mean and
        variance (when ``data.normalize``) and ``keras.layers.StringLookup`` one-hot over the
        saved vocabulary (index 0: a value unseen in training), concatenated in the order the
        input pipeline uses, then ``model``. Built from ``<run_dir>/data/csv-schema.json`` (the
        statistics training used), so it gives what the pipeline gives."""
        import keras

        schema = CsvSchema(**json.loads((Path(run_dir) / CSV_SCHEMA_FILE)
                                        .read_text(encoding="utf-8")))
        inputs, parts = {}, []
        for column in schema.numeric:
            inputs[column] = keras.Input(shape=(1,), dtype="float32", name=_input_name(column))
        if schema.numeric:
            numbers = [inputs[c] for c in schema.numeric]
            x = numbers[0] if len(numbers) == 1 else keras.layers.Concatenate()(numbers)
            if self.config.normalize:
                x = keras.layers.Normalization(mean=schema.mean,
                                               variance=[s * s for s in schema.std])(x)
            parts.append(x)
        for column in schema.categorical:
            inputs[column] = keras.Input(shape=(1,), dtype="string", name=_input_name(column))
            parts.append(keras.layers.StringLookup(
                vocabulary=schema.vocabulary[column] or [""], num_oov_indices=1,
                output_mode="one_hot")(inputs[column]))
        features = parts[0] if len(parts) == 1 else keras.layers.Concatenate()(parts)
        return keras.Model(inputs, model(features), name=f"{model.name}_on_raw_rows")

    def batch_decoder(self):
        return self.decoder()  # decode_csv, lookups and one_hot take a vector of lines as well

    def count(self, units):
        counts = []
        for unit in units:
            with open(file_of(unit), "rb") as handle:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
                handle.seek(max(handle.tell() - 1, 0))
                ends_open = handle.tell() > 0 and handle.read(1) != b"\n"
            counts.append(max(lines + int(ends_open) - 1, 0))
        return counts


class CsvKind(FileKind):
    kind = "csv"
    source_class = CsvSource

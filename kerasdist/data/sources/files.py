"""What the file kinds (``tfrecord``, ``csv``, ``image_folder``) share: the :class:`FileSource`
protocol each kind's module implements, the files of a split, and :class:`FileKind`, which turns a
source's files into the one stream's :class:`~kerasdist.data.stream.Units`. Shuffling, sharding,
skipping and batching happen on raw, undecoded records; no split is read whole into memory.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kerasdist._log import get_logger
from kerasdist.config.source_configs import is_pattern
from kerasdist.data import stream
from kerasdist.data.convert import shard_policy
from kerasdist.data.sources.base import SourceKind
from kerasdist.data.stream import Streaming, Units
from kerasdist.errors import DataError

log = get_logger("data")

CHECKED_RECORDS = 8
"""Records (or lines) per file parsed by :meth:`FileSource.check` before training."""


def split_files(config, split: str, pattern: str) -> list[str]:
    """The sorted files of ``split``: ``data.source.path`` with ``{split}`` replaced, or
    ``<data.source.path>/<split><pattern>`` for a folder.

    Raises:
        DataError: a glob without ``{split}`` (every split would read the same files).
    """
    path = str(config.source.path)
    if "{split}" in path:
        return sorted(glob.glob(path.replace("{split}", split)))
    if is_pattern(path):
        raise DataError(f"data.source.path is a glob without {{split}}: every split would read the same "
                        f"files. Received: path='{path}'; use e.g. '{Path(path).parent}/{{split}}"
                        f"{Path(path).name}'")
    return sorted(str(p) for p in Path(path).glob(f"{split}{pattern}"))


@dataclass
class FileSource:
    """A streaming source (see module docs).

    Attributes:
        config: the ``DataConfig`` (the kind's fields are ``config.source.<field>``).
        artifacts: files the chief writes into the run directory (relative path -> text): what
            the source computed once from the training split (csv vocabularies).
    """

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

    def open(self, run_dir) -> list[str]:
        """Check the training split and compute what the source takes from it (image classes,
        csv vocabularies: read from ``run_dir`` when the run saved them); returns its units."""
        return self.check(self.config.train_split)

    def serving_model(self, model, run_dir):
        """``model`` behind the source's own preprocessing, to be saved beside ``model.keras``
        as ``inference_model.keras`` (a model that reads the source's raw examples), or None:
        the pipeline's decoding is all there is (csv:
        :meth:`kerasdist.data.sources.csv.CsvSource.serving_model`)."""
        return None

    def searched(self, split: str) -> str:
        """Where the split's files are looked for (for messages)."""
        path = str(self.config.source.path)
        return path.replace("{split}", split) if "{split}" in path else path

    def check(self, split: str) -> list[str]:
        """The split's units, after checking that they exist and their first records decode.

        Raises:
            DataError: naming the field, the file, the record or line, and the value received.
        """
        units = self.units(split)
        if not units:
            raise DataError(f"data.source.path: no files for split '{split}' of source "
                            f"'{self.config.kind}' in {path_where(self.searched(split))}. "
                            f"Received: path='{self.config.source.path}'")
        return units


def path_where(path) -> str:
    """``'path'``, quoted, and the working directory it is relative to (messages name the folder
    searched)."""
    path = Path(path)
    return f"'{path}'" if path.is_absolute() else f"'{path}' (relative to the working " \
        f"directory {Path.cwd()})"


def file_units(source: FileSource, units: list[str], policy: str) -> Units:
    """A :class:`FileSource`'s files as the stream's :class:`~kerasdist.data.stream.Units` under
    shard ``policy`` (``'file'``: units, ``'data'``: records, ``'off'``: none)."""
    return Units(read=lambda files, ctx: source.records(files), values=list(units),
                 shard={"file": "units", "data": "records"}.get(policy, "none"),
                 decoder=source.decoder, batch_decoder=source.batch_decoder)


def _per_pipeline(counts: list[int], pipelines: int, policy: str) -> int:
    total = sum(counts)
    if policy == "file":
        return min(sum(counts[i::pipelines]) for i in range(pipelines))
    if policy == "data":
        return total // pipelines
    return total


def build_files(source: FileSource, recipe, pipelines: int) -> Streaming:
    """The training stream and evaluation input of a :class:`FileSource` for ``pipelines`` input
    pipelines; ``per_pipeline`` counts the smallest file shard under ``'file'`` sharding.

    Raises:
        DataError, RecipeError: unreadable files, or a sharding that cannot be done.
    """
    config = recipe.data
    train_units = source.open(recipe.output.run_dir)
    eval_units = source.check(config.eval_split) if config.eval_split else None
    policy = shard_policy(config, pipelines, units=len(train_units),
                          what=config.traits.shard_units)
    counts = source.count(train_units)
    eval_fn, num_eval = None, 0
    if eval_units is not None:
        eval_fn = stream.eval_fn(file_units(source, eval_units, policy), config,
                                 shard=policy != "off")
        num_eval = sum(source.count(eval_units))
    log.info(f"input: source '{config.kind}' streams {len(train_units)} training file(s) "
             f"({sum(counts)} examples)")
    return Streaming(train_fn=stream.train_fn(file_units(source, train_units, policy), config),
                     eval_fn=eval_fn, per_pipeline=_per_pipeline(counts, pipelines, policy),
                     num_eval=num_eval, policy=policy, artifacts=dict(source.artifacts))


def file_split(source: FileSource, split: str, *, run_dir) -> Units:
    """``split`` of a file source as :class:`~kerasdist.data.stream.Units` read whole and in
    order, opened as training opened it (a csv source takes its vocabularies from
    ``<run_dir>/data/csv-schema.json`` when the run wrote one: the ids training used)."""
    source.open(run_dir)
    return file_units(source, source.check(split), "off")


class FileKind(SourceKind):
    """A source of files; subclasses name their :class:`FileSource` (``source_class``)."""

    source_class: type = None

    def source(self, config) -> FileSource:
        return self.source_class(config)

    def shard_policy(self, config, pipelines):
        units = self.source(config).units(config.train_split)
        return shard_policy(config, pipelines, units=len(units), what=config.traits.shard_units)

    def stream(self, recipe, pipelines):
        return build_files(self.source(recipe.data), recipe, pipelines)

    def serving_model(self, config, model, run_dir):
        return self.source(config).serving_model(model, run_dir)

    def eval_dataset(self, config, split, *, run_dir):
        return stream.global_batches(file_split(self.source(config), split, run_dir=run_dir), config)

    def sample(self, config, split, limit, *, run_dir=None, preprocessed=True):
        units = file_split(self.source(config), split, run_dir=run_dir)
        return stream.sample_records(config, split, units, limit, preprocessed=preprocessed)

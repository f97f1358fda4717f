"""The ``data`` section of a recipe: :class:`DataConfig` and its :class:`FeatureSpec`.

In-memory sources (``embedded``, ``idx``, ``npz``, ``synthetic_*``) are read whole into NumPy
arrays. Streaming sources read their files with ``tf.data`` and never hold a split in memory:

* ``tfrecord`` (a whole split name, or a TFDS slice such as ``test[:80%]``, read as pieces of
  files): ``tf.train.Example`` records parsed with the feature spec ``data.features`` (default:
  the MNIST layout ``image_raw`` + ``label``);
* ``csv``: CSV files with a header row; ``data.label`` names the label column;
* ``image_folder``: ``<path>/<split>/<class_name>/*.png|jpg`` (the layout of
  ``keras.utils.image_dataset_from_directory``);
* ``tfds``: any TensorFlow Datasets dataset, ``data.input`` and ``data.label`` name its features;
* ``python``: ``data.function`` (``pkg.module:function``) returns a ``tf.data.Dataset`` of
  unbatched ``(features, label)`` examples.

Contracts (what is read, sharding, resume): docs/own-model-and-data.md, "Data sources".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from kerasdist.config._base import Frozen

DataSource = Literal["embedded", "tfds", "idx", "npz", "tfrecord", "synthetic_linear",
                     "synthetic_clicks", "csv", "image_folder", "python"]
AutoShard = Literal["auto", "off", "data", "file"]


@dataclass(frozen=True)
class SourceTraits:
    """What a source kind is, for the checks of the recipe and of the data (the kinds' code is in
    :mod:`kerasdist.data.sources`, one module per kind; this table is where a kind declares
    what validation needs to know without importing it, as strategy configs declare theirs).

    Attributes:
        streams: read with ``tf.data`` as a stream (never whole in memory), not loaded as arrays.
        needs_path: ``data.path`` is required and must exist (unless a pattern).
        path_may_be_pattern: ``data.path`` may hold ``{split}`` or glob characters.
        whole_splits_only: splits are whole names (``train``), no TFDS slice.
        needs_label: ``data.label`` is required.
        needs_function: ``data.function`` is required.
        takes_features: ``data.features`` (a ``tf.train.Example`` spec) applies.
        function: the examples come from a function (``python``, ``tfds``): a split may be
            endless, so only its first batches are checked under ``trainer.steps_per_epoch``.
        shard_units: what sharding by file deals out to workers (messages).
        fields: the ``data`` fields of this kind, beside the common ones
            (:data:`COMMON_DATA_FIELDS`); ``kerasdist validate`` prints only these.
    """

    streams: bool = False
    needs_path: bool = False
    path_may_be_pattern: bool = False
    whole_splits_only: bool = False
    needs_label: bool = False
    needs_function: bool = False
    takes_features: bool = False
    function: bool = False
    shard_units: str = "examples"
    fields: tuple[str, ...] = ()


COMMON_DATA_FIELDS = ("source", "train_split", "eval_split", "batch_size", "shuffle_buffer",
                      "shuffle_seed", "normalize", "prefetch", "auto_shard")
"""The ``data`` fields of every source kind."""

SOURCE_TRAITS: dict[str, SourceTraits] = {
    "embedded": SourceTraits(),
    "synthetic_linear": SourceTraits(fields=("num_examples", "noise_std")),
    "synthetic_clicks": SourceTraits(fields=("num_examples", "num_users", "num_items")),
    "idx": SourceTraits(needs_path=True, fields=("path",)),
    "npz": SourceTraits(needs_path=True, fields=("path",)),
    "tfds": SourceTraits(streams=True, function=True,
                         fields=("name", "data_dir", "input", "label")),
    "python": SourceTraits(streams=True, function=True, needs_function=True,
                           fields=("function",)),
    "tfrecord": SourceTraits(streams=True, needs_path=True, path_may_be_pattern=True,
                             takes_features=True, shard_units="file(s)",
                             fields=("path", "features", "label")),
    "csv": SourceTraits(streams=True, needs_path=True, path_may_be_pattern=True,
                        whole_splits_only=True, needs_label=True, shard_units="file(s)",
                        fields=("path", "label", "numeric", "categorical", "label_dtype")),
    "image_folder": SourceTraits(streams=True, needs_path=True, path_may_be_pattern=True,
                                 whole_splits_only=True, shard_units="image file(s)",
                                 fields=("path", "image_size", "channels")),
}
"""The traits of every built-in ``data.source`` (see :class:`SourceTraits`)."""
STREAMING_SOURCES = tuple(kind for kind, traits in SOURCE_TRAITS.items() if traits.streams)
"""Sources read with ``tf.data`` as streams (``tfrecord``: whole splits and slices)."""
_GLOB = re.compile(r"[*?\[]")


class FeatureSpec(Frozen):
    """One feature of a ``tf.train.Example`` record (source ``tfrecord``).

    ``dtype`` is the dtype after parsing: ``float32`` and ``int64`` are read from a float or int64
    list of ``prod(shape)`` values; ``string`` is a bytes feature. ``encoding`` turns a bytes
    feature into an image: ``raw`` (``tf.io.decode_raw`` into ``uint8`` of ``shape``), ``png`` or
    ``jpeg`` (decoded to ``uint8`` ``(H, W, C)`` and checked against ``shape``).
    """

    dtype: Literal["float32", "int64", "string"] = Field(
        "float32", description="float32, int64 (list features) or string (bytes).")
    shape: list[int] = Field(default_factory=list, description="Per-example shape; [] = scalar.")
    encoding: Literal["none", "raw", "png", "jpeg"] = Field(
        "none", description="Bytes feature holding an image: raw uint8, png or jpeg; "
        "dtype must be string.")

    @model_validator(mode="after")
    def _encoding_needs_bytes(self) -> FeatureSpec:
        if self.encoding != "none" and self.dtype != "string":
            raise ValueError(f"an image encoding '{self.encoding}' is read from a bytes feature: "
                             f"dtype must be 'string'. Received: dtype='{self.dtype}'")
        if self.encoding in ("png", "jpeg") and len(self.shape) != 3:
            raise ValueError(f"a {self.encoding} image needs shape [height, width, channels]. "
                             f"Received: shape={self.shape}")
        if any(d < 1 for d in self.shape):
            raise ValueError(f"feature shape dimensions must be >= 1. Received: shape={self.shape}")
        return self


MNIST_FEATURES = {"image_raw": FeatureSpec(dtype="string", shape=[28, 28], encoding="raw"),
                  "label": FeatureSpec(dtype="int64")}
"""The default TFRecord spec: the seed's MNIST layout (``write_tfrecord`` writes it)."""


class DataConfig(Frozen):
    """``data``: where examples come from, how they are split, batched and shuffled.

    Splits use TFDS slicing syntax (``test[:80%]``, ``train[10:200]``) for in-memory sources,
    ``tfrecord``, ``tfds`` and ``python``; ``csv`` and ``image_folder`` take a whole split name
    (``train``). ``batch_size`` is the global batch
    size. Training batches drop the remainder so that every step consumes exactly ``batch_size``
    examples.
    """

    source: DataSource = "embedded"
    path: Path | None = Field(
        None, description="A relative path is resolved against the working directory of the "
        "command. idx/tfrecord/csv: a folder (tfrecord: <split>*.tfrecord*, csv: "
        "<split>*.csv) or a glob with {split} (csv/data/{split}-*.csv); image_folder: the folder "
        "holding <split>/<class>/ (or a path with {split}); npz: the file.")
    name: str = Field("mnist", description="TFDS dataset name (source 'tfds').")
    data_dir: Path | None = Field(None, description="TFDS data_dir (source 'tfds').")
    train_split: str = "test[:80%]"
    eval_split: str | None = "test[80%:]"
    batch_size: int = Field(128, gt=0, description="Global batch size, examples per step.")
    shuffle_buffer: int = Field(10_000, ge=0, description="0 disables shuffling.")
    shuffle_seed: int = 42
    normalize: bool = Field(True, description="Scale uint8 images to float32 in [0, 1]; csv: "
                            "standardize numeric columns with the training split's mean and std.")
    prefetch: int = Field(-1, ge=-1, description="Batches to prefetch; -1 = tf.data.AUTOTUNE.")
    num_examples: int = Field(1000, gt=0, description="synthetic_linear, synthetic_clicks: "
                              "examples generated per split.")
    noise_std: float = Field(0.33, ge=0, description="synthetic_linear: std of N(0, s^2).")
    num_users: int = Field(4_096, gt=0, description="synthetic_clicks: user ids are < this.")
    num_items: int = Field(1_048_576, gt=0, description="synthetic_clicks: item ids are < this.")
    auto_shard: AutoShard = Field(
        "auto",
        description="Multi-worker sharding: auto = by file for streaming sources with at least "
        "one file per worker, by data otherwise; off = every worker reads everything (seeded "
        "differently).",
    )
    label: str | None = Field(
        None, description="csv: the label column (required); tfrecord, tfds: the label feature "
        "(default 'label').")
    input: str | None = Field(
        None, description="tfds: the input feature (default 'image').")
    features: dict[str, FeatureSpec] | None = Field(
        None, description="tfrecord: feature name -> {dtype: float32|int64|string, shape: [..], "
        "encoding: none|raw|png|jpeg}; data.label names the label, the others "
        "are the model's inputs (one: an array; several: a dict by name). Default: the MNIST "
        "layout (image_raw raw uint8 28x28, label int64).")
    numeric: list[str] | None = Field(
        None, description="csv: numeric (float) columns; default every column that is neither "
        "the label nor categorical.")
    categorical: list[str] = Field(
        default_factory=list, description="csv: string columns turned into ids with a "
        "vocabulary of the training split (computed once, saved in the run directory as "
        "data/csv-schema.json), one-hot encoded after the numeric columns; id 0 = unseen value.")
    label_dtype: Literal["int64", "float32"] = Field(
        "int64", description="csv: class labels (int64) or regression targets (float32).")
    image_size: tuple[int, int] | None = Field(
        None, description="image_folder: [height, width] every image is resized to "
        "(bilinear, as keras.utils.image_dataset_from_directory); default: the first training "
        "image's size (logged), and images of another size are refused.")
    channels: Literal[1, 3, 4] | None = Field(
        None, description="image_folder: 1 grayscale, 3 RGB, 4 RGBA; default: the first "
        "training image's.")
    function: str | None = Field(
        None, description="python: 'pkg.module:function'; function(split, input_context=None) "
        "returns a tf.data.Dataset of unbatched (features, label). Imported and run: a recipe "
        "naming it is as trusted as that code.")

    @model_validator(mode="after")
    def _check_path(self) -> DataConfig:
        traits = self.traits
        needs_path = traits.needs_path
        if needs_path and self.path is None:
            raise ValueError(f"data.path is required for source '{self.source}'. Received: path=None")
        if needs_path and not is_pattern(self.path) and not self.path.exists():
            where = "" if self.path.is_absolute() else \
                f" (a relative path is resolved against the working directory, {Path.cwd()})"
            raise ValueError(f"data.path does not exist{where}. Received: path='{self.path}'")
        if needs_path and is_pattern(self.path) and not traits.path_may_be_pattern:
            raise ValueError(f"data.path for source '{self.source}' is a file or folder, not a "
                             f"pattern. Received: path='{self.path}'")
        return self

    @model_validator(mode="after")
    def _fields_of_source(self) -> DataConfig:
        source, traits = self.source, self.traits
        if traits.needs_label and not self.label:
            raise ValueError(f"data.label (the label column) is required for source '{source}'. "
                             "Received: label=None")
        if traits.needs_function and not self.function:
            raise ValueError("data.function ('pkg.module:function') is required for source "
                             f"'{source}'. Received: function=None")
        if self.function is not None:
            module, _, attr = self.function.partition(":")
            if not (module and all(p.isidentifier() for p in module.split("."))
                    and attr.isidentifier()):
                raise ValueError("data.function must be an import path 'package.module:function'. "
                                 f"Received: function={self.function!r}")
        return self

    @model_validator(mode="after")
    def _feature_spec_and_columns(self) -> DataConfig:
        source = self.source
        if self.features is not None:
            if not self.traits.takes_features:
                takers = [k for k, t in SOURCE_TRAITS.items() if t.takes_features]
                raise ValueError(f"data.features is for source {' and '.join(map(repr, takers))} "
                                 f"only. Received: source='{source}'")
            label = self.label or "label"
            if label not in self.features:
                raise ValueError(f"data.label '{label}' is not in data.features "
                                 f"({', '.join(self.features)}). Received: label={self.label!r}")
            if len(self.features) < 2:
                raise ValueError("data.features needs the label and at least one input feature. "
                                 f"Received: features={list(self.features)}")
        overlap = set(self.categorical) & set(self.numeric or [])
        if overlap or (self.label and self.label in set(self.categorical) | set(self.numeric or [])):
            raise ValueError("data.numeric, data.categorical and data.label must not share columns. "
                             f"Received: {sorted(overlap or {self.label})}")
        return self

    @model_validator(mode="after")
    def _splits_and_sizes(self) -> DataConfig:
        source = self.source
        for field in ("train_split", "eval_split"):
            split = getattr(self, field)
            if split is not None and self.traits.whole_splits_only \
                    and not is_whole_split(split):  # tfrecord: pieces of files; python, tfds: as written
                raise ValueError(f"data.{field} of a streaming source ('{source}') is a whole split "
                                 f"name (slices are for tfrecord, tfds, python and in-memory "
                                 f"sources). Received: "
                                 f"{field}={split!r}")
        if self.image_size is not None and min(self.image_size) < 1:
            raise ValueError(f"data.image_size must be [height, width] >= 1. Received: "
                             f"image_size={list(self.image_size)}")
        return self

    @property
    def traits(self) -> SourceTraits:
        """The :class:`SourceTraits` of ``data.source``."""
        return SOURCE_TRAITS[self.source]

    @property
    def label_name(self) -> str:
        """The label column / feature: ``data.label``, default ``'label'``."""
        return self.label or "label"

    @property
    def feature_specs(self) -> dict[str, FeatureSpec]:
        """``data.features``, default :data:`MNIST_FEATURES`."""
        return dict(self.features) if self.features is not None else dict(MNIST_FEATURES)


def is_pattern(path: Path | str | None) -> bool:
    """True when ``path`` holds ``{split}`` or glob characters (``*?[``)."""
    return path is not None and ("{split}" in str(path) or bool(_GLOB.search(str(path))))


def is_whole_split(split: str) -> bool:
    """True for a plain split name (``train``), False for a TFDS slice (``train[:80%]``)."""
    return bool(re.fullmatch(r"[\w-]+", split.strip()))

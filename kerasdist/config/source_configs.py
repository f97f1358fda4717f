"""``data.source``: one frozen config class per source kind (a pydantic union discriminated on
``kind``), each declaring its traits; a kind whose fields all have defaults may be named alone
(``source: embedded``). The kinds' code is in :mod:`kerasdist.data.sources`; validation reads only
these classes (no TensorFlow import). A new kind: one :class:`SourceConfigBase` subclass here
(registered when defined), one module in ``kerasdist/data/sources/``, one registry line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BeforeValidator, Field, field_validator, model_validator

from kerasdist.config._base import Frozen

_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class SourceTraits:
    """What a source kind is, declared once on its config class.

    Attributes:
        streams: read with ``tf.data`` as a stream (never whole in memory), not loaded as arrays.
        path_may_be_pattern: ``path`` may hold ``{split}`` or glob characters.
        whole_splits_only: splits are whole names (``train``), no TFDS slice.
        function: the examples come from a function (``python``, ``tfds``): a split may be
            endless, so only its first batches are checked under ``trainer.steps_per_epoch``.
        shard_units: what sharding by file deals out to workers (messages); ``examples`` for a
            source that is sharded by example.
    """

    streams: bool = False
    path_may_be_pattern: bool = False
    whole_splits_only: bool = False
    function: bool = False
    shard_units: str = "examples"


_SOURCE_CONFIGS: dict[str, type[SourceConfigBase]] = {}


class SourceConfigBase(Frozen):
    """Base of every ``data.source`` kind; a subclass sets ``kind`` (a ``Literal`` with its
    name as default) and ``traits``, and is registered as a recipe's source kind when defined."""

    kind: str
    traits: ClassVar[SourceTraits] = SourceTraits()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        kind = getattr(cls.model_fields.get("kind"), "default", None)
        if isinstance(kind, str):
            _SOURCE_CONFIGS[kind] = cls

    def __eq__(self, other: object) -> bool:
        # One release: code written for the flat form compares data.source with a kind's name.
        if isinstance(other, str):
            return self.kind == other
        return super().__eq__(other)

    def __hash__(self) -> int:  # consistent with __eq__: equal objects have the same kind
        return hash(self.kind)

    def __str__(self) -> str:
        return self.kind

    @property
    def label_name(self) -> str:
        """The label column or feature: ``label`` where the kind has one, default ``'label'``."""
        return getattr(self, "label", None) or "label"


def source_config_classes() -> dict[str, type[SourceConfigBase]]:
    """``{kind: config class}`` of every source kind recipes accept."""
    return dict(_SOURCE_CONFIGS)


class _PathSource(SourceConfigBase):
    """A kind that reads ``path`` (checked to exist unless it is a pattern)."""

    path: Path | None = Field(None, description="Required. A relative path is resolved against "
                              "the working directory of the command.")

    @model_validator(mode="after")
    def _check_path(self) -> _PathSource:
        if self.path is None:
            raise ValueError(f"data.source.path is required for source '{self.kind}'. "
                             "Received: path=None")
        if not is_pattern(self.path) and not self.path.exists():
            where = "" if self.path.is_absolute() else \
                f" (a relative path is resolved against the working directory, {Path.cwd()})"
            raise ValueError(f"data.source.path does not exist{where}. Received: "
                             f"path='{self.path}'")
        if is_pattern(self.path) and not self.traits.path_may_be_pattern:
            raise ValueError(f"data.source.path for source '{self.kind}' is a file or folder, "
                             f"not a pattern. Received: path='{self.path}'")
        return self


# ------------------------------------------------------------------------------- in memory
class EmbeddedSourceConfig(SourceConfigBase):
    """``embedded``: the real MNIST test set shipped inside the package (10,000 digits), read
    whole into memory; only the split ``test`` exists (``test[:80%]`` selects from it)."""

    kind: Literal["embedded"] = "embedded"


class SyntheticLinearSourceConfig(SourceConfigBase):
    """``synthetic_linear``: ``y = 2 x + 10 + N(0, noise_std^2)``, ``x ~ N(0, 1)``, generated in
    memory from ``data.shuffle_seed`` and the split name."""

    kind: Literal["synthetic_linear"] = "synthetic_linear"
    num_examples: int = Field(1000, gt=0, description="Examples generated per split.")
    noise_std: float = Field(0.33, ge=0, description="Std of the noise N(0, s^2).")


class SyntheticClicksSourceConfig(SourceConfigBase):
    """``synthetic_clicks``: click logs ``(user id, item id) -> clicked`` for the embedding
    models, generated in memory from ``data.shuffle_seed`` and the split name."""

    kind: Literal["synthetic_clicks"] = "synthetic_clicks"
    num_examples: int = Field(1000, gt=0, description="Examples generated per split.")
    num_users: int = Field(4_096, gt=0, description="User ids are < this.")
    num_items: int = Field(1_048_576, gt=0, description="Item ids are < this.")


class IdxSourceConfig(_PathSource):
    """``idx``: a folder of the original MNIST IDX files (``train-images-idx3-ubyte[.gz]``...),
    splits ``train`` and ``test``, read whole into memory."""

    kind: Literal["idx"] = "idx"
    path: Path | None = Field(None, description="Required: the folder of the IDX files.")


class NpzSourceConfig(_PathSource):
    """``npz``: a Keras ``mnist.npz`` file (``x_<split>``, ``y_<split>`` arrays), read whole into
    memory."""

    kind: Literal["npz"] = "npz"
    path: Path | None = Field(None, description="Required: the .npz file.")


# -------------------------------------------------------------------------------- functions
class TfdsSourceConfig(SourceConfigBase):
    """``tfds``: a prepared TensorFlow Datasets dataset. With ``input``/``label`` it streams those
    features; without them it is read whole as ``tfds.load(as_supervised=True)`` pairs."""

    traits: ClassVar[SourceTraits] = SourceTraits(streams=True, function=True)
    kind: Literal["tfds"] = "tfds"
    name: str = Field("mnist", description="TFDS dataset name.")
    data_dir: Path | None = Field(None, description="TFDS data_dir; None = TFDS's default.")
    input: str | None = Field(None, description="The input feature (default 'image').")
    label: str | None = Field(None, description="The label feature (default 'label').")


class PythonSourceConfig(SourceConfigBase):
    """``python``: a function of yours returns each split's ``tf.data.Dataset`` of unbatched
    ``(features, label)`` examples."""

    traits: ClassVar[SourceTraits] = SourceTraits(streams=True, function=True)
    kind: Literal["python"] = "python"
    function: str | None = Field(
        None, description="Required: 'pkg.module:function'; function(split, input_context=None) "
        "returns a tf.data.Dataset of unbatched (features, label). Imported and run: a recipe "
        "naming it is as trusted as that code.")

    @field_validator("function")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is None:
            raise ValueError("data.source.function ('pkg.module:function') is required for "
                             "source 'python'. Received: function=None")
        module, _, attr = value.partition(":")
        if not (module and all(p.isidentifier() for p in module.split("."))
                and attr.isidentifier()):
            raise ValueError("data.source.function must be an import path "
                             f"'package.module:function'. Received: function={value!r}")
        return value


# ------------------------------------------------------------------------------------ files
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


class TFRecordSourceConfig(_PathSource):
    """``tfrecord``: ``tf.train.Example`` files parsed with ``features``, streamed by file (a
    whole split name) or as pieces of files (a TFDS slice such as ``test[:80%]``)."""

    traits: ClassVar[SourceTraits] = SourceTraits(streams=True, path_may_be_pattern=True,
                                                  shard_units="file(s)")
    kind: Literal["tfrecord"] = "tfrecord"
    path: Path | None = Field(
        None, description="Required: a folder of <split>*.tfrecord* files, or a glob with {split}.")
    features: dict[str, FeatureSpec] | None = Field(
        None, description="Feature name -> {dtype: float32|int64|string, shape: [..], "
        "encoding: none|raw|png|jpeg}; `label` names the label, the others are the model's "
        "inputs (one: an array; several: a dict by name). Default: the MNIST layout (image_raw "
        "raw uint8 28x28, label int64).")
    label: str | None = Field(None, description="The label feature (default 'label').")

    @model_validator(mode="after")
    def _spec(self) -> TFRecordSourceConfig:
        if self.features is None:
            return self
        if self.label_name not in self.features:
            raise ValueError(f"data.source.label '{self.label_name}' is not in "
                             f"data.source.features ({', '.join(self.features)}). "
                             f"Received: label={self.label!r}")
        if len(self.features) < 2:
            raise ValueError("data.source.features needs the label and at least one input "
                             f"feature. Received: features={list(self.features)}")
        return self

    @property
    def feature_specs(self) -> dict[str, FeatureSpec]:
        """``features``, default :data:`MNIST_FEATURES`."""
        return dict(self.features) if self.features is not None else dict(MNIST_FEATURES)


class CsvSourceConfig(_PathSource):
    """``csv``: CSV files with a header row, columns matched by name; numeric columns are
    standardized (``data.normalize``) and categorical ones one-hot encoded with the training
    split's statistics, kept in the run directory."""

    traits: ClassVar[SourceTraits] = SourceTraits(streams=True, path_may_be_pattern=True,
                                                  whole_splits_only=True, shard_units="file(s)")
    kind: Literal["csv"] = "csv"
    path: Path | None = Field(
        None, description="Required: a folder of <split>*.csv files, or a glob with {split} "
        "(csv/data/{split}-*.csv).")
    label: str | None = Field(None, description="Required: the label column.")
    numeric: list[str] | None = Field(
        None, description="Numeric (float) columns; default every column that is neither the "
        "label nor categorical.")
    categorical: list[str] = Field(
        default_factory=list, description="String columns turned into ids with a vocabulary of "
        "the training split (computed once, saved in the run directory as "
        "data/csv-schema.json), one-hot encoded after the numeric columns; id 0 = unseen value.")
    label_dtype: Literal["int64", "float32"] = Field(
        "int64", description="Class labels (int64) or regression targets (float32).")

    @model_validator(mode="after")
    def _columns(self) -> CsvSourceConfig:
        if not self.label:
            raise ValueError("data.source.label (the label column) is required for source "
                             "'csv'. Received: label=None")
        overlap = set(self.categorical) & set(self.numeric or [])
        if overlap or self.label in set(self.categorical) | set(self.numeric or []):
            raise ValueError("data.source.numeric, data.source.categorical and data.source.label "
                             f"must not share columns. Received: {sorted(overlap or {self.label})}")
        return self


class ImageFolderSourceConfig(_PathSource):
    """``image_folder``: ``<path>/<split>/<class_name>/**/*.png|jpg``, read as
    ``keras.utils.image_dataset_from_directory`` reads it (hidden entries skipped, class ids in
    sorted folder order)."""

    traits: ClassVar[SourceTraits] = SourceTraits(streams=True, path_may_be_pattern=True,
                                                  whole_splits_only=True,
                                                  shard_units="image file(s)")
    kind: Literal["image_folder"] = "image_folder"
    path: Path | None = Field(
        None, description="Required: the folder holding <split>/<class>/, or a path with {split}.")
    image_size: tuple[int, int] | None = Field(
        None, description="[height, width] every image is resized to (bilinear, as "
        "keras.utils.image_dataset_from_directory); default: the first training image's size "
        "(logged), and images of another size are refused.")
    channels: Literal[1, 3, 4] | None = Field(
        None, description="1 grayscale, 3 RGB, 4 RGBA; default: the first training image's.")

    @field_validator("image_size")
    @classmethod
    def _positive(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and min(value) < 1:
            raise ValueError(f"data.source.image_size must be [height, width] >= 1. Received: "
                             f"image_size={list(value)}")
        return value


def _kind_named(value: Any) -> Any:
    """``source: csv`` -> ``{kind: csv}``; a mapping without ``kind`` is refused naming it."""
    if isinstance(value, str):
        return {"kind": value}
    if isinstance(value, dict) and "kind" not in value:
        raise ValueError(f"data.source.kind is required (one of "
                         f"{', '.join(repr(k) for k in _SOURCE_CONFIGS)}). Received: "
                         f"source={value!r}")
    return value


SourceConfig = Annotated[Union[tuple(_SOURCE_CONFIGS.values())],  # noqa: UP007 - built from a tuple
                         Field(discriminator="kind"), BeforeValidator(_kind_named)]
"""The ``data.source`` field: one of the built-in kinds' config classes, chosen by ``kind``."""


def is_pattern(path: Path | str | None) -> bool:
    """True when ``path`` holds ``{split}`` or glob characters (``*?[``)."""
    return path is not None and ("{split}" in str(path) or bool(_GLOB.search(str(path))))


def is_whole_split(split: str) -> bool:
    """True for a plain split name (``train``), False for a TFDS slice (``train[:80%]``)."""
    return bool(re.fullmatch(r"[\w-]+", split.strip()))

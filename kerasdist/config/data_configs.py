"""The ``data`` section of a recipe: what every source shares (splits, the global batch,
shuffling, prefetching, sharding) and ``data.source``, one of the kinds of
:mod:`kerasdist.config.source_configs`::

    data:
      source: {kind: csv, path: "data/{split}-*.csv", label: price}
      train_split: train
      batch_size: 32

The flat form of 0.2 (``source: csv`` with ``path`` beside it) is lifted for one release
(:func:`lift_flat_source`). Contracts: docs/own-model-and-data.md, "Data sources".
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, model_validator

from kerasdist.config._base import Frozen
from kerasdist.config.source_configs import (
    EmbeddedSourceConfig,
    SourceConfig,
    SourceConfigBase,
    SourceTraits,
    is_whole_split,
    source_config_classes,
)
from kerasdist.errors import RecipeDeprecationWarning

AutoShard = Literal["auto", "off", "data", "file"]
KIND_FIELDS = frozenset(name for cls in source_config_classes().values()
                        for name in cls.model_fields if name != "kind")
"""Every source kind's own fields: those the flat form held in ``data`` beside ``source``."""


class DataConfig(Frozen):
    """``data``: where examples come from (``source``), how they are split, batched and shuffled.

    Splits use TFDS slicing syntax (``test[:80%]``, ``train[10:200]``) for in-memory sources,
    ``tfrecord``, ``tfds`` and ``python``; ``csv`` and ``image_folder`` take a whole split name
    (``train``). ``batch_size`` is the global batch size. Training batches drop the remainder so
    that every step consumes exactly ``batch_size`` examples.
    """

    source: SourceConfig = Field(
        EmbeddedSourceConfig(), description="Where the examples come from: a mapping chosen by "
        "`kind` (its other fields depend on the kind: one table per kind below); a kind whose "
        "fields all have defaults may be given by name alone (source: embedded).")
    train_split: str = "test[:80%]"
    eval_split: str | None = "test[80%:]"
    batch_size: int = Field(128, gt=0, description="Global batch size, examples per step.")
    shuffle_buffer: int = Field(10_000, ge=0, description="0 disables shuffling.")
    shuffle_seed: int = Field(42, description="Seed of the shuffle (and of the synthetic "
                              "sources' examples).")
    normalize: bool = Field(True, description="Scale uint8 images to float32 in [0, 1]; csv: "
                            "standardize numeric columns with the training split's mean and std.")
    prefetch: int = Field(-1, ge=-1, description="Batches to prefetch; -1 = tf.data.AUTOTUNE.")
    auto_shard: AutoShard = Field(
        "auto",
        description="Multi-worker sharding: auto = by file for streaming sources with at least "
        "one file per worker, by data otherwise; off = every worker reads everything (seeded "
        "differently).",
    )

    @model_validator(mode="before")
    @classmethod
    def _lift(cls, value: Any) -> Any:
        return lift_flat_source(value)

    @model_validator(mode="after")
    def _splits(self) -> DataConfig:
        for field in ("train_split", "eval_split"):
            split = getattr(self, field)
            if split is not None and self.traits.whole_splits_only \
                    and not is_whole_split(split):  # tfrecord: pieces of files; python, tfds: as written
                raise ValueError(f"data.{field} of a streaming source ('{self.kind}') is a whole "
                                 f"split name (slices are for tfrecord, tfds, python and in-memory "
                                 f"sources). Received: {field}={split!r}")
        return self

    @property
    def kind(self) -> str:
        """The source kind's name (``data.source.kind``)."""
        return self.source.kind

    @property
    def traits(self) -> SourceTraits:
        """The :class:`SourceTraits` of the source kind."""
        return self.source.traits

    def __getattr__(self, name: str) -> Any:
        # One release: code written for the flat form reads data.path, data.label... from here.
        if name in KIND_FIELDS or name in ("label_name", "feature_specs"):
            source = self.__dict__.get("source")
            if source is not None and hasattr(source, name):
                return getattr(source, name)
            raise AttributeError(f"data.{name} is now data.source.{name}, and source "
                                 f"'{getattr(source, 'kind', None)}' has no field '{name}'")
        return super().__getattr__(name)


def lift_flat_source(value: Any) -> Any:
    """The flat form of ``data`` (``source: <kind>`` with the kind's fields beside it) lifted to
    ``source: {kind: <kind>, <its fields>}``, with one :class:`RecipeDeprecationWarning` naming the
    new form. Fields that mean nothing for the kind were accepted and ignored by the flat form;
    they are dropped (and named in the warning). Fields given beside a ``source`` mapping (e.g.
    by ``--set data.path=...``) are moved into it. Anything else is returned as it is.
    """
    if not isinstance(value, dict):
        return value
    flat = {k: v for k, v in value.items() if k in KIND_FIELDS}
    if not flat:
        return value
    source = value.get("source", "embedded")
    if isinstance(source, SourceConfigBase):
        source = source.model_dump()
    if isinstance(source, dict):
        lifted, kind = {**source, **flat}, source.get("kind")
    else:
        lifted, kind = {"kind": source, **flat}, source
    cls = source_config_classes().get(kind) if isinstance(kind, str) else None
    ignored = sorted(k for k in flat if cls is not None and k not in cls.model_fields)
    for key in ignored:
        del lifted[key]
    shown = ", ".join(f"{k}: {_short(v)}" for k, v in lifted.items())
    note = (f"data: the flat form ({', '.join(f'data.{k}' for k in sorted(flat))} beside "
            f"data.source) is deprecated and will be refused in the next release; write "
            f"data.source: {{{shown}}} (`kerasdist validate` prints the whole new form)")
    if ignored:
        note += (f"; ignored, as the flat form did (not fields of source '{kind}'): "
                 f"{', '.join(ignored)}")
    warnings.warn(note, RecipeDeprecationWarning, stacklevel=2)
    return {**{k: v for k, v in value.items() if k not in flat}, "source": lifted}


def _short(value: Any) -> str:
    text = str(value) if not isinstance(value, str) else (value if value.strip() else repr(value))
    return text if len(text) <= 40 else text[:37] + "..."

"""Source ``tfrecord``: ``tf.train.Example`` files parsed with ``data.source.features`` (default: the
MNIST layout), streamed as files or pieces of files
(:class:`~kerasdist.data.formats.TFRecordSource`)."""

from __future__ import annotations

from pathlib import Path

from kerasdist.data.formats import TFRecordSource
from kerasdist.data.readers import load_tfrecord_split
from kerasdist.data.sources.base import FileKind, slice_split


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

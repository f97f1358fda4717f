"""Registry of the source kinds (``data.source``), one module per kind behind one protocol
(:class:`kerasdist.data.sources.base.SourceKind`), as :mod:`kerasdist.strategies` does for
strategies.

Built-in kinds are registered by module path and imported on first use (listing or validating
never imports a kind, nor TensorFlow). Each kind's fields and traits (streams or not, path may be
a pattern, shard units) are declared on its config class in
:mod:`kerasdist.config.source_configs`, which validation reads. The consumers (launch, training,
the evaluator, the bench) call the entry points of :mod:`kerasdist.data.inputs`, never a kind
directly, and compare no ``data.source`` string.

Adding a source: one config class in :mod:`kerasdist.config.source_configs`, one module here with
one :class:`~kerasdist.data.sources.base.SourceKind` subclass, one line in ``_BUILTIN`` below
(docs/own-model-and-data.md, "Adding a source"). ``get(kind)`` gives a kind's object; an unknown
kind is a ``DataError`` listing the ``available()`` ones.
"""

from __future__ import annotations

from kerasdist._registry import LazyRegistry
from kerasdist.errors import DataError

_BUILTIN: dict[str, str] = {
    "embedded": "kerasdist.data.sources.embedded:EmbeddedKind",
    "idx": "kerasdist.data.sources.idx:IdxKind",
    "npz": "kerasdist.data.sources.npz:NpzKind",
    "synthetic_linear": "kerasdist.data.sources.synthetic:SyntheticLinearKind",
    "synthetic_clicks": "kerasdist.data.sources.synthetic:SyntheticClicksKind",
    "tfrecord": "kerasdist.data.sources.tfrecord:TFRecordKind",
    "csv": "kerasdist.data.sources.csv:CsvKind",
    "image_folder": "kerasdist.data.sources.image_folder:ImageFolderKind",
    "python": "kerasdist.data.sources.python:PythonKind",
    "tfds": "kerasdist.data.sources.tfds:TfdsKind",
}
_KINDS = LazyRegistry(_BUILTIN, unknown=lambda kind: DataError(
    f"data.source: unknown source '{kind}'; available: {', '.join(available())}. "
    f"Received: source='{kind}'"))

available, get = _KINDS.available, _KINDS.get


def of(config):
    """The kind object of a ``DataConfig`` (its ``source.kind``)."""
    return get(config.kind)


def load_split(config, split: str):
    """The whole of ``split`` of the ``DataConfig``'s source as NumPy ``(x, y)`` (TFDS slicing
    syntax for the in-memory sources, ``tfrecord``, ``tfds`` and ``python``).

    Raises:
        DataError: missing files, unknown split name or an out-of-range slice.
    """
    return of(config).load(config, split)

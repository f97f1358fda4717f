"""Registry of the source kinds (``data.source``), one module per kind behind one protocol
(:class:`kerasdist.data.sources.base.SourceKind`), built-in kinds imported on first use (listing
or validating imports no kind, nor TensorFlow). Each kind's fields and traits are on its config
class (:mod:`kerasdist.config.source_configs`); consumers call :mod:`kerasdist.data.inputs`, never
a kind. Adding a source: docs/architecture.md, "Adding a data source kind". ``get(kind)`` gives a
kind's object; an unknown kind is a ``DataError`` listing the ``available()`` ones.
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

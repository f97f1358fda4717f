"""A recipe's data: its sources, read as one resumable, sharded ``tf.data`` stream.

Every consumer reads a recipe's ``data`` through :mod:`kerasdist.data.inputs`, never through a
kind (:mod:`kerasdist.data.sources`; docs/architecture.md, "Adding a data source kind"). The
readers, writers and conversions and :func:`make_dataset_fn` are leaves anyone may call.
"""

from kerasdist.data.pipeline import Datasets, build_datasets, make_dataset_fn
from kerasdist.data.readers import embedded_dir, read_idx, write_tfrecord
from kerasdist.data.sources import load_split

__all__ = ["Datasets", "build_datasets", "embedded_dir", "load_split", "make_dataset_fn",
           "read_idx", "write_tfrecord"]

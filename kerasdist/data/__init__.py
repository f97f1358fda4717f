"""Data sources (one module per kind in :mod:`kerasdist.data.sources`) and tf.data pipelines;
every consumer reads a recipe's data through :mod:`kerasdist.data.inputs`."""

from kerasdist.data.pipeline import Datasets, build_datasets, make_dataset_fn
from kerasdist.data.readers import embedded_dir, read_idx, write_tfrecord
from kerasdist.data.sources import load_split

__all__ = ["Datasets", "build_datasets", "embedded_dir", "load_split", "make_dataset_fn",
           "read_idx", "write_tfrecord"]

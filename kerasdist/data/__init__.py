"""Data sources (embedded MNIST sample, TFDS, IDX, npz, TFRecord, synthetic) and tf.data pipelines."""

from kerasdist.data.pipeline import Datasets, build_datasets, make_dataset_fn
from kerasdist.data.sources import embedded_dir, load_split, read_idx, write_tfrecord

__all__ = ["Datasets", "build_datasets", "embedded_dir", "load_split", "make_dataset_fn",
           "read_idx", "write_tfrecord"]

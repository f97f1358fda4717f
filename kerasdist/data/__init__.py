"""A recipe's data: its sources, read as one resumable, sharded ``tf.data`` stream.

Who owns what. ``data/`` owns reading a recipe's ``data`` section. Every consumer (launch,
training, the strategies, the checks, the evaluator, the bench) reads it through
:mod:`kerasdist.data.inputs`, never through a kind. Each kind lives whole in its module of
:mod:`kerasdist.data.sources` behind the protocol of :mod:`kerasdist.data.sources.base` (a new
source: one module there, one registry line, one config class in
:mod:`kerasdist.config.source_configs`); the stream is :mod:`kerasdist.data.stream`. The readers,
writers and conversions (:mod:`.readers`, :mod:`.writers`, :mod:`.convert`) and
:func:`make_dataset_fn` are leaves anyone may call.
"""

from kerasdist.data.pipeline import Datasets, build_datasets, make_dataset_fn
from kerasdist.data.readers import embedded_dir, read_idx, write_tfrecord
from kerasdist.data.sources import load_split

__all__ = ["Datasets", "build_datasets", "embedded_dir", "load_split", "make_dataset_fn",
           "read_idx", "write_tfrecord"]

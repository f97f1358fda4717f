"""A recipe's data: its sources, read as one resumable, sharded ``tf.data`` stream.

Who owns what. ``data/`` owns reading a recipe's ``data`` section: the source kinds, the one
stream they ride, and the samples the checks, the evaluator and the bench read. The entry point
is :mod:`kerasdist.data.inputs`: every consumer (launch, training, the strategies, the checks,
the evaluator, the bench) reads a recipe's data through it, never through a kind. Each kind lives
whole in its own module of :mod:`kerasdist.data.sources` (``csv.py``, ``tfrecord.py``, ...),
behind the protocol of :mod:`kerasdist.data.sources.base`, one family (``memory.py``,
``files.py``, ``functions.py``) and one registry; the stream is :mod:`kerasdist.data.stream`. A
new source goes into ``data/sources/<kind>.py`` (one family subclass), plus one registry line in
:mod:`kerasdist.data.sources` and one config class in :mod:`kerasdist.config.source_configs`.
The other modules are leaves anyone may call: the readers (:mod:`kerasdist.data.readers`) and
writers (:mod:`kerasdist.data.writers`) of file layouts, the conversions every input applies
(:mod:`kerasdist.data.convert`) and :func:`make_dataset_fn` for your own code.
"""

from kerasdist.data.pipeline import Datasets, build_datasets, make_dataset_fn
from kerasdist.data.readers import embedded_dir, read_idx, write_tfrecord
from kerasdist.data.sources import load_split

__all__ = ["Datasets", "build_datasets", "embedded_dir", "load_split", "make_dataset_fn",
           "read_idx", "write_tfrecord"]

"""The protocol every source kind implements (:class:`SourceKind`) and its three families, each in
its own module: :class:`~kerasdist.data.sources.memory.MemoryKind` (a split read whole into NumPy
arrays), :class:`~kerasdist.data.sources.files.FileKind` (units are files) and
:class:`~kerasdist.data.sources.functions.FunctionKind` (a function returns a split's
``tf.data.Dataset``). All three describe a split as :class:`~kerasdist.data.stream.Units` and ride
the one stream of :mod:`kerasdist.data.stream`; only :mod:`kerasdist.data.inputs` calls them. A
kind reads its own fields as ``config.source.<field>``, the common ones as ``config.<field>``.
"""

from __future__ import annotations

import re
import types

import numpy as np

from kerasdist.data.stream import Streaming
from kerasdist.errors import DataError

Split = tuple[np.ndarray, np.ndarray]


class SourceKind:
    """One ``data.source`` kind (see module docs)."""

    kind: str = ""

    def stream(self, recipe, pipelines: int) -> Streaming:
        """The training stream (``train_fn(ctx, skip_batches)``), the evaluation input, the
        examples per pipeline and the shard policy, for ``pipelines`` input pipelines.

        Raises:
            DataError, RecipeError: unreadable data, or a sharding that cannot be done.
        """
        raise NotImplementedError

    def shard_policy(self, config, pipelines: int) -> str:
        """``data.auto_shard`` resolved for this kind (:func:`kerasdist.data.convert.shard_policy`)."""
        raise NotImplementedError

    def eval_dataset(self, config, split: str, *, run_dir):
        """``split`` as one dataset of global batches, decoded and converted as training sees
        them (the sidecar evaluator's input; a csv source uses the vocabularies in ``run_dir``)."""
        raise NotImplementedError

    def sample(self, config, split: str, limit: int | None, *, run_dir=None) -> Split:
        """The first ``limit`` examples (None: all) of ``split`` as converted NumPy arrays."""
        raise NotImplementedError

    def check_sample(self, config, split: str, limit: int | None) -> Split:
        """What the bad-input checks read of ``split`` (:mod:`kerasdist.training.checks`)."""
        return self.sample(config, split, limit)

    def load(self, config, split: str) -> Split:
        """The whole of ``split`` as NumPy arrays (reference evaluations, the bench)."""
        return self.sample(config, split, None)

    def input_failure(self, config, err: BaseException, split: str):
        """The ``DataError`` to report for ``err``, raised while training read ``split``, when it
        is the source's own failure; None (the default) reports ``err`` as it is."""
        return None

    def serving_model(self, config, model, run_dir):
        """``model`` with the source's preprocessing in front, which predicts on the source's
        raw examples (saved as ``inference_model.keras``), or None when the model's own input
        is the raw example (every source but ``csv``)."""
        return None


def slice_split(split: str, whole) -> Split:
    """``split`` (TFDS slicing: ``test[:80%]``, ``train[10:200]+test[-5:]``) of in-memory splits
    ``whole(name) -> (x, y)``, resolved with ``tfds.core.ReadInstruction``.

    Raises:
        DataError: a bad split string, an out-of-range slice, or one that selects nothing.
    """
    plain = re.fullmatch(r"\s*([\w-]+)\s*", split)
    if plain:  # a whole split: no TFDS (it imports TensorFlow: seconds before a cluster starts)
        x, y = whole(plain.group(1))
        if len(x) == 0:
            raise DataError(f"split {split!r} selects no examples")
        return x, y
    import tensorflow_datasets as tfds

    try:
        instruction = tfds.core.ReadInstruction.from_spec(split)
    except (ValueError, AssertionError) as err:
        raise DataError(f"bad split string {split!r}: {err}") from None
    cache = {name: whole(name)
             for name in {re.match(r"\s*([\w-]+)", part).group(1) for part in split.split("+")}}
    infos = {name: types.SimpleNamespace(num_examples=len(arr[0]), shard_lengths=[len(arr[0])])
             for name, arr in cache.items()}
    try:
        absolute = instruction.to_absolute(infos)
    except (ValueError, AssertionError) as err:
        raise DataError(f"split {split!r}: {err}") from None
    parts = [(cache[p.splitname][0][p.from_:p.to], cache[p.splitname][1][p.from_:p.to])
             for p in absolute]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    if len(x) == 0:
        raise DataError(f"split {split!r} selects no examples")
    return x, y

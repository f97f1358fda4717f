"""The one entry point to a recipe's data, whatever its source: launch, training, the checks, the
sidecar evaluator and the bench call these and nothing else (no ``data.source`` comparison, no
branch on how a source is read; each kind's code is in :mod:`kerasdist.data.sources`).

* :func:`train_input`: the sharded training stream, resumable at an exact step, and the
  evaluation input (:func:`kerasdist.data.streams.build_data`);
* :func:`eval_dataset`: a split as one dataset of global batches (the sidecar evaluator);
* :func:`sample`, :func:`check_sample`: decoded examples as NumPy arrays (the bad-input checks);
* :func:`load_split`: a whole split as NumPy arrays (the bench, reference evaluations);
* :func:`examples_per_worker`: the launch preflight's count of a split (reads no split whole);
* :func:`input_failure`: an error met while training read the input, as the source's
  :class:`~kerasdist.errors.DataError` (a user's data function that raised mid-training);
* :func:`serving_model`: the trained model behind the source's preprocessing (csv), which
  predicts raw rows: ``inference_model.keras``.
"""

from __future__ import annotations

from kerasdist.data import sources
from kerasdist.data.streams import StreamInput, build_data, resolve_shard_policy

__all__ = ["StreamInput", "build_streaming", "check_sample", "eval_dataset", "examples_per_worker",
           "input_failure", "load_split", "resolve_shard_policy", "sample", "serving_model",
           "train_input"]


def train_input(recipe, *, replicas: int, pipelines: int = 1,
                asynchronous: bool = False) -> StreamInput:
    """The recipe's training stream and evaluation input (see :func:`kerasdist.data.streams.build_data`)."""
    return build_data(recipe, replicas=replicas, pipelines=pipelines, asynchronous=asynchronous)


def build_streaming(recipe, *, pipelines: int):
    """The source kind's :class:`~kerasdist.data.stream.Streaming` for ``pipelines`` input
    pipelines: ``train_fn(ctx, skip_batches)``, ``eval_fn(ctx)``, examples per pipeline, the shard
    policy and the files the chief writes (csv vocabularies).

    Raises:
        DataError, RecipeError: as :func:`train_input`.
    """
    return sources.of(recipe.data).stream(recipe, pipelines)


def eval_dataset(config, split: str, *, run_dir):
    """``split`` as one dataset of global batches (``data.batch_size``, the last partial one
    kept), decoded and converted as training sees them; a csv source reads the vocabularies the
    run saved in ``run_dir``. Streaming sources are read as it is iterated."""
    return sources.of(config).eval_dataset(config, split, run_dir=run_dir)


def sample(config, split: str, limit: int | None, *, run_dir=None):
    """The first ``limit`` examples (None: all) of ``split`` as converted NumPy ``(x, y)``."""
    return sources.of(config).sample(config, split, limit, run_dir=run_dir)


def check_sample(config, split: str, limit: int | None):
    """What :func:`kerasdist.training.checks.check_inputs` reads of ``split``: the whole split
    of an in-memory source, the first ``limit`` examples of a stream (the default TFRecord layout
    as raw uint8 arrays, as the in-memory MNIST sources give them)."""
    return sources.of(config).check_sample(config, split, limit)


def load_split(config, split: str):
    """The whole of ``split`` as NumPy ``(x, y)`` (:func:`kerasdist.data.sources.load_split`)."""
    return sources.load_split(config, split)


def examples_per_worker(recipe) -> int:
    """The training split's examples as one pipeline sees them, after every check of the
    source (files, spec, columns, the data function, the evaluation split); a function's
    endless split under ``trainer.steps_per_epoch`` is read only to its first batches."""
    return build_streaming(recipe, pipelines=1).per_pipeline


def serving_model(config, model, run_dir):
    """The trained ``model`` with the source's preprocessing as Keras layers in front (a csv
    source: normalization and one-hot lookups from the run's ``data/csv-schema.json``), which
    predicts on raw examples; None when ``model`` already takes them (every other source)."""
    return sources.of(config).serving_model(config, model, run_dir)


def input_failure(config, err: BaseException, split: str):
    """A :class:`~kerasdist.errors.DataError` naming the source when ``err`` (an error that ended
    training or evaluation) came from reading ``split`` of the source, e.g. an exception raised by
    the user's ``data.source.function`` generator mid-training; None otherwise (the error is
    reported as it is)."""
    return sources.of(config).input_failure(config, err, split)

"""The one entry point to a recipe's data, whatever its source: launch, training, the strategies,
the checks, the sidecar evaluator and the bench call these and nothing else (no ``data.source``
comparison, no branch on how a source is read; each kind's code is in
:mod:`kerasdist.data.sources`).

* :func:`build_data`: the sharded training stream, resumable at an exact step, and the
  evaluation input, for every Keras-fit strategy (:class:`StreamInput`);
* :func:`eval_dataset`: a split as one dataset of global batches (the sidecar evaluator);
* :func:`sample`, :func:`check_sample`: decoded examples as NumPy arrays (the bad-input checks);
* :func:`load_split`: a whole split as NumPy arrays (the bench, reference evaluations);
* :func:`examples_per_worker`: the launch preflight's count of a split (reads no split whole);
* :func:`input_failure`: an error met while training read the input, as the source's
  :class:`~kerasdist.errors.DataError` (a user's data function that raised mid-training);
* :func:`serving_model`: the trained model behind the source's preprocessing (csv), which
  predicts raw rows: ``inference_model.keras``.

Batch sizes. ``data.batch_size`` is the **global** batch: examples consumed by one optimizer step,
summed over every replica of every worker. Each replica gets ``batch_size / num_replicas_in_sync``
examples per step (``InputContext.get_per_replica_batch_size``); on CPU workers (one replica each)
a worker's pipeline therefore yields batches of ``batch_size / workers`` examples.

Sharding (``data.auto_shard``), applied by kerasdist's ``dataset_fn`` per input pipeline, since
``distribute_datasets_from_function`` leaves sharding to the function (TF's own auto-sharding applies
only to ``experimental_distribute_dataset``; see
https://www.tensorflow.org/tutorials/distribute/input#sharding):

* ``data``: pipeline ``i`` of ``N`` keeps examples ``i, i+N, ...`` (``Dataset.shard``) before
  shuffling; every example is seen once per pass over the split.
* ``file``: pipeline ``i`` reads files ``i, i+N, ...`` of a streaming split (``csv``,
  ``image_folder``, ``tfrecord`` with a plain split name); needs at least N files.
* ``off``: every pipeline reads every example, shuffled with its own seed (``shuffle_seed + i``).
* ``auto`` (default): ``file`` for a streaming source that can be sharded by file, else ``data``.

Parameter server (``build_data(..., asynchronous=True)``): the same streams, one per worker; a
step is one worker's batch of ``batch_size`` examples, scheduled on whichever worker is free, so
which worker ran which step is not recorded. A run resumed at global step ``s`` starts every
worker's stream at batch ``ceil(s / workers)`` (its fair share): the global step is exact, the
batches seen around the restart are the fair-share ones.

Resuming at an exact step. Every source rides the one stream of :mod:`kerasdist.data.stream`,
whose order is a pure function of the recipe (stateless per-pass seeds, never iterator state, so
every run sees the same batches in the same order); training restarted at global step ``s``
starts it at batch ``s * local_replicas``, exactly where the interrupted run stopped. An "epoch"
is ``steps_per_epoch`` steps of that stream, not a pass aligned to the split's end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from kerasdist._log import get_logger
from kerasdist.data import sources
from kerasdist.data.convert import check_batch_divisible
from kerasdist.data.sources import load_split
from kerasdist.errors import DataError

if TYPE_CHECKING:
    from kerasdist.config import Recipe

__all__ = ["StreamInput", "build_data", "build_streaming", "check_sample", "eval_dataset",
           "examples_per_worker", "input_failure", "load_split", "resolve_shard_policy", "sample",
           "serving_model"]

log = get_logger("data")


def resolve_shard_policy(data_config, num_workers: int) -> str:
    """The effective sharding for ``data.auto_shard``: ``'data'``, ``'file'`` or ``'off'`` (the
    source kind's, :func:`kerasdist.data.convert.shard_policy`).

    Raises:
        RecipeError: ``auto_shard: file`` with a source or split that cannot be sharded by file.
    """
    return sources.of(data_config).shard_policy(data_config, num_workers)


@dataclass(frozen=True)
class StreamInput:
    """The training stream and evaluation input of a recipe (every Keras-fit strategy).

    Attributes:
        train_fn: ``train_fn(input_context, skip_batches) -> tf.data.Dataset`` of per-replica batches.
        eval_fn: ``eval_fn(input_context)``, per-replica batches, last partial batch kept; or None.
        steps_per_epoch: optimizer steps per epoch (the recipe's, or one pass of the smallest shard).
        shard_policy: ``'data'``, ``'file'`` or ``'off'`` (see module docs).
        num_eval: examples in the evaluation split (0 without one).
    """

    train_fn: Callable
    eval_fn: Callable | None
    steps_per_epoch: int
    shard_policy: str
    num_eval: int
    pipelines: int = 1
    artifacts: dict[str, str] = field(default_factory=dict)
    """Files the chief writes into the run directory once it is claimed (relative path ->
    text), e.g. a csv source's vocabularies (``data/csv-schema.json``)."""

    def write_artifacts(self, run_dir) -> None:
        """Write :attr:`artifacts` under ``run_dir`` atomically (temporary file + ``os.replace``);
        one already there is kept (a resumed run reads it instead of computing it)."""
        import os
        from pathlib import Path

        for name, text in self.artifacts.items():
            path = Path(run_dir) / name
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(path.name + ".tmp")
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, path)

    def train_dataset(self, strategy, *, start_step: int):
        """Distributed training stream starting at global step ``start_step`` (>= 0).

        Each pipeline yields per-replica batches; its ``local`` replicas take consecutive ones, so
        global step ``s`` starts at batch ``s * local`` of every pipeline."""
        local = strategy.num_replicas_in_sync // self.pipelines
        return strategy.distribute_datasets_from_function(
            lambda ctx: self.train_fn(ctx, start_step * local))

    def eval_dataset(self, strategy):
        """Distributed evaluation input, or None when the recipe has no ``eval_split``.

        With one input pipeline and several replicas (``mirrored``), the globally batched split
        goes through ``experimental_distribute_dataset``, which splits every global batch over the
        replicas, the last partial one too (per-replica batches handed out in turn would leave a
        replica an empty, shapeless batch at an odd count: a crash in the first conv layer).
        """
        import tensorflow as tf

        if self.eval_fn is None:
            return None
        if self.pipelines == 1 and strategy.num_replicas_in_sync > 1:
            whole = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                               num_replicas_in_sync=1)
            return strategy.experimental_distribute_dataset(self.eval_fn(whole))
        return strategy.distribute_datasets_from_function(self.eval_fn)


def _steps_per_epoch(recipe, *, examples_per_pipeline: int, pipeline_batch: int) -> int:
    """``trainer.steps_per_epoch``, else one pass over a pipeline's examples.

    Raises:
        DataError: a pipeline holds fewer examples than one of its batches, with or without
            ``trainer.steps_per_epoch`` (a batch would repeat examples; a huge ``batch_size`` would
            otherwise fail inside the first step, after the run directory was written).
    """
    steps = examples_per_pipeline // pipeline_batch
    if steps < 1:
        raise DataError(f"data.train_split '{recipe.data.train_split}' gives each worker "
                        f"{examples_per_pipeline} examples, fewer than one per-worker batch of "
                        f"{pipeline_batch}. Received: batch_size={recipe.data.batch_size}")
    return recipe.trainer.steps_per_epoch or steps


def _batch_words(batch_size: int, replicas: int, pipelines: int, asynchronous: bool) -> str:
    """How the input line names the batch, counting as the run summary does: replicas in sync
    for synchronous strategies, workers for the parameter server (each step is one worker's
    whole batch)."""
    if asynchronous:
        return (f"global batch {batch_size} per step, each step one worker's (asynchronous); "
                f"{pipelines} worker(s), one input pipeline each")
    return (f"global batch {batch_size} = {replicas} replica(s) x {batch_size // replicas}; "
            f"{pipelines} input pipeline(s)")


def build_data(recipe: Recipe, *, replicas: int, pipelines: int = 1,
               asynchronous: bool = False) -> StreamInput:
    """Load the recipe's splits and build the sharded, resumable inputs.

    Args:
        recipe: the validated recipe (``data`` and ``trainer.steps_per_epoch`` are read).
        replicas: replicas in sync (the global batch must divide by it).
        pipelines: input pipelines, one per worker process (1 for one-process strategies).
        asynchronous: parameter server: every step is one worker's whole batch of
            ``data.batch_size`` examples (``replicas`` 1), so a pipeline's batch is the global
            batch, and one pass (the default ``steps_per_epoch``) is the pipelines' passes
            summed: ``pipelines * (examples per pipeline // batch_size)`` steps.

    Must run after a multi-worker strategy exists (tfrecord sources run TF ops).

    Raises:
        DataError, RecipeError: unreadable source, bad split, or a shard smaller than one batch.
    """
    config = recipe.data
    check_batch_divisible(config.batch_size, replicas)
    pipeline_batch = config.batch_size if asynchronous else config.batch_size // pipelines
    built = sources.of(config).stream(recipe, pipelines)
    steps = _steps_per_epoch(recipe, examples_per_pipeline=built.per_pipeline,
                             pipeline_batch=pipeline_batch)
    if asynchronous and not recipe.trainer.steps_per_epoch:
        steps *= pipelines  # scheduled steps per epoch are summed over the workers
    log.info(f"input: {_batch_words(config.batch_size, replicas, pipelines, asynchronous)}; "
             f"sharding '{built.policy}' (data.auto_shard='{config.auto_shard}'); {steps} steps "
             "per epoch")
    return StreamInput(train_fn=built.train_fn, eval_fn=built.eval_fn, steps_per_epoch=steps,
                       shard_policy=built.policy, num_eval=built.num_eval, pipelines=pipelines,
                       artifacts=built.artifacts)


def build_streaming(recipe, *, pipelines: int):
    """The source kind's :class:`~kerasdist.data.stream.Streaming` for ``pipelines`` input
    pipelines: ``train_fn(ctx, skip_batches)``, ``eval_fn(ctx)``, examples per pipeline, the shard
    policy and the files the chief writes (csv vocabularies).

    Raises:
        DataError, RecipeError: as :func:`build_data`.
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

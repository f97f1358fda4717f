"""The one entry point to a recipe's data, whatever its source: launch, training, the strategies,
the checks, the sidecar evaluator and the bench call these and nothing else (each kind's code is
in :mod:`kerasdist.data.sources`; the stream they ride is :mod:`kerasdist.data.stream`).

``data.batch_size`` is the **global** batch (one optimizer step, summed over every replica of every
worker); sharding is applied per input pipeline by kerasdist's ``dataset_fn``; a run resumed at
global step ``s`` starts each pipeline at batch ``s * local_replicas``. The contracts in full:
docs/own-model-and-data.md, "What every streaming source guarantees".
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
        """Write :attr:`artifacts` under ``run_dir`` atomically; one already there is kept (a
        resumed run reads it instead of computing it)."""
        from pathlib import Path

        from kerasdist._files import write_text_atomic

        for name, text in self.artifacts.items():
            path = Path(run_dir) / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(path, text)

    def train_dataset(self, strategy, *, start_step: int):
        """Distributed training stream starting at global step ``start_step`` (>= 0).

        Each pipeline yields per-replica batches; its ``local`` replicas take consecutive ones, so
        global step ``s`` starts at batch ``s * local`` of every pipeline."""
        local = strategy.num_replicas_in_sync // self.pipelines
        return strategy.distribute_datasets_from_function(
            lambda ctx: self.train_fn(ctx, start_step * local))

    def eval_dataset(self, strategy):
        """Distributed evaluation input, or None when the recipe has no ``eval_split``. With one
        pipeline and several replicas (``mirrored``) the global batches are split over the replicas
        by ``experimental_distribute_dataset``, the last partial one too (handed out per replica,
        an odd count would leave one an empty, shapeless batch)."""
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
            ``trainer.steps_per_epoch``.
    """
    steps = examples_per_pipeline // pipeline_batch
    if steps < 1:
        raise DataError(f"data.train_split '{recipe.data.train_split}' gives each worker "
                        f"{examples_per_pipeline} examples, fewer than one per-worker batch of "
                        f"{pipeline_batch}. Received: batch_size={recipe.data.batch_size}")
    return recipe.trainer.steps_per_epoch or steps


def _batch_words(batch_size: int, replicas: int, pipelines: int, asynchronous: bool) -> str:
    """How the input line names the batch, counting as the run summary does."""
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
            ``data.batch_size`` examples, and one pass is the pipelines' passes summed.

    Must run after a multi-worker strategy exists (tfrecord sources run TF ops).

    Raises:
        DataError, RecipeError: unreadable source, bad split, or a shard smaller than one batch.
    """
    config = recipe.data
    check_batch_divisible(config.batch_size, replicas)
    pipeline_batch = config.batch_size if asynchronous else config.batch_size // pipelines
    built = build_streaming(recipe, pipelines=pipelines)
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
    pipelines.

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
    training or evaluation) came from reading ``split`` of the source; None otherwise."""
    return sources.of(config).input_failure(config, err, split)

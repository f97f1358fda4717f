"""The strategy object: what one kind of ``tf.distribute`` training contributes to a run.

The run lifecycle (:mod:`kerasdist.training.session`) is the same for every kind; a strategy
object supplies only what differs (:meth:`Strategy.build`, :meth:`Strategy.make_input`,
:meth:`Strategy.make_loop`, the hooks and its ``traits``). A new kind is a subclass registered
with :func:`kerasdist.strategies.register` (docs/architecture.md, "Adding a strategy kind").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from kerasdist.config.schema import StrategyConfigBase, StrategyTraits
from kerasdist.data.pipeline import check_batch_divisible
from kerasdist.keras.accumulation import check_divisible

if TYPE_CHECKING:
    from kerasdist.config import Recipe


class Strategy:
    """Base class of a strategy kind (see module docs). Subclasses set ``kind`` and
    ``config_class`` and implement :meth:`build`; every other method has a default."""

    kind: ClassVar[str]
    config_class: ClassVar[type[StrategyConfigBase]]

    @property
    def traits(self) -> StrategyTraits:
        """The kind's declared needs and capabilities (from its config class)."""
        return self.config_class.traits

    def build(self, config, *, cluster_resolver=None):
        """Return the ``tf.distribute.Strategy`` for this process (see each kind)."""
        raise NotImplementedError

    def replicas_before_start(self, recipe: Recipe) -> int | None:
        """Replicas in sync known without starting TensorFlow (for :meth:`preflight`), or None."""
        return None

    def preflight(self, recipe: Recipe) -> None:
        """Checks that need no TensorFlow and no process: raise before anything starts.

        Raises:
            RecipeError: the global batch does not divide over the replicas known in advance.
        """
        replicas = self.replicas_before_start(recipe)
        if replicas:
            check_batch_divisible(recipe.data.batch_size, replicas)
            check_divisible(recipe.data.batch_size, replicas, recipe.trainer.gradient_accumulation_steps)

    def num_input_pipelines(self, tf_strategy) -> int:
        """Input pipelines (one per worker process) the data is sharded over."""
        return 1

    def make_input(self, recipe: Recipe, tf_strategy):
        """The distributed input: by default kerasdist's resumable streams
        (:func:`kerasdist.data.inputs.build_data`), sharded over :meth:`num_input_pipelines`."""
        from kerasdist.data.inputs import build_data

        return build_data(recipe, replicas=tf_strategy.num_replicas_in_sync,
                          pipelines=self.num_input_pipelines(tf_strategy))

    def compile_kwargs(self, config) -> dict:
        """Extra ``model.compile`` arguments (e.g. ``steps_per_execution``)."""
        return {}

    def prepare_model(self, model, config) -> None:
        """Adjust the compiled model once its optimizer is built (e.g. gradient compression)."""

    def after_restore(self, tf_strategy, step: int, *, task: str | None, run_dir) -> None:
        """Called on every task after the checkpoint is restored (e.g. agree on the step)."""

    def gather_figures(self, tf_strategy):
        """A collective ``fn({task: (steps, seconds)})`` returning every task's epoch figures
        (:class:`~kerasdist.keras.callbacks.ThroughputMeter`), or None: this task's only."""
        return None

    def make_loop(self):
        """The training loop object (:class:`kerasdist.strategies.loops.KerasFitLoop` by default)."""
        from kerasdist.strategies.loops import KerasFitLoop

        return KerasFitLoop()

    def explain_failure(self, err: Exception, *, config, tf_config, start_step: int) -> Exception:
        """The exception to raise for a TensorFlow error during training (default: unchanged)."""
        return err

    def num_replicas(self, tf_strategy) -> int:
        """Replicas reported in the summary and ``metrics.json`` (default: in sync)."""
        return tf_strategy.num_replicas_in_sync

    def describe(self, tf_strategy) -> str:
        """One line on where training runs, for the log."""
        return f"{tf_strategy.num_replicas_in_sync} replica(s)"

"""Chief-aware, step-exact checkpoints and preemption handling, for every strategy's training loop.

One checkpoint schema serves every strategy (``CHECKPOINT_SCHEMA`` in
:mod:`kerasdist.config.schema`): model + optimizer (``optimizer.iterations`` is the global step) +
``steps_per_epoch``; the epoch is ``step // steps_per_epoch``. Only the chief writes the shared
folder (other workers write a per-task temporary one, as TF requires under
``MultiWorkerMirroredStrategy``), a half-finished epoch resumes at its step, nothing is written in
place. Source: https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras#model_saving_and_loading
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import keras
import numpy as np

from kerasdist._compat.keras_async_checkpoint import cpu_copies
from kerasdist._compat.tf_frozen_task import eager_save
from kerasdist._log import get_logger
from kerasdist._scratch import temp_dir
from kerasdist.errors import Preempted, RunDirError
from kerasdist.keras import state_digest
from kerasdist.keras.preemption import PREEMPTION_CHECK_STEPS, PreemptionWatch

log = get_logger("backup")

class BackupStore:
    """Checkpoints of model + optimizer + ``steps_per_epoch`` in ``directory``, chief-aware.

    Args:
        model: a compiled Keras model whose optimizer is built.
        directory: the shared checkpoint folder (``<run_dir>/checkpoints``); every worker restores
            from it, so on real machines it must be on a filesystem all workers see.
        is_chief: write to ``directory`` (True) or to a temporary per-task folder (False).
        task_name: ``worker:1`` etc., used in the temporary folder name and in errors.
        max_to_keep: checkpoints kept by the chief's ``CheckpointManager``.
        steps_per_epoch: stored, and checked on restore.
        asynchronous: the chief writes in a background thread (``enable_async``): :meth:`save`
            returns once the values are copied; :meth:`close` waits for the last write.
    """

    def __init__(self, *, model, directory: Path, is_chief: bool, task_name: str,
                 max_to_keep: int, steps_per_epoch: int, asynchronous: bool = False):
        import tensorflow as tf

        self.directory, self.is_chief, self.task_name = Path(directory), is_chief, task_name
        self.model = model
        self._spe = tf.Variable(steps_per_epoch, dtype=tf.int64, trainable=False,
                                name="steps_per_epoch")
        self.steps_per_epoch = steps_per_epoch
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                              steps_per_epoch=self._spe)
        self._manager = None
        self.restored_digest: str | None = None
        self.restore_verified = False
        self._max_to_keep = max_to_keep
        self._tmp: Path | None = None
        self._options = tf.train.CheckpointOptions(enable_async=True) if asynchronous else None
        self._written: str | None = None  # the chief's last save (asynchronous: maybe pending)
        if is_chief:
            self._manager = self._new_manager()
        else:
            self._tmp = temp_dir(self.directory, task_name)
            shutil.rmtree(self._tmp, ignore_errors=True)  # a killed attempt's leftovers
            self._tmp.mkdir(parents=True)

    def _new_manager(self):
        """The chief's ``CheckpointManager``; a pointer file it cannot parse is kept as
        ``checkpoint.unreadable-<time>`` (:meth:`restore` finds checkpoints by file name)."""
        import tensorflow as tf

        try:
            return tf.train.CheckpointManager(self.checkpoint, str(self.directory),
                                              max_to_keep=self._max_to_keep)
        except (UnicodeDecodeError, ValueError) as err:
            pointer = self.directory / "checkpoint"
            kept = pointer.with_name(f"checkpoint.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
            pointer.rename(kept)
            log.warning(f"checkpoint pointer {pointer} unreadable ({type(err).__name__}); "
                        f"kept as {kept.name}")
            return tf.train.CheckpointManager(self.checkpoint, str(self.directory),
                                              max_to_keep=self._max_to_keep)

    def remove_stale_temp(self) -> None:
        """Chief only: delete ``*_temp*`` folders a crash mid-save left behind (never the data)."""
        if self.is_chief and self.directory.is_dir():
            for path in self.directory.glob("*_temp*"):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()

    def _candidates(self) -> list[str]:
        """Checkpoint prefixes in ``directory``, newest first: those the ``checkpoint`` pointer
        lists and every ``ckpt-N.index`` on disk (a missing or garbled pointer loses nothing)."""
        import tensorflow as tf

        found: dict[int, str] = {}
        try:
            state = tf.train.get_checkpoint_state(str(self.directory))
        except Exception as err:  # noqa: BLE001 - a garbled pointer raises a protobuf ParseError
            log.warning(f"checkpoint pointer {self.directory / 'checkpoint'} unreadable "
                        f"({type(err).__name__}); looking for checkpoint files instead")
            state = None
        listed = list(state.all_model_checkpoint_paths) if state is not None else []
        for path in listed + [str(p.with_suffix("")) for p in self.directory.glob("ckpt-*.index")]:
            number = Path(path).name.rpartition("-")[2]
            if number.isdigit():
                found[int(number)] = str(self.directory / Path(path).name)
        return [found[n] for n in sorted(found, reverse=True)]

    @staticmethod
    def _unreadable(prefix: str) -> str | None:
        """Why the checkpoint at ``prefix`` does not read back whole (every tensor is read, which
        checks its crc32c), or None when it does."""
        import tensorflow as tf

        try:
            reader = tf.train.load_checkpoint(prefix)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
        except Exception as err:  # noqa: BLE001 - TF raises several types for damaged files
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return f"{type(err).__name__}: {first[:200]}"
        return None

    def restore(self) -> int:
        """Restore the newest checkpoint in ``directory`` that reads back whole (damaged ones are
        skipped with a warning naming each and why); return its global step (0 if none at all).

        Raises:
            TrainingError: checkpoints exist but none reads back whole (exit code 1; never train
                from zero over them: move them away or pass --overwrite).
            RunDirError: the checkpoint was written with another ``steps_per_epoch``.
        """
        from kerasdist.errors import TrainingError

        candidates = self._candidates()
        skipped = []
        for prefix in candidates:
            reason = self._unreadable(prefix)
            if reason is None:
                break
            skipped.append(f"{Path(prefix).name} ({reason})")
            log.warning(f"checkpoint {prefix} does not read back whole, skipped: {reason}")
        else:
            leftovers = sorted(p.name for p in self.directory.glob("ckpt-*")) if \
                self.directory.is_dir() else []
            if skipped or leftovers:
                raise TrainingError(
                    f"no checkpoint in {self.directory} reads back whole "
                    f"({'; '.join(skipped) or 'no index file for ' + ', '.join(leftovers[:6])}); "
                    "not training from zero over them. Move them away or pass --overwrite.")
            return 0
        self.checkpoint.restore(prefix).assert_existing_objects_matched()
        if int(self._spe.numpy()) != self.steps_per_epoch:
            raise RunDirError(
                f"trainer.steps_per_epoch (or the data/batch it derives from) changed since the "
                f"checkpoint {prefix} was written ({int(self._spe.numpy())} steps per epoch). "
                f"Received: {self.steps_per_epoch}; restore the recipe or pass --overwrite.")
        self._spe.assign(self.steps_per_epoch)
        step = int(self.model.optimizer.iterations.numpy())
        self._verify(prefix)
        check_finite_state(self.model, f"checkpoint {prefix}", keeps=(
            "it cannot be resumed (written by an older kerasdist?); move it out of "
            f"{self.directory}, or pass --overwrite"), restoring=True)
        if self._manager is not None and self._manager.latest_checkpoint != prefix:
            self._set_latest(prefix)
        log.info(f"resuming from checkpoint {prefix} (global step {step})"
                 + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
        return step

    def _verify(self, prefix: str) -> None:
        """Compare the restored state with the digest the chief recorded when it saved ``prefix``
        (sets ``restored_digest`` and ``restore_verified``).

        Raises:
            TrainingError: the digests differ (the restored values are not the saved ones).
        """
        from kerasdist.errors import TrainingError

        self.restored_digest = state_digest.state_digest(self.model)
        saved = state_digest.read(self.directory).get(Path(prefix).name)
        self.restore_verified = saved == self.restored_digest
        if saved is None:
            log.warning(f"checkpoint {prefix} has no recorded state digest (written by an older "
                        "kerasdist?); its restore cannot be verified")
        elif not self.restore_verified:
            raise TrainingError(f"checkpoint {prefix} restored values that differ from the ones "
                                f"saved (state sha256 {self.restored_digest} != {saved})")

    def _set_latest(self, prefix: str) -> None:
        """Chief: point the manager (and the ``checkpoint`` file) at ``prefix`` so that later saves
        rotate from it; the damaged files stay on disk until a save at their step replaces them."""
        import tensorflow as tf

        good = [p for p in reversed(self._candidates()) if int(p.rpartition("-")[2]) <=
                int(prefix.rpartition("-")[2])]
        tf.compat.v1.train.update_checkpoint_state(str(self.directory), prefix,
                                                   all_model_checkpoint_paths=good)
        self._manager = self._new_manager()

    def save(self, step: int) -> str | None:
        """Save at global ``step`` (every worker must call this at the same step); nothing is
        written when the state is not finite (every worker refuses at the same step).

        Returns:
            The chief's checkpoint path, None on other workers (their copy is already deleted).

        Raises:
            TrainingError: a model weight or optimizer variable is NaN or infinite (named, with
                the newest checkpoint kept).
        """
        newest = self._manager.latest_checkpoint if self._manager is not None else None
        check_finite_state(self.model, f"the training state at global step {step}", keeps=(
            f"the newest checkpoint {Path(newest).name} stays the resume point" if newest else
            "no checkpoint was written"))
        if self._manager is not None:
            # the digest first: a kill between the two leaves a digest without a checkpoint
            # (pruned later), never a complete checkpoint that cannot be verified; the previous
            # write ends first (asynchronous), else its digest would be pruned as files missing
            self.checkpoint.sync()
            state_digest.record(self.directory, f"ckpt-{step}",
                                state_digest.state_digest(self.model))
            with eager_save(), cpu_copies():  # no wait on a silent ps worker; keras variables
                self._written = self._manager.save(checkpoint_number=step, options=self._options)
            return self._written
        self.checkpoint.write(str(self._tmp / "ckpt"))
        for path in self._tmp.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return None

    def close(self) -> None:
        """Wait for the chief's last write; delete the temporary folder of a non-chief worker
        (idempotent).

        Raises:
            TrainingError: the last asynchronous write did not complete (its error is in the log).
        """
        from kerasdist.errors import TrainingError

        self.checkpoint.sync()
        if self._written and self._options is not None and \
                self._manager.latest_checkpoint != self._written:
            raise TrainingError(f"the checkpoint {self._written} was not written (an asynchronous "
                                f"write failed; see the log); the resume point is "
                                f"{self._manager.latest_checkpoint}")
        self._written = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


class StepBackup(keras.callbacks.Callback):
    """Save every ``every_steps`` global steps and at epoch ends; on an agreed preemption
    (:class:`PreemptionWatch`) save, then raise :class:`~kerasdist.errors.Preempted` mid-epoch
    (no validation, no ``on_epoch_end``) or, at an epoch's last step, let that epoch end.

    Args:
        store: the :class:`BackupStore` (None: never save, still stop on preemption).
        start_step: global step already done when this ``fit`` starts.
        every_steps: save period in global steps; None = epoch ends only.
        watch: the :class:`PreemptionWatch`.
        check_every: steps between preemption votes.

    Attributes:
        step: global step after the last finished batch.
        preempted: True once training stopped on an agreed SIGTERM or SIGINT.
    """

    def __init__(self, store, *, start_step: int, every_steps: int | None, watch: PreemptionWatch,
                 check_every: int = PREEMPTION_CHECK_STEPS):
        super().__init__()
        self.store, self.every_steps, self.watch = store, every_steps, watch
        self.check_every = check_every
        self.step = self._saved = start_step
        self.preempted = False

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.every_steps and self.step % self.every_steps == 0:
            self._save()
        if self.step % self.check_every == 0 and self._maybe_stop() and \
                batch + 1 < (self.params.get("steps") or 0):
            raise Preempted(self.step)  # a cut epoch is no finished one: no validation, no end

    def on_epoch_end(self, epoch, logs=None):
        self._save()
        self._maybe_stop()

    def _maybe_stop(self) -> bool:
        """Save and stop when the workers agree on a stop request; True when this call stopped."""
        if self.preempted or not self.watch.agreed():
            return False
        self._save()
        self.preempted = True
        self.model.stop_training = True
        log.info(f"preempted: checkpoint at global step {self.step} saved; stopping")
        return True

    def _save(self) -> None:
        if self.store is not None and self.step != self._saved:
            self.store.save(self.step)
            self._saved = self.step


class EpochEndSave(keras.callbacks.Callback):
    """Save the :class:`BackupStore` at every epoch end, numbered by ``optimizer.iterations``;
    under parameter server also every ``every_steps`` steps: the coordinator loop
    (:func:`kerasdist.keras.ps_loop.train_epoch`) joins and calls :meth:`save_step` (steps run
    asynchronously, so a callback cannot save between them by itself).

    Args:
        store: the :class:`BackupStore`.
        every_steps: save period in global steps under parameter server; None = epoch ends only.
    """

    def __init__(self, store, *, every_steps: int | None = None):
        super().__init__()
        self.store = store
        self.every_steps = every_steps
        self._saved_step: int | None = None

    def save_step(self, step: int) -> None:
        """Save at global step ``step`` (read by the caller after a join); once per step."""
        if step != self._saved_step:
            self.store.save(step)
            self._saved_step = step

    def on_epoch_end(self, epoch, logs=None):
        self.save_step(int(np.asarray(self.model.optimizer.iterations)))


def check_finite_state(model, what: str, *, keeps: str, restoring: bool = False) -> None:
    """Refuse a model whose weights or optimizer variables hold NaN or infinite values, before it
    is saved (or right after it was restored, ``restoring``).

    Args:
        model: a compiled Keras model (its optimizer's variables are checked too, when built).
        what: what is checked, for the message ("the training state at global step 6").
        keeps: what stays on disk, for the message.
        restoring: the state was just restored (the message says "not resumed", else "not saved").

    Raises:
        TrainingError: naming the first non-finite variable and ``keeps`` (exit code 1).
    """
    from kerasdist.errors import TrainingError

    optimizer = getattr(model, "optimizer", None)
    variables = [*model.weights, *(optimizer.variables if optimizer is not None else [])]
    for variable in variables:
        values = np.asarray(keras.ops.convert_to_numpy(variable))
        if not np.issubdtype(values.dtype, np.floating):
            continue
        finite = np.isfinite(values)
        if finite.all():
            continue
        name = getattr(variable, "path", None) or getattr(variable, "name", "?")
        raise TrainingError(
            f"{what} is not finite ({int(values.size - finite.sum())} of {values.size} values "
            f"of variable '{name}' are NaN/inf); "
            f"{'not resumed' if restoring else 'not saved'}: {keeps}. Lower "
            "optimizer.learning_rate or check the data for NaN/inf values.")

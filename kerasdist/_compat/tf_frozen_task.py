"""Mends: a parameter-server coordinator waits on every task of the cluster, a frozen worker too.

Upstream: no TensorFlow issue found; reproduction (TF 2.21, CPU): a parameter-server run with 3
workers, worker:2 frozen with SIGSTOP, then SIGTERM to the launcher: the coordinator goes on
without the frozen worker's calls, then blocks for good in ``Context.add_c_function`` under
``MultiDeviceSaver.save`` (the checkpoint), then in ``Context.remove_function`` under
``AtomicFunction.__del__`` (a function freed as ``fit`` returns). The coordinator's eager context
registers every function it adds on every remote task and removes every function it frees there,
and ``ParameterServerStrategy`` turns streaming enqueue off, which makes each a blocking RPC that a
task that does not answer holds for ever. And an eager ``MultiDeviceSaver.save`` whose tensors lie
on several tasks traces a new ``tf.function`` on *every* save.

Mends: :func:`eager_save` (a ``with`` block) makes ``MultiDeviceSaver.save`` run the same save ops
one by one (each only on the task that holds its tensors) instead of a traced function: same files
and keys, only the shard writes' parallelism lost. :func:`keep_functions` /
:func:`release_functions`: meanwhile ``Context.remove_function`` does nothing (memory only); used
from a stop request on, released after it unless calls were left on a task that does not answer.

:func:`leave_lost_workers`: a worker lost for good (a synchronous run's backup worker) never
answers the coordinator's recovery thread, which holds the cluster-update lock in a blocking
``GetStatus`` RPC to it for ever, and ``ClusterCoordinator.__del__``
(``WorkerPreemptionHandler.stop``) waits for that lock; from the call on, ``stop`` waits at most
:data:`STOP_LOCK_S` for it (the recovery thread is a daemon: it ends with the process).

Probe: :func:`bug_present` reads ``MultiDeviceSaver.save`` and ``parameter_server_strategy_v2``.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

from kerasdist._compat import _patch

NAME = "tf-frozen-task"
ISSUE = "no upstream issue; reproduction in this module's docstring"

_KEPT: dict[str, object] = {}  # the original Context.remove_function while keep_functions is on


def _saver_class():
    from tensorflow.python.checkpoint import functional_saver

    return functional_saver.MultiDeviceSaver


def bug_present() -> bool:
    """Whether TF's ``MultiDeviceSaver.save`` still traces a function when its tensors lie on
    more than one task, and ``ParameterServerStrategy`` still makes remote registrations blocking
    (reads sources; runs no TensorFlow op)."""
    from tensorflow.python.distribute import parameter_server_strategy_v2

    saver = "".join(inspect.getsource(_saver_class().save).split())
    strategy = inspect.getsource(parameter_server_strategy_v2)
    return ("self._num_unique_tasks>1" in saver and "def_function.function" in saver
            and '"TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"] = "False"' in strategy)


@contextlib.contextmanager
def eager_save() -> Iterator[bool]:
    """Within the block, multi-task checkpoint saves run their ops eagerly (no function to
    register on every task, so no wait on a task that holds none of the saved tensors).

    Yields:
        True when the patch is in effect; False when :func:`bug_present` is False (nothing
        patched). The original method is back on exit, also after an error.
    """
    if not bug_present():
        yield False
        return

    def one_task(original):
        def save(self, file_prefix, options=None):
            self._num_unique_tasks = 1  # this saver object serves one call (TF builds one per save)
            return original(self, file_prefix, options)

        return save

    with _patch.swapped(_saver_class(), "save", one_task):
        yield True


def keep_functions() -> bool:
    """From now on, freed ``tf.function``s are not removed from the eager context (nor from the
    remote tasks). Idempotent; cheap enough for a signal handler (no TensorFlow op).

    Returns:
        True when installed (now or before); False when :func:`bug_present` is False.
    """
    if _KEPT:
        return True
    if not bug_present():
        return False
    from tensorflow.python.eager import context

    _KEPT["remove_function"] = context.Context.__dict__["remove_function"]
    context.Context.remove_function = lambda self, name: None
    return True


def release_functions() -> None:
    """Undo :func:`keep_functions` (functions freed from now on are removed again). Idempotent."""
    if not _KEPT:
        return
    from tensorflow.python.eager import context

    context.Context.remove_function = _KEPT.pop("remove_function")


STOP_LOCK_S = 2.0


def leave_lost_workers() -> None:
    """From now on, stopping a ``ClusterCoordinator`` does not wait for the recovery of a worker
    that will not come back (see the module docs). Idempotent."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    def stop(self):
        self._should_preemption_thread_run = False
        if self._cluster_update_lock.acquire(timeout=STOP_LOCK_S):
            try:
                self._cluster_due_for_update_or_finish.set()
            finally:
                self._cluster_update_lock.release()

    cc.WorkerPreemptionHandler.stop = stop


def keeping_functions() -> bool:
    """Whether :func:`keep_functions` is in effect."""
    return bool(_KEPT)

"""Mend: a parameter-server coordinator's closure threads race inside TF's cluster function runtime.

Upstream: no TensorFlow issue found; the race is in TF's C++ (read at TF 2.21).
``EagerClusterFunctionLibraryRuntime`` keeps one ``FunctionData`` (target task, eager client,
operation) per remote function in a ``std::vector`` (``function_data_``,
``tensorflow/core/distributed_runtime/eager/cluster_function_library_runtime.h``). ``Instantiate``
appends to it (``emplace_back`` moves the elements when the vector grows); ``Run`` takes
``&function_data_[handle]`` under the lock, releases it, then reads the element, which may have
moved meanwhile: ``INTERNAL: Could not find eager client``, a SIGSEGV, or garbage in the request's
``Operation.device`` that the receiving task answers with ``INTERNAL: Unable to parse request``.

Where kerasdist meets it: ``ClusterCoordinator`` copies every scheduled call's outputs to the
coordinator in the closure thread of the worker that ran it (``RemoteValueImpl._copy_to_local``, an
``array_ops.identity``: a multi-device function instantiated once per op, dtype and task), so
closure threads instantiate and run there concurrently, beside the main thread's eager ops
(``tests/multiprocess/test_ps_coordinator_copies.py`` counts the instantiations).

Mend: ``_copy_to_local`` copies each eager tensor result to the coordinator's CPU with
``EagerTensor._copy_nograd`` (the device-to-device copy ``.numpy()`` uses: a send/receive pair, no
function; a failed copy raises ``UnavailableError``, as TF's own copy does); other values take
TF's own code. The closure threads then never touch the cluster function runtime, whose only user
left is the main thread.

Probe: :func:`bug_present` reads TF's header (``function_data_`` still a
``std::vector<FunctionData>``; without headers, the source alone) and ``_copy_to_local``'s source.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

from kerasdist._compat import _patch

NAME = "tf-coordinator-copies"
ISSUE = ("no upstream issue; EagerClusterFunctionLibraryRuntime::Run reads its std::vector "
         "element after releasing the lock (this module's docstring)")
HEADER = ("include", "tensorflow", "core", "distributed_runtime", "eager",
          "cluster_function_library_runtime.h")


def _remote_value_class():
    from tensorflow.python.distribute.coordinator import values

    return values.RemoteValueImpl


def header_has_vector() -> bool | None:
    """Whether TF's installed header still keeps ``function_data_`` in a ``std::vector``; None
    when the wheel ships no headers."""
    import tensorflow as tf

    path = Path(tf.__file__).parent.joinpath(*HEADER)
    if not path.is_file():
        return None
    text = "".join(path.read_text(encoding="utf-8", errors="replace").split())
    return "std::vector<FunctionData>function_data_" in text


def bug_present() -> bool:
    """Whether ``RemoteValueImpl._copy_to_local`` still copies with ``array_ops.identity`` (a
    multi-device function on the coordinator) and TF's cluster function runtime still keeps its
    functions in a ``std::vector`` (reads sources; runs no TensorFlow op)."""
    source = inspect.getsource(_patch.original(_remote_value_class(), "_copy_to_local"))
    return "array_ops.identity" in source and header_has_vector() is not False


def _coordinator_cpu() -> str:
    from tensorflow.python.eager import context

    server_def = context.get_server_def()
    return (f"/job:{server_def.job_name}/replica:0/task:{server_def.task_index}/device:CPU:0")


def _mended(original):
    @functools.wraps(original)
    def _copy_to_local(self):
        import tensorflow as tf

        if self._values is None:  # a function with no return value
            return None
        flat = tf.nest.flatten(self._values)
        if not all(callable(getattr(v, "_copy_nograd", None)) for v in flat):
            return original(self)  # an iterator, a composite tensor: TF's own copy
        device = _coordinator_cpu()
        try:
            copies = [v._copy_nograd(device_name=device) for v in flat]
        except RuntimeError as err:
            # EagerTensor._copy_to_device raises every failed status as a RuntimeError (a worker
            # lost after its call completed: "recvmsg:Connection reset by peer"), which the
            # coordinator would take for the call's own error and end the run with; TF's own copy
            # (an op) raises UnavailableError, the lost worker it recovers from
            raise tf.errors.UnavailableError(None, None, f"copying a result to the coordinator "
                                             f"failed: {err}") from None
        return tf.nest.pack_sequence_as(self._values, copies)

    return _copy_to_local


def _patches():
    return [_patch.Patch(_remote_value_class(), "_copy_to_local", _mended)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions

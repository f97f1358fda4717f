"""Whether this process has started TensorFlow's runtime: a process forked after that inherits a
runtime whose threads are gone (it hangs, or refuses to size its thread pools: "Intra op
parallelism cannot be modified after initialization"). :mod:`kerasdist.launch.forking` forks
nothing from such a process. No public API says it: ``tf.config``'s setters raise only when a
value is changed afterwards."""

from __future__ import annotations

import sys


def started() -> bool:
    """True once TensorFlow's eager context of this process is initialized (an op ran, a
    ``tf.data`` dataset was made, devices were listed ...); False before, or when TensorFlow is
    not imported. Reads ``tensorflow.python.eager.context``: the global context and its handle."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    ctx = context.context_safe()
    return ctx is not None and getattr(ctx, "_context_handle", None) is not None

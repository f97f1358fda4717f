"""kerasdist._compat.tf_coordinator_copies: the coordinator's copy of a scheduled call's results
gives what TensorFlow's own copy gives (values, dtypes, structure, the coordinator's device)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kerasdist._compat import tf_coordinator_copies as mend

pytest_plugins = ["kerasdist.testing"]
pytestmark = [pytest.mark.integration]


@tf.function
def _results(n):
    return {"loss": tf.fill([n], 0.5), "count": tf.cast(n, tf.int64),
            "name": tf.strings.as_string(n), "pair": (tf.constant(True), tf.zeros([2, n]))}


def _fetch_and_get(coordinator):
    values = [coordinator.schedule(_results, args=(tf.constant(n),)) for n in (1, 3)]
    coordinator.join()
    return [(v.fetch(), [(t.device, t.dtype) for t in tf.nest.flatten(v.get())])
            for v in values]


@pytest.mark.timeout(180)
def test_mended_copies_equal_tensorflows_own(ps_strategy):
    coordinator = tf.distribute.coordinator.ClusterCoordinator(ps_strategy)
    was = mend.installed()
    try:
        mend.uninstall()
        upstream = _fetch_and_get(coordinator)
        assert mend.install() and mend.installed()
        mended = _fetch_and_get(coordinator)
    finally:
        if not was:
            mend.uninstall()
    for (up_values, up_meta), (our_values, our_meta) in zip(upstream, mended, strict=True):
        assert our_meta == up_meta
        assert all(device.startswith("/job:chief/") for device, _ in our_meta), our_meta
        tf.nest.map_structure(np.testing.assert_array_equal, our_values, up_values)


def test_a_copy_from_a_lost_worker_is_a_worker_failure_tensorflow_recovers_from(monkeypatch):
    """``EagerTensor._copy_to_device`` raises a failed copy as a RuntimeError; the mended copy
    raises what TF's own copy raises (``UnavailableError``), which the coordinator's failure
    handling takes for a lost worker (the call runs again elsewhere) instead of ending the run."""
    from types import SimpleNamespace

    class _Lost:
        def _copy_nograd(self, device_name):
            raise RuntimeError("recvmsg:Connection reset by peer")

    monkeypatch.setattr(mend, "_coordinator_cpu", lambda: "/job:chief/replica:0/task:0/device:CPU:0")
    copy = mend._mended(lambda self: None)
    with pytest.raises(tf.errors.UnavailableError, match="Connection reset by peer"):
        copy(SimpleNamespace(_values=(_Lost(), _Lost())))

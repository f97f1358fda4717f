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

"""A built ``multi_worker`` strategy carries the recipe's all-reduce options into TF's collectives."""

from __future__ import annotations

import pytest

from kerasdist.config import validate_recipe

pytestmark = pytest.mark.integration


@pytest.mark.isolated  # a MultiWorkerMirroredStrategy must be the process's first TF op
@pytest.mark.timeout(120)
def test_built_strategy_carries_the_options_and_all_reduces_in_packs():
    import numpy as np
    import tensorflow as tf

    from kerasdist.strategies.multi_worker import MultiWorkerStrategy

    config = validate_recipe({"strategy": {"kind": "multi_worker", "communication": "ring",
                                         "bytes_per_pack": 1 << 10, "timeout_s": 30},
                              "cluster": {"kind": "local", "workers": 2}}).strategy
    strategy = MultiWorkerStrategy().build(config)  # no TF_CONFIG: one worker, one replica
    options = strategy.extended._communication_options  # what TF's collectives read
    assert (options.implementation.name, options.bytes_per_pack, options.timeout_seconds) == \
        ("RING", 1 << 10, None)  # timeout_s: the collective watchdog, not TF's per-op timeout

    values = [tf.fill([600], 1.5), tf.fill([2, 300], -2.0)]  # 2.4 KB each: packed, 1 KiB packs

    @tf.function
    def step():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", values))

    out = step()
    np.testing.assert_array_equal(out[0].numpy(), np.full([600], 1.5, np.float32))
    np.testing.assert_array_equal(out[1].numpy(), np.full([2, 300], -2.0, np.float32))

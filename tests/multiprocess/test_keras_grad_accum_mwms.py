"""Keras's own ``optimizer(gradient_accumulation_steps=2)`` in ``model.fit`` under
MultiWorkerMirroredStrategy with 2 real worker processes (keras#20582; mend
``kerasdist._compat.keras_20582_grad_accum``). Not kerasdist's recipe accumulation
(tests/multiprocess/test_accumulation_mwms.py).

Each worker trains SGD(momentum=0.9) and Adam for 5 micro-steps on fixed global batches of 8 (4
rows per worker), then, in the same process, the same model without a strategy on the same global
batches; it prints the largest difference over every variable (weights, iteration, learning rate,
slots, accumulators) and a digest of its distributed values. Oracle: difference within rtol 1e-5 /
atol 1e-6 and the same digest on both workers (bit-for-bit identical state).
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from kerasdist.cluster.spec import local_cluster
from kerasdist.launch.processes import LocalLauncher

# The extended tier (28 s, 2026-11-27): the README suite's conformance core has the
# gradient_accumulation case under multi_worker (tests/conformance/test_matrix_core.py).
pytestmark = [pytest.mark.multiprocess, pytest.mark.extended]

WORKER = textwrap.dedent("""
    import hashlib, json
    import kerasdist
    kerasdist.enable()
    import keras, numpy as np, tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()   # reads TF_CONFIG; first TF op
    BATCH, STEPS = 8, 5
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 4)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(4, 2))).astype("float32")

    def model(name):
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(2)])
        init = np.random.default_rng(1)
        m.set_weights([init.normal(size=w.shape).astype("float32") * 0.5 for w in m.weights])
        opt = (keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=2)
               if name == "sgd" else keras.optimizers.Adam(0.05, gradient_accumulation_steps=2))
        m.compile(opt, "mse")
        return m

    def rows(ctx):  # this worker's half of every global batch, in order
        per = BATCH // ctx.num_input_pipelines
        pick = np.concatenate([np.arange(s * BATCH, s * BATCH + BATCH)[ctx.input_pipeline_id
                               * per:(ctx.input_pipeline_id + 1) * per] for s in range(STEPS)])
        return tf.data.Dataset.from_tensor_slices((x[pick], y[pick])).batch(per)

    def state(m, distributed):
        out = []
        for v in list(m.weights) + list(m.optimizer.variables):
            v = getattr(v, "value", v)
            out.append([np.asarray(t) for t in strategy.experimental_local_results(v)]
                       if distributed else [np.asarray(v)])
        return out

    result = {}
    for name in ("sgd", "adam"):
        with strategy.scope():
            dist = model(name)
        dist.fit(strategy.distribute_datasets_from_function(rows), epochs=1,
                 steps_per_epoch=STEPS, verbose=0)
        ref = model(name)
        ref.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        got, want = state(dist, True), state(ref, False)
        result[name] = {
            "close": all(np.allclose(g[0], w[0], rtol=1e-5, atol=1e-6) for g, w in zip(got, want)),
            "max_abs_diff": max(float(np.max(np.abs(g[0] - w[0]))) for g, w in zip(got, want)),
            "replicas_equal": all(all(np.array_equal(g[0], o) for o in g[1:]) for g in got),
            "digest": hashlib.sha256(b"".join(t.tobytes() for g in got for t in g)).hexdigest(),
            "micro_steps": int(dist.optimizer._iterations.numpy()),
            "variables": len(got)}
    print("RESULT " + json.dumps(result), flush=True)
""")


@pytest.mark.timeout(240)
def test_two_workers_end_on_the_strategy_free_state(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    spec = local_cluster(workers=2)
    with LocalLauncher(log_dir=tmp_path / "logs", threads_per_task=1) as launcher:
        tasks = [launcher.start(spec.for_task("worker", i), [str(script)], program=[sys.executable])
                 for i in (0, 1)]
        for task in tasks:
            task.process.wait(timeout=200)
    logs = [t.log_path.read_text(errors="replace") for t in tasks]
    assert [t.returncode() for t in tasks] == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    results = [json.loads(log.split("RESULT ", 1)[1].splitlines()[0]) for log in logs]
    for name in ("sgd", "adam"):
        for worker in results:
            assert worker[name]["close"], (name, worker[name]["max_abs_diff"])
            assert worker[name]["replicas_equal"] and worker[name]["micro_steps"] == 5
        assert results[0][name]["digest"] == results[1][name]["digest"], name
    assert results[0]["adam"]["variables"] > results[0]["sgd"]["variables"] > 4  # slots compared

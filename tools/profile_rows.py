#!/usr/bin/env python3
"""Where the time of each bench row goes: isolated pieces of a step, timed alone, and a roofline.

Each piece runs in a fresh process of its own (TensorFlow's thread pools and collective runtime are
fixed at start-up), alone, on this machine:

* ``matmul``  -- ``tf.matmul`` of float32 n x n matrices in a ``tf.function``: GFLOP/s = 2 n^3 / s,
  best of several repeats (the machine's dense-arithmetic ceiling for the roofline);
* ``input``   -- kerasdist's tf.data training pipeline of ``recipes/mnist_cnn.yaml`` alone, batches/s;
* ``compute`` -- one seed-CNN training step (forward, backward, Adam) on a batch already in memory;
* ``allreduce`` -- 2 worker processes (``MultiWorkerMirroredStrategy``, local gRPC) all-reducing
  tensors of the seed CNN's variable shapes, float32 or bfloat16: the multi-worker gradient traffic;
* ``mw_step`` -- the same 2 workers running kerasdist's multi-worker step as one ``strategy.run``
  (forward, backward, all-reduce in the Keras optimizer, update; no ``fit``, no input);
* ``ps``      -- an in-process parameter-server cluster (1 ps, 1 worker; coordinator in the process):
  a scheduled no-op function (the coordinator's cost per step) and a function that reads every
  variable from the ps and adds a gradient-sized update back (the variable traffic per step).

FLOPs are counted from the model's layers (:func:`training_flops_per_example`); the compute-bound
rate is the measured matmul GFLOP/s over those FLOPs. Each bench row's measured step time is then
split into the pieces (the composition rules are printed with the table).

On a shared machine each piece's least time over its repeats is used (the median is reported
too), and ``--table A.json B.json`` merges several profiles by the best figure of each piece.

Usage (the whole profile runs in a private network namespace where the machine allows one)::

    python tools/profile_rows.py --out runs/profile_rows_1.json      # ~3-6 minutes
    python tools/profile_rows.py --table runs/profile_rows_*.json --merged-out runs/profile_merged.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSIDE_ENV = "KERASDIST_PROFILE_INSIDE"

# Run B of docs/benchmarks-log.md (2026-11-21, round-robin, 3 repeats, median examples/s, batch 128).
ROW_SHAPE = {"plain_keras": "one", "raw_step": "one", "default": "one",
             "tf_keras_multi_worker": "peers", "multi_worker": "peers",
             "multi_worker_bf16": "peers16",
             "tf_keras_parameter_server": "ps", "parameter_server": "ps"}
"""How each bench row's step is composed from the pieces (see :func:`breakdown`)."""
RUN_B = {"plain_keras": 1375.0, "raw_step": 1374.9, "default": 1307.0,
         "tf_keras_multi_worker": 644.9, "multi_worker": 618.3,
         "tf_keras_parameter_server": 1087.0, "parameter_server": 917.0}


# ------------------------------------------------------------------------------------- FLOPs
def training_flops_per_example(model) -> dict:
    """Multiply-add FLOPs (2 per multiply-add) of one training example through ``model``.

    Counts Conv2D (2 * H_out * W_out * C_out * kh * kw * C_in) and Dense (2 * in * out) layers;
    backward = weight gradients (as many FLOPs as forward) + input gradients (as many again, except
    for the first weight layer, whose input needs no gradient). Bias adds, ReLU, pooling, dropout,
    softmax and the optimizer's update are left out (< 1 % here). Source: the usual 3x-forward
    rule, e.g. Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1.

    Returns:
        ``{"forward": F, "training": T, "layers": {name: forward FLOPs}}``, FLOPs per example.
    """
    import keras

    layers, first = {}, None
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, h, w, c_out = layer.output.shape
            kh, kw = layer.kernel_size
            flops = 2 * h * w * c_out * kh * kw * layer.input.shape[-1]
        elif isinstance(layer, keras.layers.Dense):
            flops = 2 * layer.input.shape[-1] * layer.units
        else:
            continue
        layers[layer.name] = int(flops)
        first = first or layer.name
    forward = sum(layers.values())
    return {"forward": forward, "training": 3 * forward - layers[first], "layers": layers}


# ------------------------------------------------------------------------------------- pieces
def _tf(threads: int):
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    return tf


def piece_matmul(threads: int = 0) -> dict:
    tf = _tf(threads)
    best = {}
    for n in (512, 1024, 2048):  # best of 5: the ceiling, on a shared machine
        a = tf.random.normal([n, n])
        b = tf.random.normal([n, n])
        reps = max(2, int(4e9 // (2 * n ** 3)))

        @tf.function
        def run(a, b, reps=reps):
            out = a
            for _ in range(reps):
                out = tf.matmul(out, b) * 1e-3
            return tf.reduce_sum(out)

        run(a, b).numpy()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            run(a, b).numpy()
            times.append(time.perf_counter() - t0)
        best[n] = 2 * n ** 3 * reps / min(times) / 1e9
    return {"gflops_by_n": best, "gflops": max(best.values()), "threads": threads or "default"}


def _seed_model():
    import keras

    from kerasdist.models.seed import mnist_cnn

    keras.utils.set_random_seed(0)
    model = mnist_cnn()
    return model, keras.optimizers.Adam(1e-3)


def piece_compute(batch: int, threads: int = 0, steps: int = 30) -> dict:
    tf = _tf(threads)
    import keras

    model, optimizer = _seed_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.uniform([batch, 28, 28, 1])
    y = tf.random.uniform([batch], maxval=10, dtype=tf.int32)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    for _ in range(3):
        step(x, y).numpy()
    wall, best, cpu = _timed(lambda: step(x, y).numpy(), steps)
    flops = training_flops_per_example(model)
    return {"batch": batch, "threads": threads or "default", "step_ms": best, "median_ms": wall,
            "cpu_ms": cpu,
            "flops": flops, "params": int(model.count_params()),
            "achieved_gflops": flops["training"] * batch / (best / 1e3) / 1e9}


def _timed(fn, reps: int) -> tuple[float, float, float]:
    """Median and least wall ms per call, and mean CPU ms (this process, all threads) per call.
    On a shared machine the least is the closest to the piece's cost on a quiet one."""
    walls = []
    c0 = time.process_time()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        walls.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(walls), min(walls), (time.process_time() - c0) * 1e3 / reps


def piece_input(batch: int, batches: int = 300) -> dict:
    from kerasdist.config import load_recipe
    from kerasdist.data.pipeline import build_datasets

    recipe = load_recipe(ROOT / "recipes" / "mnist_cnn.yaml", [f"data.batch_size={batch}"])
    data = build_datasets(recipe.data, repeat_train=True)
    iterator = iter(data.train_fn())
    for _ in range(10):
        next(iterator)
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(iterator)
    wall = (time.perf_counter() - t0) * 1e3 / batches
    return {"batch": batch, "batch_ms": wall, "cpu_ms": (time.process_time() - c0) * 1e3 / batches}


def piece_allreduce_worker(dtype: str, bytes_per_pack: int, reps: int = 20) -> dict:
    """One of 2 workers (TF_CONFIG set by the parent): all-reduce the seed CNN's gradient shapes."""
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        bytes_per_pack=bytes_per_pack)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    model, _ = _seed_model()
    wire = {"float32": tf.float32, "bfloat16": tf.bfloat16}[dtype]
    grads = [tf.cast(tf.ones_like(v), wire) for v in model.trainable_variables]

    @tf.function
    def reduce():
        out = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", grads))
        return out[0][0, 0, 0, 0]

    for _ in range(3):
        reduce().numpy()
    wall, best, cpu = _timed(lambda: reduce().numpy(), reps)
    nbytes = sum(int(g.shape.num_elements()) * g.dtype.size for g in grads)
    return {"dtype": dtype, "bytes": nbytes, "bytes_per_pack": bytes_per_pack, "ms": best,
            "median_ms": wall,
            "cpu_ms": cpu, "tensors": len(grads)}


def piece_mw_step_worker(compression: str, threads: int, batch: int = 64, reps: int = 20) -> dict:
    """One of 2 workers: kerasdist's multi-worker training step without Keras ``fit`` and without
    input (``strategy.run`` of forward, backward and ``apply_gradients``, whose Keras hook does the
    all-reduce, compressed as ``compression``): the pieces together, as a worker runs them."""
    tf = _tf(threads)
    import keras

    from kerasdist.keras.compression import compress_gradients

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, optimizer = _seed_model()
        model.build((None, 28, 28, 1))
        compress_gradients(optimizer, compression)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size")
    x = tf.random.uniform([batch, 28, 28, 1])
    y = tf.random.uniform([batch], maxval=10, dtype=tf.int32)

    def replica_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / strategy.num_replicas_in_sync
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step():
        return strategy.run(replica_step)

    for _ in range(3):
        step().numpy()
    wall, best, cpu = _timed(lambda: step().numpy(), reps)
    return {"compression": compression, "threads": threads or "default", "batch": batch,
            "ms": best, "median_ms": wall, "cpu_ms": cpu}


def piece_ps(reps: int = 30) -> dict:
    import tensorflow as tf

    from kerasdist.cluster.inprocess import start_inprocess_cluster

    cluster = start_inprocess_cluster(num_workers=1, num_ps=1)
    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model, _ = _seed_model()
        model.build((None, 28, 28, 1))
    variables = model.trainable_variables

    @tf.function
    def noop():
        return tf.constant(1.0)

    @tf.function
    def read_and_update():
        reads = [tf.identity(v.value) for v in variables]  # ps -> worker: every variable
        for v, r in zip(variables, reads, strict=True):
            v.assign_add(r * 1e-9)  # worker -> ps: a gradient-sized tensor per variable
        return tf.add_n([tf.reduce_sum(r) for r in reads])

    out = {}
    for name, fn in (("noop", noop), ("read_and_update", read_and_update)):
        for _ in range(3):
            coordinator.schedule(fn)
        coordinator.join()
        walls = []
        for _ in range(reps):
            t0 = time.perf_counter()
            coordinator.schedule(fn).fetch()
            walls.append((time.perf_counter() - t0) * 1e3)
        out[f"{name}_ms"] = min(walls)
        out[f"{name}_median_ms"] = statistics.median(walls)
    t0 = time.perf_counter()  # the coordinator's sustained rate: many steps in flight
    for _ in range(10 * reps):
        coordinator.schedule(noop)
    coordinator.join()
    out["noop_pipelined_ms"] = (time.perf_counter() - t0) * 1e3 / (10 * reps)
    out["bytes_each_way"] = sum(int(v.shape.num_elements()) * 4 for v in variables)
    return out


def piece_inprocess_ps(workers: int, steps: int = 62) -> dict:
    """Keras ``fit`` (``kerasdist.enable()``) of the seed CNN under ``ParameterServerStrategy`` on an
    in-process cluster (1 ps, ``workers`` workers, coordinator in this process), global batch 128:
    examples/s of one epoch of ``steps`` steps after a warm-up epoch (an in-process point of the
    scaling check; ``--inprocess-ps`` runs it in a private network namespace)."""
    import keras
    import tensorflow as tf

    import kerasdist
    from kerasdist.cluster.inprocess import start_inprocess_cluster
    from kerasdist.config import load_recipe
    from kerasdist.data.pipeline import build_datasets
    from kerasdist.models.seed import mnist_cnn

    kerasdist.enable()
    cluster = start_inprocess_cluster(num_workers=workers, num_ps=1)
    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver)
    recipe = load_recipe(ROOT / "recipes" / "mnist_cnn.yaml", ["data.batch_size=128"])
    data = build_datasets(recipe.data, repeat_train=True)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = mnist_cnn()
        model.compile(optimizer="adam", metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data.train_fn, epochs=1, steps_per_epoch=10, verbose=0)
    t0 = time.perf_counter()
    model.fit(data.train_fn, epochs=1, steps_per_epoch=steps, verbose=0)
    wall = time.perf_counter() - t0
    return {"workers": workers, "steps": steps, "seconds": wall,
            "examples_per_s": steps * 128 / wall}


# ------------------------------------------------------------------------------------- driver
def _run_piece(name: str, **kwargs) -> dict:
    cmd = [sys.executable, __file__, "--piece", name, "--args", json.dumps(kwargs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    return _last_json(done, name)


def _last_json(done, name):
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"piece {name} failed (exit {done.returncode}): {done.stderr[-2000:]}")


def _run_allreduce(dtype: str, bytes_per_pack: int) -> dict:
    return _run_two_workers("allreduce_worker", dtype=dtype, bytes_per_pack=bytes_per_pack)


def _run_two_workers(piece: str, **kwargs) -> dict:
    """``piece`` in 2 worker processes of a local MWMS cluster; the first's result, with every
    worker's CPU ms."""
    import portpicker

    ports = [portpicker.pick_unused_port() for _ in range(2)]
    workers = [f"localhost:{p}" for p in ports]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config)}
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--piece", piece, "--args", json.dumps(kwargs)],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        results.append(_last_json(subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                                              stderr), piece))
    first = results[0]
    first["cpu_ms_per_worker"] = [r["cpu_ms"] for r in results]
    return first


def measure(quick: bool) -> dict:
    """Every piece, one after the other, each in its own process (see the module docs)."""
    out = {"matmul": [_run_piece("matmul", threads=t) for t in (0, 1)]}
    out["input"] = [_run_piece("input", batch=b) for b in (64, 128)]
    out["compute"] = [_run_piece("compute", batch=b, threads=t)
                      for b, t in ((128, 0), (64, 0), (64, 1), (128, 1))]
    packs = (0,) if quick else (0, 4 << 20, 32 << 20)
    out["allreduce"] = [_run_allreduce(d, p) for d in ("float32", "bfloat16") for p in packs]
    out["mw_step"] = [_run_two_workers("mw_step_worker", compression=c, threads=t)
                      for c in ("none", "bf16") for t in (0, 1)]
    out["ps"] = _run_piece("ps")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piece", help=argparse.SUPPRESS)
    parser.add_argument("--args", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="one all-reduce pack size only")
    parser.add_argument("--inprocess-ps", type=int, nargs="+", metavar="WORKERS",
                        help="only measure Keras fit on in-process parameter-server clusters of "
                        "these worker counts (each in its own process)")
    parser.add_argument("--out", type=Path, default=Path("runs/profile_rows.json"))
    parser.add_argument("--table", type=Path, nargs="+",
                        help="print the tables of earlier --out files (several: best of each piece)")
    parser.add_argument("--merged-out", type=Path, help="with --table: write the merged result")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.piece:
        fn = globals()[f"piece_{args.piece}"]
        print(json.dumps(fn(**json.loads(args.args))), flush=True)
        return 0
    if args.table:
        merged = best_of([json.loads(p.read_text(encoding="utf-8")) for p in args.table])
        if args.merged_out:
            args.merged_out.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
        print(report(merged))
        return 0
    if not os.environ.get(INSIDE_ENV):
        from kerasdist.launch import isolation

        if isolation.unavailable_reason() is None:  # the task servers: unreachable from outside
            argv = isolation.isolated_argv([sys.executable, __file__, *(argv or sys.argv[1:])])
            return subprocess.call(argv, env={**os.environ, INSIDE_ENV: "1"})
    started = time.time()
    if args.inprocess_ps:
        for n in args.inprocess_ps:
            print(json.dumps(_run_piece("inprocess_ps", workers=n)), flush=True)
        return 0
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
              "load_avg_before": os.getloadavg(), "pieces": measure(args.quick)}
    result["load_avg_after"] = os.getloadavg()
    result["seconds"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(report(result))
    return 0


_KEYS = {"matmul": ("threads",), "input": ("batch",), "compute": ("batch", "threads"),
         "allreduce": ("dtype", "bytes_per_pack"), "mw_step": ("compression", "threads")}


def best_of(results: list[dict]) -> dict:
    """Several profiles merged piece by piece: the least time (greatest GFLOP/s) of each piece,
    the closest figure to a quiet machine when others' jobs load it at random moments."""
    if len(results) == 1:
        return results[0]
    merged = {"date": [r["date"] for r in results], "pieces": {}, "cores": results[0].get("cores"),
              "load_avg": [(r.get("load_avg_before"), r.get("load_avg_after")) for r in results]}
    for name, keys in _KEYS.items():
        groups: dict = {}
        for r in results:
            for item in r["pieces"].get(name, []):
                groups.setdefault(tuple(item[k] for k in keys), []).append(item)
        if name == "matmul":
            merged["pieces"][name] = [max(g, key=lambda i: i["gflops"]) for g in groups.values()]
        else:
            field = {"input": "batch_ms", "compute": "step_ms"}.get(name, "ms")
            merged["pieces"][name] = [min(g, key=lambda i, f=field: i[f]) for g in groups.values()]
    merged["pieces"]["ps"] = min((r["pieces"]["ps"] for r in results),
                                 key=lambda p: p["read_and_update_ms"])
    return merged


def _pick(items: list[dict], **match) -> dict:
    return next(i for i in items if all(i.get(k) == v for k, v in match.items()))


def breakdown(pieces: dict, rows: dict[str, float]) -> list[dict]:
    """Split each row's measured step (ms per global batch of 128) into the measured pieces.

    Composition rules (2 cores; every task of a cluster on them):
    * one process (plain_keras, raw_step, default): input(128) + compute(128, all cores);
    * multi_worker, 2 workers of 64 examples, both running at once, one core each:
      input(64) + compute(64, 1 thread) + all-reduce of the float32 gradients (2 processes);
    * parameter_server, 2 workers of 128 examples each, at once: per 128 examples half of
      input(128) + compute(128, 1 thread) + variable read & update (ps <-> worker) + the
      coordinator's scheduled-function round trip.
    What the pieces leave unexplained ("rest") is Keras's per-step work, the extra processes'
    share of the cores (ps, coordinator, launcher) and the machine's other load.
    """
    inp = {i["batch"]: i["batch_ms"] for i in pieces["input"]}
    comp = {(c["batch"], c["threads"]): c["step_ms"] for c in pieces["compute"]}
    f32 = _pick(pieces["allreduce"], dtype="float32", bytes_per_pack=0)["ms"]
    b16 = _pick(pieces["allreduce"], dtype="bfloat16", bytes_per_pack=0)["ms"]
    ps = pieces["ps"]
    out = []
    for row, ex_s in rows.items():
        step = 128 / ex_s * 1e3
        shape = ROW_SHAPE[row]
        if shape == "ps":
            parts = {"input": inp[128] / 2, "compute": comp[(128, 1)] / 2,
                     "transfer": ps["read_and_update_ms"] / 2, "coordinator": ps["noop_ms"] / 2}
        elif shape in ("peers", "peers16"):
            parts = {"input": inp[64], "compute": comp[(64, 1)],
                     "transfer": f32 if shape == "peers" else b16,
                     "coordinator": 0.0}
        else:
            parts = {"input": inp[128], "compute": comp[(128, "default")], "transfer": 0.0,
                     "coordinator": 0.0}
        parts["rest"] = step - sum(parts.values())
        whole = [m for m in pieces.get("mw_step", []) if m["threads"] == "default"
                 and m["compression"] == ("bf16" if shape == "peers16" else "none")]
        together = f"{whole[0]['ms']:.0f}–{whole[0]['median_ms']:.0f}" if whole and \
            shape.startswith("peers") else "–"
        out.append({"row": row, "examples_per_s": ex_s, "step_ms": step, **parts,
                    "together": together})
    return out


def _ms(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def report(result: dict, rows: dict[str, float] | None = None) -> str:
    """Markdown tables: the pieces, each row's step split into them, and the roofline line."""
    pieces = result["pieces"]
    rows = rows or RUN_B
    comp = _pick(pieces["compute"], batch=128, threads="default")
    flops = comp["flops"]["training"]
    peak_all = _pick(pieces["matmul"], threads="default")["gflops"]
    peak1 = _pick(pieces["matmul"], threads=1)["gflops"]
    cores = result.get("cores") or os.cpu_count() or 1
    peak = max(peak_all, cores * peak1)  # on a loaded machine the all-core figure falls short
    bound = peak * 1e9 / flops
    lines = [f"seed CNN: {comp['params']:,} parameters; {comp['flops']['forward'] / 1e6:.2f} MFLOP "
             f"forward, {flops / 1e6:.2f} MFLOP per training example ({comp['flops']['layers']})",
             f"matmul float32: {peak_all:.1f} GFLOP/s (all cores), {peak1:.1f} GFLOP/s (1 thread); "
             f"ceiling {peak:.1f} GFLOP/s (the larger of all cores and {cores} x 1 thread); "
             f"compute-bound rate {bound:.0f} examples/s; the compute piece alone (batch 128): "
             f"{128 / comp['step_ms'] * 1e3:.0f} examples/s = {comp['achieved_gflops']:.1f} "
             f"GFLOP/s, {100 * comp['achieved_gflops'] / peak:.0f} % of the ceiling",
             "", "| piece | condition | least wall ms | median wall ms | CPU ms |",
             "| --- | --- | --- | --- | --- |"]
    for i in pieces["input"]:
        lines.append(f"| input | batch {i['batch']} | – | {i['batch_ms']:.2f} | {i['cpu_ms']:.2f} |")
    for c in pieces["compute"]:
        lines.append(f"| compute | batch {c['batch']}, threads {c['threads']} | {c['step_ms']:.1f} | "
                     f"{_ms(c.get('median_ms'))} | {c['cpu_ms']:.1f} |")
    for a in pieces["allreduce"]:
        lines.append(f"| all-reduce, 2 processes | {a['dtype']}, {a['bytes'] / 1e6:.1f} MB, "
                     f"bytes_per_pack {a['bytes_per_pack']} | {a['ms']:.1f} | "
                     f"{_ms(a.get('median_ms'))} | "
                     f"{' / '.join(f'{x:.1f}' for x in a['cpu_ms_per_worker'])} |")
    for m in pieces.get("mw_step", []):
        lines.append(f"| multi-worker step, 2 processes, no fit, no input | batch {m['batch']} per "
                     f"worker, compression {m['compression']}, threads {m['threads']} | "
                     f"{m['ms']:.1f} | {m['median_ms']:.1f} | "
                     f"{' / '.join(f'{x:.1f}' for x in m['cpu_ms_per_worker'])} |")
    ps = pieces["ps"]
    lines += [f"| ps read + update | {ps['bytes_each_way'] / 1e6:.1f} MB each way | "
              f"{ps['read_and_update_ms']:.1f} | {_ms(ps.get('read_and_update_median_ms'))} | – |",
              f"| coordinator round trip | scheduled no-op, fetched | {ps['noop_ms']:.2f} | "
              f"{_ms(ps.get('noop_median_ms'))} | – |",
              f"| coordinator, sustained | no-ops scheduled back to back, per step | – | "
              f"{ps['noop_pipelined_ms']:.2f} | – |",
              "", "| row | examples/s | % of compute bound | step ms / 128 ex. | input | compute | "
              "all-reduce or transfer | coordinator | rest | compute + all-reduce as one step |",
              "| --- " * 10 + "|"]
    for r in breakdown(pieces, rows):
        cells = " | ".join(f"{r[k]:.1f}" for k in ("step_ms", "input", "compute", "transfer",
                                                    "coordinator", "rest"))
        lines.append(f"| {r['row']} | {r['examples_per_s']:.0f} | "
                     f"{100 * r['examples_per_s'] / bound:.0f} % | {cells} | {r['together']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

"""Seeds 000 + 003: asynchronous between-graph training of the MNIST CNN on 1 ps + N workers.

Each task is its own process, started with the seeds' flags::

    python -m legacy.async_cnn --job_name=ps     --task_index=0 --ps_hosts=... --worker_hosts=...
    python -m legacy.async_cnn --job_name=worker --task_index=0 ...   # chief
    python -m legacy.async_cnn --job_name=worker --task_index=1 ...

Without ``--job_name`` the same CNN trains in one process (a baseline).
``python -m legacy async-cnn`` starts the whole local cluster (legacy/runner.py).

Flow, as in the seeds: ClusterSpec + Server per task; the ps joins; each
worker builds the same graph under ``replica_device_setter`` (variables and
Adam slots on the ps, compute on the worker); every worker applies its own
gradients as soon as it has them (asynchronous, no aggregation);
``MonitoredTrainingSession`` with ``StopAtStepHook(last_step=--train_steps)``
ends training at that global step; the chief (task 0) initialises the
variables and writes checkpoints and summaries to ``--log_dir``; the others
wait for it. Data: the real MNIST digits, training on the first 80 % (8,000)
of the 10k test set, each worker on its own shard, and the chief finally
measures accuracy on the held-out last 2,000 digits.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from legacy._common import (
    add_cluster_flags,
    cnn_logits,
    hard_exit,
    import_tf_v1,
    load_mnist,
    make_server,
    say,
    serve_forever,
    session_config,
    to_float_flat,
    wait_for_chief,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="legacy.async_cnn", description=__doc__.split("\n")[0])
    add_cluster_flags(p, train_steps=600, learning_rate=1e-3)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--keep_prob", type=float, default=0.5, help="dropout keep probability")
    p.add_argument("--data_dir", default=None, help="folder with the MNIST IDX .gz files")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--print_every", type=int, default=50)
    return p


class Batches:
    """Endless shuffled mini-batches of one worker's shard (the seeds' next_batch)."""

    def __init__(self, images, labels, batch_size, seed):
        self.x, self.y, self.bs = images, labels, batch_size
        self.rng = np.random.RandomState(seed)
        self.order, self.pos = self.rng.permutation(len(labels)), 0

    def next(self):
        if self.pos + self.bs > len(self.order):
            self.order, self.pos = self.rng.permutation(len(self.y)), 0
        idx = self.order[self.pos:self.pos + self.bs]
        self.pos += self.bs
        return self.x[idx], self.y[idx]


def build_graph(tf, learning_rate, seed):
    v1 = tf.compat.v1
    v1.set_random_seed(seed)
    global_step = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [None, 784], name="x")
    y = v1.placeholder(tf.int64, [None], name="y")
    keep_prob = v1.placeholder_with_default(1.0, [], name="keep_prob")
    logits = cnn_logits(tf, x, keep_prob)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = v1.train.AdamOptimizer(learning_rate).minimize(loss, global_step=global_step)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    v1.summary.scalar("loss", loss)
    v1.summary.scalar("batch_accuracy", accuracy)
    return dict(global_step=global_step, x=x, y=y, keep_prob=keep_prob, loss=loss,
                train_op=train_op, correct=correct)


def evaluate(sess, g, images, labels, batch=500) -> float:
    """Accuracy on held-out digits, dropout off."""
    hits = 0.0
    for i in range(0, len(labels), batch):
        hits += sess.run(g["correct"], {g["x"]: images[i:i + batch], g["y"]: labels[i:i + batch]})
    return hits / len(labels)


def _train(run, g, batches, args, label):
    local_step, step, t0 = 0, 0, time.time()
    while True:
        bx, by = batches.next()
        out = run([g["train_op"], g["global_step"], g["loss"]],
                  {g["x"]: bx, g["y"]: by, g["keep_prob"]: args.keep_prob})
        if out is None:
            break
        _, step, loss = out
        local_step += 1
        if local_step % args.print_every == 0:
            say(f"{label}: local_step={local_step}, global_step={step}, loss={loss:.4f}")
    return local_step, int(step), time.time() - t0


def run_single(args) -> None:
    tf = import_tf_v1()
    v1 = tf.compat.v1
    (tx, ty), (ex, ey) = load_mnist(args.data_dir)
    batches = Batches(to_float_flat(tx), ty, args.batch_size, args.seed)
    with tf.Graph().as_default():
        g = build_graph(tf, args.learning_rate, args.seed)
        with v1.Session(config=session_config(tf, threads=args.threads)) as sess:
            sess.run(v1.global_variables_initializer())
            steps = {"n": 0}

            def run(fetches, feed):
                if steps["n"] >= args.train_steps:
                    return None
                steps["n"] += 1
                return sess.run(fetches, feed)

            local_step, step, train_s = _train(run, g, batches, args, "Single")
            acc = evaluate(sess, g, to_float_flat(ex), ey)
    say(f"train_wall_s={train_s:.3f}")
    say(f"Single: steps={local_step}, held-out accuracy={acc:.4f} on {len(ey)} digits")


def run_worker(args, tf, cluster, server, worker_hosts) -> None:
    v1 = tf.compat.v1
    n, i = len(worker_hosts), args.task_index
    is_chief = i == 0
    label = f"Worker {i}"
    (tx, ty), (ex, ey) = load_mnist(args.data_dir)
    # Between-graph data parallelism: worker i trains on every n-th example.
    batches = Batches(to_float_flat(tx[i::n]), ty[i::n], args.batch_size, args.seed * 100 + i)
    if is_chief and args.log_dir is None:
        args.log_dir = tempfile.mkdtemp(prefix="async_cnn_")
    config = session_config(tf, threads=args.threads, op_timeout_ms=args.op_timeout_ms,
                            device_filters=["/job:ps", f"/job:worker/task:{i}"])
    with v1.device(v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{i}", cluster=cluster)):
        g = build_graph(tf, args.learning_rate, args.seed)
    say(f"{label}: {'initializing' if is_chief else 'waiting for chief at'} {server.target}, "
        f"shard of {len(batches.y)} training digits")
    if not is_chief:
        wait_for_chief(tf, server, config)
    sess = v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.log_dir if is_chief else None,
        hooks=[v1.train.StopAtStepHook(last_step=args.train_steps)],
        save_checkpoint_steps=max(args.train_steps // 2, 1),
        save_summaries_steps=max(args.train_steps // 20, 1),
        log_step_count_steps=0,
        config=config,
        stop_grace_period_secs=5,
    )

    def run(fetches, feed):
        return None if sess.should_stop() else sess.run(fetches, feed)

    with sess:
        say(f"{label}: session ready")
        local_step, step, train_s = _train(run, g, batches, args, label)
    say(f"{label}: done, local_step={local_step}, global_step={step}")
    say(f"train_wall_s={train_s:.3f}")
    if is_chief:
        # The trained variables live on the ps; read them with a plain session.
        with v1.Session(server.target, config=config) as plain:
            acc = evaluate(plain, g, to_float_flat(ex), ey)
            final_step = plain.run(g["global_step"])
        say(f"{label}: held-out accuracy={acc:.4f} on {len(ey)} digits "
            f"(global_step={final_step}, checkpoints in {args.log_dir})")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.job_name is None:
        run_single(args)
        return
    tf = import_tf_v1()
    cluster, server, _, worker_hosts = make_server(tf, args)
    if args.job_name == "ps":
        serve_forever(server, f"ps {args.task_index}")
        return
    run_worker(args, tf, cluster, server, worker_hosts)
    hard_exit(0)


if __name__ == "__main__":
    main()

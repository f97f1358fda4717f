"""Seed 001: synchronous between-graph training of y = W x + b on 1 ps + N workers.

Each task is its own process, started with the seed's flags, e.g. on one host::

    python -m legacy.sync_replicas --job_name=ps     --task_index=0 --ps_hosts=localhost:2222 \
        --worker_hosts=localhost:2223,localhost:2224
    python -m legacy.sync_replicas --job_name=worker --task_index=0 ...   # chief
    python -m legacy.sync_replicas --job_name=worker --task_index=1 ...

Without ``--job_name`` the same linear problem is trained in one process (the
seed's single-machine baseline). ``python -m legacy sync-replicas`` starts a
whole local cluster for you (see legacy/runner.py).

Flow, as in the seed: ClusterSpec + Server per task; the ps only joins; every
worker builds the same graph under ``replica_device_setter`` so W, b and the
global step live on the ps; ``SyncReplicasOptimizer`` with
replicas_to_aggregate = total_num_replicas = number of workers accumulates one
gradient per worker before each update; the chief (task 0) initialises the
variables and the sync token queue and runs the chief queue runner, the other
workers wait for it; training stops at global step ``--train_steps``; data is
one point per step, y = 2x + 10 + N(0, 0.33^2), from a seeded generator.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from legacy._common import (
    add_cluster_flags,
    hard_exit,
    import_tf_v1,
    make_server,
    quiet_cancelled_queue_threads,
    say,
    serve_forever,
    session_config,
    wait_for_chief,
)

TRUE_W, TRUE_B, NOISE = 2.0, 10.0, 0.33


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="legacy.sync_replicas", description=__doc__.split("\n")[0])
    add_cluster_flags(p, train_steps=2000, learning_rate=0.01)
    p.add_argument("--session", choices=("monitored", "supervisor"), default="monitored",
                   help="MonitoredTrainingSession + the optimizer's session hook (default), "
                        "or the seed's Supervisor with chief_queue_runner / init tokens")
    p.add_argument("--seed", type=int, default=1, help="seed of data and initial W, b")
    p.add_argument("--print_every", type=int, default=100)
    return p


def sample_point(rng: np.random.RandomState):
    x = rng.randn(1).astype(np.float32)
    y = (TRUE_W * x + rng.randn(1) * NOISE + TRUE_B).astype(np.float32)
    return x, y


def build_linear(tf, seed: int):
    """Placeholders, W, b and the squared loss, like the seed's graph."""
    v1 = tf.compat.v1
    init = np.random.RandomState(seed).randn(2).astype(np.float32)
    x = v1.placeholder(tf.float32, name="X")
    y = v1.placeholder(tf.float32, name="Y")
    w = v1.Variable(init[0], name="W")
    b = v1.Variable(init[1], name="b")
    activation = tf.add(tf.multiply(x, w), b)
    loss = tf.reduce_mean(tf.square(y - activation))
    return x, y, w, b, loss


# ---------------------------------------------------------------------------
# single process baseline
# ---------------------------------------------------------------------------

def run_single(args) -> None:
    tf = import_tf_v1()
    v1 = tf.compat.v1
    rng = np.random.RandomState(args.seed * 1000)
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        x, y, w, b, loss = build_linear(tf, args.seed)
        train_op = v1.train.GradientDescentOptimizer(args.learning_rate).minimize(
            loss, global_step=global_step)
        with v1.Session(config=session_config(tf, threads=args.threads)) as sess:
            sess.run(v1.global_variables_initializer())
            t0 = time.time()
            for step in range(1, args.train_steps + 1):
                tx, ty = sample_point(rng)
                sess.run(train_op, feed_dict={x: tx, y: ty})
                if step % args.print_every == 0:
                    wv, bv = sess.run([w, b])
                    say(f"Single: step={step}, W={wv:.9f}, b={bv:.9f}")
            train_s = time.time() - t0
            wv, bv = sess.run([w, b])
    say(f"train_wall_s={train_s:.3f}")
    say(f"Optimization Finished: W={wv:.9f}, b={bv:.9f}")


# ---------------------------------------------------------------------------
# cluster tasks
# ---------------------------------------------------------------------------

def _release_tokens_hook(tf, release_op):
    """Chief-only hook: when training ends, push one extra token per worker.

    With SyncReplicasOptimizer a worker's train step blocks until the chief
    queue runner hands it a token. Once the chief stops, a worker that already
    pushed its last gradient would wait forever; these tokens let it finish
    the step, see the final global step and stop too.
    """

    class ReleaseTokensHook(tf.compat.v1.train.SessionRunHook):
        def end(self, session):
            session.run(release_op)

    return ReleaseTokensHook()


def _build_worker_graph(tf, args, cluster, num_workers):
    v1 = tf.compat.v1
    with v1.device(v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster)):
        global_step = v1.train.get_or_create_global_step()
        x, y, w, b, loss = build_linear(tf, args.seed)
        base_opt = v1.train.GradientDescentOptimizer(args.learning_rate)
        opt = v1.train.SyncReplicasOptimizer(
            base_opt,
            replicas_to_aggregate=num_workers,
            total_num_replicas=num_workers,
            use_locking=True,
            name="lr_sync_replicas",
        )
        train_op = opt.apply_gradients(base_opt.compute_gradients(loss), global_step=global_step)
        v1.summary.scalar("loss", loss)
    return dict(global_step=global_step, x=x, y=y, w=w, b=b, loss=loss, opt=opt,
                train_op=train_op)


def _train_loop(g, run, args, label):
    """The seed's loop: one fresh point per step until the global step is reached."""
    rng = np.random.RandomState(args.seed * 1000 + 1 + args.task_index)
    local_step, last_print, step = 0, -1, 0
    t0 = time.time()
    while True:
        tx, ty = sample_point(rng)
        out = run([g["train_op"], g["global_step"], g["w"], g["b"]], {g["x"]: tx, g["y"]: ty})
        if out is None:  # monitored session asked to stop
            break
        step = int(out[1])
        local_step += 1
        bucket = step // args.print_every
        if bucket != last_print:
            last_print = bucket
            say(f"{label}: local_step={local_step}, global_step={step}, "
                f"W={out[2]:.9f}, b={out[3]:.9f}")
        if step >= args.train_steps:
            break
    return local_step, step, time.time() - t0


def _read_final(tf, server, g, config):
    """Read W and b back from the ps with a plain session (they live there)."""
    with tf.compat.v1.Session(server.target, config=config) as sess:
        return sess.run([g["w"], g["b"], g["global_step"]])


def _monitored_session(tf, args, g, server, is_chief, config, num_workers):
    v1 = tf.compat.v1
    if not is_chief:
        wait_for_chief(tf, server, config)
    release_op = g["opt"].get_init_tokens_op(num_tokens=num_workers)
    hooks = [
        g["opt"].make_session_run_hook(is_chief),
        v1.train.StopAtStepHook(last_step=args.train_steps),
    ]
    sess = v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.log_dir,
        hooks=hooks,
        chief_only_hooks=[_release_tokens_hook(tf, release_op)],
        save_checkpoint_steps=max(args.train_steps // 4, 1),
        save_summaries_steps=max(args.train_steps // 20, 1),
        log_step_count_steps=0,
        config=config,
        stop_grace_period_secs=5,
        max_wait_secs=600,
    )

    def run(fetches, feed):
        if sess.should_stop():
            return None
        return sess.run(fetches, feed_dict=feed)

    return sess, run


def _supervisor_session(tf, args, g, server, is_chief, config, num_workers):
    """The seed's way: Supervisor + chief_init_op / local_step_init_op + token queue."""
    v1 = tf.compat.v1
    opt = g["opt"]
    chief_queue_runner = opt.get_chief_queue_runner()
    sync_init_op = opt.get_init_tokens_op()
    release_op = opt.get_init_tokens_op(num_tokens=num_workers)
    sv = v1.train.Supervisor(
        is_chief=is_chief,
        logdir=args.log_dir,
        init_op=v1.global_variables_initializer(),
        local_init_op=opt.chief_init_op if is_chief else opt.local_step_init_op,
        ready_for_local_init_op=opt.ready_for_local_init_op,
        summary_op=None,
        recovery_wait_secs=1,
        global_step=g["global_step"],
        save_model_secs=0,
        stop_grace_secs=5,
    )
    sess = sv.prepare_or_wait_for_session(server.target, config=config)
    if is_chief:
        sess.run(sync_init_op)
        sv.start_queue_runners(sess, [chief_queue_runner])

    def run(fetches, feed):
        return sess.run(fetches, feed_dict=feed)

    def finish():
        if is_chief:
            sess.run(release_op)
            sv.saver.save(sess, sv.save_path, global_step=g["global_step"])
        sv.request_stop()
        sess.close()  # cancels the chief queue runner's blocked take_grad
        sv.stop(ignore_live_threads=True)

    return finish, run


def run_worker(args, tf, cluster, server, worker_hosts) -> None:
    num_workers = len(worker_hosts)
    is_chief = args.task_index == 0
    label = f"Worker {args.task_index}"
    if args.log_dir is None:
        args.log_dir = tempfile.mkdtemp(prefix="sync_replicas_")
    config = session_config(
        tf, threads=args.threads, op_timeout_ms=args.op_timeout_ms,
        device_filters=["/job:ps", f"/job:worker/task:{args.task_index}"])
    g = _build_worker_graph(tf, args, cluster, num_workers)
    if is_chief:
        say(f"{label}: Initializing session at {server.target}...")
    else:
        say(f"{label}: Waiting for session to be initialized at {server.target}...")

    if args.session == "monitored":
        sess, run = _monitored_session(tf, args, g, server, is_chief, config, num_workers)
        with sess:
            say(f"{label}: Session initialization complete.")
            local_step, step, train_s = _train_loop(g, run, args, label)
    else:
        finish, run = _supervisor_session(tf, args, g, server, is_chief, config, num_workers)
        say(f"{label}: Session initialization complete.")
        local_step, step, train_s = _train_loop(g, run, args, label)
        finish()

    wv, bv, final_step = _read_final(tf, server, g, config)
    say(f"{label}: local_step={local_step}, global_step={final_step}, W={wv:.9f}, b={bv:.9f}")
    say(f"train_wall_s={train_s:.3f}")
    say(f"Optimization Finished: W={wv:.9f}, b={bv:.9f}")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.job_name is None:
        run_single(args)
        return
    tf = import_tf_v1()
    quiet_cancelled_queue_threads(tf)
    cluster, server, _, worker_hosts = make_server(tf, args)
    if args.job_name == "ps":
        serve_forever(server, f"ps {args.task_index}")
        return
    run_worker(args, tf, cluster, server, worker_hosts)
    hard_exit(0)


if __name__ == "__main__":
    main()

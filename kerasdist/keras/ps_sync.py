"""Synchronous parameter-server training with backup workers: each step applies once the mean of
the first K of N gradients (``strategy.sync.replicas_to_aggregate``; :func:`sync_replicas`).

Global step ``s`` of ``model.fit`` under ``ParameterServerStrategy`` with N workers:

1. **Slices, cut on the coordinator.** The coordinator reads global batch ``s`` and cuts it into N
   slices: a dataset function gives its N pipelines (``InputContext`` ``i`` of N, per-replica
   batches of ``global / N``), one slice each; a dataset or arrays give global batches, split along
   axis 0 into N parts differing by at most one example. Slice ``i`` travels with call ``i``,
   whichever worker runs it, so a step's global batch never depends on the workers' speeds. In this
   mode the coordinator reads the data and sends it with the calls.
2. **N gradient calls** (``ClusterCoordinator.schedule``) run the model's own ``train_step`` on
   their slices, from the same variable values. While the step is traced, the optimizer's
   ``apply`` pushes the gradients instead of applying them: each, weighted by its slice's share
   ``n_i * N' / B`` (1.0 for equal slices; ``N'`` non-empty slices, ``B`` examples), into a
   ``ResourceConditionalAccumulator`` on its variable's ps (one per shard of a sharded variable),
   tagged ``local_step = s``. A call that starts after step ``s`` was applied computes nothing.
3. **One update.** Once K calls have completed, the coordinator runs one function that takes
   the mean of each accumulator (``ResourceAccumulatorTakeGradient(num_required=K)``, on its ps)
   and applies it with the Keras optimizer (each variable's update runs on its ps;
   ``optimizer.iterations``, the global step, grows by 1). Taking advances the accumulator's
   global step, so a gradient of step ``s`` that comes later is dropped by the accumulator,
   atomically.

With K = N every update is the gradient of the whole global batch: the weights equal a
strategy-free run on the same global batches (up to float summation order), even when a lost
worker's call is run again elsewhere. With K < N the slowest N - K calls of each step are dropped
(backup workers: Chen, Pan, Monga, Bengio, Jozefowicz, "Revisiting Distributed Synchronous SGD",
2016, arXiv:1604.00981); ``dropped = calls scheduled - gradients aggregated``, where each call
also pushes a one-hot of its slot into one more accumulator, whose mean tells how many a step
aggregated. Every call counts itself in the per-worker counters (``steps``: gradients computed).

Limits: each accumulator takes the first K gradients *it* receives, so with K < N two variables
of one step may average different calls (as ``tf.compat.v1.train.SyncReplicasOptimizer`` does);
``IndexedSlices`` gradients (``Embedding``) are made dense before the push (the resource
accumulator is dense: a call sends a table-sized gradient); state a step writes besides the
gradients (metrics, BatchNormalization's moving statistics) is written by every call that
computes; a ``train_step`` must apply the optimizer exactly once.

Source: ``tf.raw_ops.ResourceConditionalAccumulator`` and its ``ResourceAccumulator*`` ops (TF API
docs), the kernels behind ``tf.compat.v1.train.SyncReplicasOptimizer``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kerasdist.errors import RecipeError, UnsupportedFeatureError

_ATTR = "_kerasdist_replicas_to_aggregate"
FIELD = "strategy.sync.replicas_to_aggregate"
POLL_S = 0.002  # how often the coordinator looks for the K-th completed call


def check_replicas(replicas_to_aggregate, workers: int) -> int:
    """``replicas_to_aggregate`` checked against ``workers`` (None: all of them).

    Raises:
        RecipeError: not an int in ``[1, workers]``.
    """
    k = workers if replicas_to_aggregate is None else replicas_to_aggregate
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= workers:
        raise RecipeError(f"{FIELD} must be between 1 and the number of workers ({workers}). "
                          f"Received: replicas_to_aggregate={replicas_to_aggregate!r}")
    return k


def sync_replicas(model, replicas_to_aggregate: int | None = None):
    """Make ``model.fit`` under ``ParameterServerStrategy`` synchronous (see module docs).

    Args:
        model: built under ``ParameterServerStrategy.scope()``.
        replicas_to_aggregate: K, gradients averaged per step, ``1 <= K <= workers``; None: all
            workers (no backup workers).

    Returns:
        ``model``, whose ``fit`` (after ``kerasdist.enable()``) now trains synchronously.

    Raises:
        ValueError: not a parameter-server model; RecipeError: a bad ``replicas_to_aggregate``.
    """
    from kerasdist.keras.ps_fit import cluster_spec, is_parameter_server

    if not is_parameter_server(model.distribute_strategy):
        raise ValueError("sync_replicas needs a model built inside ParameterServerStrategy.scope()."
                         f" Received: distribute_strategy={type(model.distribute_strategy).__name__}")
    workers = cluster_spec(model.distribute_strategy).num_tasks("worker")
    setattr(model, _ATTR, check_replicas(replicas_to_aggregate, workers))
    return model


def replicas_to_aggregate(model) -> int | None:
    """K set by :func:`sync_replicas`, or None (asynchronous training)."""
    return getattr(model, _ATTR, None)


# ------------------------------------------------------------------------------ input (coordinator)
def _split(batch, parts: int) -> list:
    """``batch`` (a nest of tensors) cut along axis 0 into ``parts`` slices differing by at most
    one example; empty slices left out."""
    import tensorflow as tf

    rows = int(tf.shape(tf.nest.flatten(batch)[0])[0])
    sizes = [rows // parts + (i < rows % parts) for i in range(parts)]
    starts = [sum(sizes[:i]) for i in range(parts)]
    return [tf.nest.map_structure(lambda t, a=a, n=n: t[a:a + n], batch)
            for a, n in zip(starts, sizes, strict=True) if n]


@dataclass
class SyncInput:
    """An endless ``tf.data`` input read on the coordinator; iterating yields each step's list
    of ``(slice, scale)`` (see module docs). ``element_spec`` is one slice's."""

    dataset: Any
    zipped: bool  # elements are tuples of N slices (a dataset function's N pipelines)
    parts: int
    element_spec: Any = None

    def __post_init__(self):
        spec = self.dataset.element_spec
        self.element_spec = spec[0] if self.zipped else spec

    def __iter__(self):
        import tensorflow as tf

        for element in self.dataset:
            slices = list(element) if self.zipped else _split(element, self.parts)
            sizes = [int(tf.shape(tf.nest.flatten(s)[0])[0]) for s in slices]
            total = sum(sizes)
            yield [(s, n * len(slices) / total) for s, n in zip(slices, sizes, strict=True) if n]


def train_input(x, y=None, *, sample_weight=None, batch_size=None, shuffle: bool = False,
                num_workers: int):
    """``(PSInput, SyncInput)`` of ``fit``'s training input: the first for the checks and the
    steps of one pass (:func:`kerasdist.keras.ps_input.resolve_steps`), the second to train on.

    Args:
        x: a dataset function (called here with ``InputContext`` ``i`` of ``num_workers``,
            ``num_replicas_in_sync=num_workers``), a ``tf.data.Dataset`` of global batches or arrays
            (with ``y``, ``sample_weight``, batched by ``batch_size``, default 32, shuffled every
            pass when ``shuffle``).

    Raises:
        ValueError, UnsupportedFeatureError: as :func:`kerasdist.keras.ps_input.to_ps_input`.
    """
    import dataclasses
    import math

    import tensorflow as tf

    from kerasdist.keras import ps_input

    checked = ps_input.to_ps_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                                   num_workers=num_workers)
    if checked.kind == "dataset_fn":
        contexts = [tf.distribute.InputContext(num_workers, i, num_workers)
                    for i in range(num_workers)]
        zipped = tf.data.Dataset.zip(tuple(x(context) for context in contexts))
        return checked, SyncInput(zipped.repeat(), zipped=True, parts=num_workers)
    if checked.kind == "dataset":
        dataset = x
    else:
        data = ps_input.pack_arrays(x, y, sample_weight)
        dataset = tf.data.Dataset.from_tensor_slices(data)
        count = len(tf.nest.flatten(data)[0])
        if shuffle:
            dataset = dataset.shuffle(count, reshuffle_each_iteration=True)
        dataset = dataset.batch(batch_size or 32)
        checked = dataclasses.replace(checked, batches=math.ceil(count / (batch_size or 32)))
    if checked.kind == "dataset":
        checked = dataclasses.replace(checked, batches=int(dataset.cardinality().numpy()))
    return checked, SyncInput(dataset.repeat(), zipped=False, parts=num_workers)


# ---------------------------------------------------------------------------- the accumulators
@dataclass
class SyncStep:
    """One synchronous ``fit``: the accumulators, the traced functions and the step counts.

    Attributes:
        k: gradients averaged per step (K); ``parts``: slices per step (N, the workers).
        variables: the model's trainable variables; ``accumulators[i]``: ``(handle, rows)`` of
            each shard of ``variables[i]``; ``mask``: the ``[N]`` slot accumulator.
        used: indices of the variables ``train_step`` gives a gradient (known once traced).
        step: the global step of the next update (``optimizer.iterations``).
        scheduled / aggregated: calls scheduled and gradients averaged into updates, this fit.
    """

    k: int
    parts: int
    variables: list
    accumulators: list
    mask: Any
    step: int
    used: list = field(default_factory=list)
    pushes: int = 0
    refusal: str | None = None
    scheduled: int = 0
    aggregated: int = 0
    train_function: Any = None
    apply_function: Any = None

    def push(self, grads, variables, *, step, slot, scale):
        """Push ``grads`` (one per variable, None skipped) into the accumulators, tagged
        ``step``; then the one-hot of ``slot`` into :attr:`mask`. Traced on the coordinator.

        A gradient for a variable that is not one of the model's trainable ones sets
        :attr:`refusal` (raised by :func:`train_epoch`: autograph would wrap it here).
        """
        import tensorflow as tf

        index = {id(v): i for i, v in enumerate(self.variables)}
        variables = self.variables if variables is None else list(variables)
        pushed, self.used = [], []
        for grad, variable in zip(grads, variables, strict=True):
            if grad is None:
                continue
            if id(variable) not in index:
                self.refusal = ("strategy.sync: train_step applied a gradient to a variable that "
                                "is not one of the model's trainable variables. Received: "
                                f"{variable.path}")
                continue
            i = index[id(variable)]
            grad = tf.convert_to_tensor(grad)  # IndexedSlices made dense
            grad = grad * tf.cast(scale, grad.dtype)
            shards = self.accumulators[i]
            pieces = tf.split(grad, [rows for _, rows in shards]) if len(shards) > 1 else [grad]
            pushed += [tf.raw_ops.ResourceAccumulatorApplyGradient(
                handle=handle, local_step=step, gradient=piece)
                for (handle, _), piece in zip(shards, pieces, strict=True)]
            self.used.append(i)
        with tf.control_dependencies(pushed):
            tf.raw_ops.ResourceAccumulatorApplyGradient(
                handle=self.mask, local_step=step, gradient=tf.one_hot(slot, self.parts))
        self.pushes += 1

    def take(self, k):
        """``(mean gradients of the used variables, gradients aggregated)``, waiting for ``k``."""
        import tensorflow as tf

        grads = []
        for i in self.used:
            parts = [tf.raw_ops.ResourceAccumulatorTakeGradient(
                handle=handle, num_required=k, dtype=tf.as_dtype(self.variables[i].dtype))
                for handle, _ in self.accumulators[i]]
            grads.append(tf.reshape(tf.concat(parts, 0) if len(parts) > 1 else parts[0],
                                    self.variables[i].shape))
        mask = tf.raw_ops.ResourceAccumulatorTakeGradient(handle=self.mask, num_required=k,
                                                          dtype=tf.float32)
        return grads, tf.math.count_nonzero(mask)

    def set_step(self, step: int) -> None:
        """Drop gradients tagged before ``step`` from now on (every accumulator)."""
        import tensorflow as tf

        self.step = step
        for handle in [h for shards in self.accumulators for h, _ in shards] + [self.mask]:
            tf.raw_ops.ResourceAccumulatorSetGlobalStep(handle=handle,
                                                        new_global_step=tf.constant(step, tf.int64))


def _accumulator(variable, name: str):
    import tensorflow as tf

    with tf.device(variable.device):
        return tf.raw_ops.ResourceConditionalAccumulator(
            dtype=variable.dtype, shape=variable.shape, shared_name=name, reduction_type="MEAN")


def start(run) -> SyncStep:
    """Create the accumulators of ``run.model`` (on their variables' ps) and trace nothing yet.

    Raises:
        UnsupportedFeatureError: ``steps_per_execution > 1`` (a step is one round of N calls).
    """
    import tensorflow as tf

    from kerasdist._compat import internals

    model = run.model
    if int(getattr(model, "steps_per_execution", 1) or 1) > 1:
        raise UnsupportedFeatureError(
            "steps_per_execution > 1 is not supported by synchronous parameter-server training "
            "(strategy.sync): each step is one round of calls and one update on the ps. "
            f"Received: steps_per_execution={model.steps_per_execution}")
    tag = f"kerasdist_sync_{uuid.uuid4().hex[:12]}"
    accumulators = []
    for i, variable in enumerate(model.trainable_variables):
        backing = internals.backing_variable(variable)
        shards = list(getattr(backing, "variables", None) or [backing])
        accumulators.append([(_accumulator(s, f"{tag}_{i}_{j}"), int(s.shape[0]) if s.shape.rank
                              else 0) for j, s in enumerate(shards)])
    iterations = internals.backing_variable(model.optimizer.iterations)
    with tf.device(iterations.device):
        mask = tf.raw_ops.ResourceConditionalAccumulator(
            dtype=tf.float32, shape=[run.num_workers], shared_name=f"{tag}_mask",
            reduction_type="MEAN")
    state = SyncStep(k=replicas_to_aggregate(model), parts=run.num_workers,
                     variables=list(model.trainable_variables), accumulators=accumulators,
                     mask=mask, step=0)
    state.train_function = _train_function(model, run.strategy, state, run.counters)
    state.apply_function = _apply_function(model, run.strategy, state)
    return state


# -------------------------------------------------------------------------------- the functions
def _gradients(model, strategy, state, batch, step, slot, scale):
    """``train_step`` on ``batch`` with the optimizer's ``apply`` pushing (see module docs)."""
    import tensorflow as tf

    optimizer = model.optimizer
    pushes = state.pushes

    def push(grads, trainable_variables=None):
        state.push(grads, trainable_variables, step=step, slot=slot, scale=scale)

    optimizer.apply = push  # an instance attribute, only while train_step is traced
    try:
        logs = strategy.run(model.train_step, args=(batch,))
    finally:
        del optimizer.apply
    if state.pushes != pushes + 1:
        state.refusal = ("strategy.sync needs a train_step that applies the model's optimizer "
                         "exactly once per step (its gradients are what the workers aggregate). "
                         f"Received: {state.pushes - pushes} applies in "
                         f"{type(model).__name__}.train_step")
    return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], logs)


def _train_function(model, strategy, state, counters):
    """``fn(batch, step, slot, scale) -> logs`` to schedule: the gradient call of one slice;
    computes nothing (zeros as logs) once ``step`` was applied; counts itself in ``counters``
    (its worker's row: ``steps`` +1 and ``examples`` when it computed)."""
    import tensorflow as tf

    def call(batch, step, slot, scale):
        fresh = tf.cast(tf.convert_to_tensor(model.optimizer.iterations), tf.int64) <= step
        compute = tf.function(
            lambda: _gradients(model, strategy, state, batch, step, slot, scale)
        ).get_concrete_function()
        zeros = tf.nest.map_structure(
            lambda t: tf.zeros([d or 0 for d in t.shape], t.dtype), compute.structured_outputs)
        logs = tf.cond(fresh, compute, lambda: zeros)
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        ran = tf.cast(fresh, tf.int64)
        rows = tf.cast(tf.shape(tf.nest.flatten(batch)[0])[0], tf.int64)
        counted = counters.scatter_nd_add(tf.stack([[worker, 0], [worker, 2]]),
                                          tf.stack([ran, ran * rows]))
        with tf.control_dependencies([counted]):
            return tf.nest.map_structure(tf.identity, logs)

    return tf.function(call, reduce_retracing=True)


def _apply_function(model, strategy, state):
    """``fn(k) -> gradients aggregated``: take the means (waiting for ``k``) and apply them once
    with the Keras optimizer, in cross-replica context (each update on its variable's ps)."""
    import tensorflow as tf

    from kerasdist._compat import internals

    optimizer = model.optimizer

    def apply(k):
        grads, count = state.take(k)
        with strategy.scope(), internals.direct_merge_calls():
            type(optimizer).apply(optimizer, grads, [state.variables[i] for i in state.used])
        return count

    return tf.function(apply)


# ------------------------------------------------------------------------------------ the loop
def _completed(values, k: int, asked):
    """The logs of the first completed of ``values`` once ``k`` have completed (a call's error
    raised), or None when a stop was asked (``asked()``) and they did not within
    :data:`kerasdist.keras.ps_stop.STOP_JOIN_S` seconds."""
    from kerasdist._compat import internals
    from kerasdist.keras.ps_stop import STOP_JOIN_S

    events = [internals.remote_value_event(v) for v in values]
    deadline, order = None, []
    while True:
        order += [i for i, e in enumerate(events) if i not in order and e.is_set()]
        if len(order) >= k:
            break
        if deadline is None and asked():
            deadline = time.monotonic() + STOP_JOIN_S
        if deadline is not None and time.monotonic() > deadline:
            return None
        next(e for i, e in enumerate(events) if i not in order).wait(POLL_S)
    logs = [values[i].fetch() for i in order]  # raises a failed call's error
    return logs[0]


def train_epoch(run, iterator, *, steps: int, callbacks):
    """Run ``steps`` synchronous steps (see module docs); return ``(last logs, PSStats)``.

    As :func:`kerasdist.keras.ps_loop.train_epoch`: batch callbacks per step, a stop
    (``model.stop_training``) ends the epoch, a step saver saves every ``every_steps`` global
    steps (nothing is in flight but dropped gradients). The stats' ``sync`` holds K, N, calls
    scheduled, gradients aggregated and dropped.
    """
    import tensorflow as tf

    from kerasdist.keras import ps_loop, ps_stop

    state, model = run.sync, run.model
    run.counters.assign(tf.zeros_like(run.counters))
    saver, asked = ps_loop._step_saver(callbacks), ps_stop.stop_probe(callbacks)
    started, done, logs = time.perf_counter(), 0, {}
    scheduled, aggregated = state.scheduled, state.aggregated
    while done < steps and not model.stop_training:
        callbacks.on_train_batch_begin(done)
        step = tf.constant(state.step, tf.int64)
        values = [run.coordinator.schedule(state.train_function, args=(
            batch, step, tf.constant(slot, tf.int32), tf.constant(scale, tf.float32)))
            for slot, (batch, scale) in enumerate(next(iterator))]
        state.scheduled += len(values)
        if state.refusal:  # found while the call was traced
            raise UnsupportedFeatureError(state.refusal)
        last = _completed(values, min(state.k, len(values)), asked)
        if last is None:
            ps_stop.go_on_without(run, values)
            break
        state.aggregated += int(state.apply_function(tf.constant(min(state.k, len(values)))))
        state.step += 1
        logs = last
        callbacks.on_train_batch_end(done, logs)
        done += 1
        if saver is not None and done < steps and state.step % saver.every_steps == 0:
            saver.save_step(state.step)
    if run.stuck or ps_stop.left_in_flight(run, asked):
        ps_stop.go_on_without(run, [])
    stats = ps_loop.PSStats.from_counters(run.counters.numpy())
    stats.completed_steps = done
    stats.epoch_seconds.append(time.perf_counter() - started)
    stats.epoch_examples.append(stats.examples)
    calls, taken = state.scheduled - scheduled, state.aggregated - aggregated
    stats.sync = {"replicas_to_aggregate": state.k, "num_workers": state.parts,
                  "gradients": calls, "aggregated": taken, "dropped": calls - taken}
    return logs, stats

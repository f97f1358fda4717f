"""The mends in kerasdist._compat: gated on the bug, idempotent, and loud once upstream fixes it.

The two ``test_upstream_*_still_broken`` tests reproduce each bug against the *unmodified* upstream
code. When a Keras or TensorFlow release fixes one, its test fails with "upstream fixed ...: remove
this mend" — then delete the mend module and its entry in ``kerasdist._compat.MENDS``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from kerasdist import _compat
from kerasdist._compat import _fakes
from kerasdist._compat import keras_20582_grad_accum as mend_20582
from kerasdist._compat import keras_20585_symbolic_build as mend_20585
from kerasdist._compat import keras_bn_replica_stats as mend_bn
from kerasdist._compat import keras_replica_apply as mend_apply
from kerasdist._compat import keras_replica_loss as mend_loss
from kerasdist._compat import tf_72388_scalar_reduce as mend_72388

ALL = [__import__(name, fromlist=["NAME"]) for name in _compat.MENDS]


@pytest.fixture
def pristine():
    """Run a test with no mend installed, then put back whatever was installed before."""
    before = [m for m in ALL if m.installed()]
    for module in reversed(ALL):
        module.uninstall()
    yield
    for module in before:
        module.install()


def test_upstream_batchnorm_still_creates_moving_statistics_without_aggregation(pristine):
    assert mend_bn.bug_present(), (
        "upstream fixed BatchNormalization's moving statistics under mirrored strategies (they "
        "now pass an aggregation). Remove kerasdist/_compat/keras_bn_replica_stats.py")


def test_upstream_optimizer_still_clips_before_the_all_reduce(pristine):
    assert mend_apply.bug_present(), (
        "upstream changed where Keras clips and all-reduces gradients (keras#20582 area). "
        "Check, then remove kerasdist/_compat/keras_replica_apply.py")


def test_upstream_losses_still_scaled_by_replicas(pristine):
    assert mend_loss.bug_present(), (
        "upstream no longer divides losses by num_replicas_in_sync in compute_loss. Remove "
        "kerasdist/_compat/keras_replica_loss.py (and the division in keras_replica_apply)")


def test_bn_mend_averages_moving_statistics_only_under_mirrored_strategies(pristine):
    import keras

    _compat.apply()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        layer = keras.layers.BatchNormalization()
        layer.build((None, 3))
    assert layer.moving_mean.aggregation == "mean" and layer.gamma.aggregation == "none"
    plain = keras.layers.BatchNormalization()
    plain.build((None, 3))
    assert plain.moving_mean.aggregation == "none"


def test_replica_mends_are_identity_outside_keras_steps(pristine):
    from keras.src.losses import loss as loss_module

    _compat.apply()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():  # a user's own strategy.run loop keeps Keras's scaling
        assert not mend_loss.in_keras_step()
        assert float(loss_module.scale_loss_for_distribution(tf.constant(2.0))) == 1.0


def test_upstream_keras_20585_still_broken(pristine):
    assert mend_20585.bug_present(), (
        "upstream fixed keras#20585 (https://github.com/keras-team/keras/issues/20585): "
        "TensorFlowTrainer._maybe_symbolic_build no longer reduces a tuple batch across workers. "
        "Remove this mend: kerasdist/_compat/keras_20585_symbolic_build.py")


def test_upstream_keras_20582_still_broken(pristine):
    assert mend_20582.bug_present(), (
        "upstream changed keras#20582 (https://github.com/keras-team/keras/issues/20582): the "
        "gradient-accumulation ops.cond no longer wraps a merge_call in replica context. Check "
        "tests/integration/test_keras_grad_accum.py without the mend, then remove "
        "kerasdist/_compat/keras_20582_grad_accum.py")
    import keras

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        dense = keras.layers.Dense(1)
        dense.build((None, 2))
        optimizer = keras.optimizers.SGD(gradient_accumulation_steps=2)
        optimizer.build(dense.trainable_variables)

    @tf.function
    def step():
        strategy.run(lambda: optimizer.apply([tf.ones((2, 1)), tf.ones((1,))],
                                             dense.trainable_variables))

    with pytest.raises(RuntimeError, match="merge_call"):
        step()


def test_upstream_tensorflow_72388_still_broken(pristine):
    assert mend_72388.bug_present(), (
        "upstream fixed tensorflow#72388 (Keras side): reduce_per_replica no longer asks a "
        "multi-worker strategy for reduce('MEAN', scalar, axis=0). Remove this mend: "
        "kerasdist/_compat/tf_72388_scalar_reduce.py")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="dimension"):
        tf.distribute.get_strategy().reduce("MEAN", tf.constant(1.0), axis=0)


def test_apply_is_idempotent_and_names_the_issues(pristine):
    first = _compat.apply()
    method = mend_20585._trainer_class()._maybe_symbolic_build
    function = mend_72388._trainer_module().reduce_per_replica
    assert first == [module.NAME for module in ALL if module.bug_present()]
    assert _compat.apply() == first
    assert mend_20585._trainer_class()._maybe_symbolic_build is method  # not wrapped twice
    assert mend_72388._trainer_module().reduce_per_replica is function
    assert {name: _compat.status()[name] for name in first} == {name: "active" for name in first}
    for module in ALL:
        if "#" in module.NAME:
            number = module.NAME.split("#")[1]
            assert module.ISSUE.startswith("https://github.com/") and module.ISSUE.endswith(number)
        else:
            assert "reproduction" in module.ISSUE or module.ISSUE.startswith("https://github.com/")


def test_mended_reduce_averages_scalars_with_axis_none(pristine):
    _compat.apply()
    strategy = _fakes.fake_multi_worker_strategy()
    logs = {"loss": tf.constant(2.0), "accuracy": tf.constant(0.5), "vector": tf.constant([1.0, 3.0])}
    out = mend_72388._trainer_module().reduce_per_replica(logs, strategy, "auto")
    assert [c.axis for c in strategy.calls] == [None, 0]  # all scalars in one call, then the vector
    assert strategy.calls[0].value.shape == (2,)
    assert float(out["loss"]) == 2.0 and float(out["accuracy"]) == 0.5
    assert out["vector"].shape == (2,)


def test_mends_leave_single_process_strategies_alone(pristine):
    _compat.apply()
    strategy = tf.distribute.get_strategy()
    assert not _fakes.is_multi_worker(strategy)
    value = {"loss": tf.constant(1.5)}
    assert float(mend_72388._trainer_module().reduce_per_replica(value, strategy, "auto")["loss"]) == 1.5


def test_mended_symbolic_build_uses_the_local_batch(pristine):
    _compat.apply()
    import types

    strategy = _fakes.fake_multi_worker_strategy()
    built = []
    trainer = types.SimpleNamespace(_distribute_strategy=strategy, distribute_strategy=strategy,
                                    _symbolic_build=lambda data_batch: built.append(data_batch))
    batch = (_fakes.fake_per_replica("x0"), _fakes.fake_per_replica("y0"))
    mend_20585._trainer_class()._maybe_symbolic_build(trainer, iterator=[(0, 0, iter([batch]))])
    assert strategy.calls == []  # no cross-worker reduce at all
    assert built == [("x0", "y0")]


@pytest.mark.timeout(900)
def test_probes_run_no_tensorflow_op():
    """apply() must be safe before MultiWorkerMirroredStrategy is created (TF refuses collectives
    once its runtime has started), so the probes may not run TF ops: checked in a fresh process."""
    import subprocess
    import sys

    code = ("import kerasdist._compat as c; c.status(); c.apply(); "
            "from tensorflow.python.eager import context; "
            "print('initialized' if context.context()._initialized else 'clean')")
    # 600 s: importing TensorFlow alone took 2 min on this shared machine under load.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip().endswith("clean"), out.stderr[-2000:]


def test_upstream_keras_assign_add_still_not_atomic():
    from kerasdist._compat import keras_ps_atomic_assign

    assert keras_ps_atomic_assign.bug_present(), (
        "upstream changed keras.src.backend.common.variables.Variable.assign_add/assign_sub "
        "(no longer assign(self + value)): check they are atomic on a ps variable, then remove "
        "kerasdist/_compat/keras_ps_atomic_assign.py")


def test_upstream_tf_still_waits_on_every_task_to_save_and_to_free_a_function():
    from kerasdist._compat import tf_frozen_task

    assert tf_frozen_task.bug_present(), (
        "upstream changed MultiDeviceSaver.save (no function traced for multi-task eager saves) "
        "or ParameterServerStrategy (streaming enqueue left on): check that a parameter-server "
        "save and a freed function no longer wait on a frozen worker "
        "(tests/multiprocess/test_ps_faults.py::test_sigterm_saves_without_waiting_on_a_frozen_"
        "worker without the mend), then remove kerasdist/_compat/tf_frozen_task.py")


def test_upstream_keras_variables_still_break_a_second_async_checkpoint_save():
    from kerasdist._compat import keras_async_checkpoint

    assert keras_async_checkpoint.bug_present(), (
        "upstream changed keras Variable._copy_trackable_to_cpu (no tf.Variable created per "
        "call): check that two CheckpointManager saves with CheckpointOptions(enable_async=True) "
        "of a Keras model pass without the mend, then remove "
        "kerasdist/_compat/keras_async_checkpoint.py")


def test_async_checkpoint_mend_is_reversible_and_saves_twice_with_the_values_at_each_save(
        tmp_path):
    import keras

    from kerasdist._compat import keras_async_checkpoint

    variable = keras.Variable([1.0, 2.0])
    owner = keras_async_checkpoint._variable_class()
    original = owner.__dict__["_copy_trackable_to_cpu"]
    checkpoint = tf.train.Checkpoint(v=variable)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2)
    options = tf.train.CheckpointOptions(enable_async=True)
    paths = []
    for value in ([3.0, 4.0], [5.0, 6.0]):  # the second save failed without the mend
        variable.assign(value)
        with keras_async_checkpoint.cpu_copies() as patched:
            assert patched and owner.__dict__["_copy_trackable_to_cpu"] is not original
            paths.append(manager.save(options=options))
        variable.assign([0.0, 0.0])  # after the call: not in the checkpoint
    checkpoint.sync()
    assert owner.__dict__["_copy_trackable_to_cpu"] is original
    for path, value in zip(paths, ([3.0, 4.0], [5.0, 6.0]), strict=True):
        np.testing.assert_array_equal(
            tf.train.load_variable(path, "v/.ATTRIBUTES/VARIABLE_VALUE"), value)


def test_frozen_task_mends_are_reversible_and_the_eager_save_writes_a_readable_checkpoint(
        tmp_path):
    from tensorflow.python.checkpoint import functional_saver
    from tensorflow.python.eager import context

    from kerasdist._compat import tf_frozen_task

    save, remove = functional_saver.MultiDeviceSaver.save, context.Context.remove_function
    variable = tf.Variable([1.0, 2.0])
    with tf_frozen_task.eager_save() as patched:
        assert patched and functional_saver.MultiDeviceSaver.save is not save
        path = tf.train.Checkpoint(v=variable).write(str(tmp_path / "ckpt"))
    assert functional_saver.MultiDeviceSaver.save is save
    np.testing.assert_array_equal(tf.train.load_variable(path, "v/.ATTRIBUTES/VARIABLE_VALUE"),
                                  [1.0, 2.0])
    try:
        assert tf_frozen_task.keep_functions() and tf_frozen_task.keep_functions()  # idempotent
        assert tf_frozen_task.keeping_functions()

        @tf.function
        def double(x):
            return 2 * x

        name = double.get_concrete_function(tf.constant(1.0)).function_def.signature.name
        context.context().remove_function(name)  # a no-op now: still registered
        assert context.context().has_function(name)
    finally:
        tf_frozen_task.release_functions()
        tf_frozen_task.release_functions()  # idempotent
    assert context.Context.remove_function is remove and not tf_frozen_task.keeping_functions()


def test_upstream_tf_cluster_function_runtime_still_races_with_the_coordinator_copies():
    from kerasdist._compat import tf_coordinator_copies

    assert tf_coordinator_copies.header_has_vector() is not False
    assert tf_coordinator_copies.bug_present(), (
        "upstream changed RemoteValueImpl._copy_to_local (no array_ops.identity) or "
        "EagerClusterFunctionLibraryRuntime (function_data_ no longer a std::vector): check that "
        "its Run no longer reads an element after releasing the lock, run "
        "tests/multiprocess/test_ps_coordinator_copies.py without the mend, then remove "
        "kerasdist/_compat/tf_coordinator_copies.py")


def test_upstream_keras_still_has_no_parameter_server_fit():
    from kerasdist._compat import keras_ps_dispatch

    assert keras_ps_dispatch.bug_present(), (
        "upstream Keras's TensorFlow trainer now mentions ClusterCoordinator: check whether its "
        "model.fit supports ParameterServerStrategy, then remove "
        "kerasdist/_compat/keras_ps_dispatch.py")


def test_upstream_keras_optimizer_still_all_reduces_in_the_private_hook():
    from kerasdist._compat import keras_allreduce_hook

    assert keras_allreduce_hook.hook_present(), (
        f"upstream Keras's TF optimizer has no {keras_allreduce_hook.HOOK} any more: find its new "
        "gradient all-reduce (or a public API) and update kerasdist/_compat/keras_allreduce_hook.py")


def test_upstream_tensorboard_and_csvlogger_still_not_chief_aware():
    from kerasdist._compat import keras_chief_logs

    assert keras_chief_logs.bug_present(), (
        "upstream TensorBoard/CSVLogger now consult the distribution strategy. Check, then remove "
        "kerasdist/_compat/keras_chief_logs.py")


def test_chief_logs_mend_sends_a_non_chief_csv_to_a_private_folder(tmp_path):
    import types

    from keras.callbacks import CSVLogger

    from kerasdist._compat import keras_chief_logs

    keras_chief_logs.install()
    path = tmp_path / "log.csv"
    for task, private in ((0, False), (1, True)):
        logger = CSVLogger(str(path))
        logger.set_model(types.SimpleNamespace(
            distribute_strategy=_fakes.fake_multi_worker_strategy(task)))
        logger.on_train_begin()
        logger.on_epoch_end(0, {"loss": 1.0})
        written = logger.filename
        logger.on_train_end()
        assert (written != str(path)) == private
    assert path.read_text().count("\n") == 2  # header + one epoch, from the chief only


def test_upstream_keras_variable_still_has_one_handle_for_sharded_values():
    from kerasdist._compat import keras_sharded_variables

    assert keras_sharded_variables.bug_present(), (
        "upstream fixed Keras's Variable.handle for ShardedVariable values: remove "
        "kerasdist/_compat/keras_sharded_variables.py (tests/integration/test_ps_sharded.py "
        "shows whether it still trains)")


def test_sharded_variable_mend_is_inert_and_reversible(pristine):
    import keras
    from tensorflow.python.eager import backprop

    from kerasdist._compat import keras_sharded_variables as mend

    upstream = backprop._handle_or_self
    assert mend.install() and mend.installed()
    variable = keras.Variable(np.ones((3, 2), np.float32))
    assert mend.sharded_value(variable) is None and type(variable) is keras.Variable
    with tf.GradientTape() as tape:  # an unsharded variable still differentiates as before
        loss = tf.reduce_sum(variable * 2.0)
    np.testing.assert_array_equal(tape.gradient(loss, variable), np.full((3, 2), 2.0))
    mend.uninstall()
    assert not mend.installed() and backprop._handle_or_self is upstream


def test_upstream_keras_19246_still_runs_the_step_inside_a_cond(pristine):
    from kerasdist._compat import keras_19246_steps_per_execution as mend

    assert mend.bug_present(), "upstream fixed keras#19246 (steps_per_execution): remove this mend"


def test_upstream_keras_still_reads_metrics_with_no_cross_worker_step(pristine):
    from kerasdist._compat import keras_metric_states as mend

    assert mend.bug_present(), "upstream aggregates metric states across workers: remove this mend"


def test_upstream_keras_saving_still_has_no_chief_logic():
    from kerasdist._compat import keras_chief_saves as mend

    assert mend.bug_present(), "upstream Model.save is chief-aware: remove this mend"


@pytest.mark.parametrize("name", ["keras_19246_steps_per_execution", "keras_metric_states",
                                  "keras_chief_saves", "keras_replica_add_loss",
                                  "tf_coordinator_copies"])
def test_new_mends_install_and_uninstall_cleanly(pristine, name):
    import importlib

    mend = importlib.import_module(f"kerasdist._compat.{name}")
    was = mend.installed()
    assert mend.install() and mend.installed()
    mend.uninstall()
    assert not mend.installed()
    if was:
        mend.install()


def test_the_recipe_save_by_the_chief_alone_never_waits_for_the_other_workers(
        pristine, monkeypatch, tmp_path):
    """The recipe path saves model.keras on the chief only (training/session.py): with the
    every-worker save mend installed (kerasdist.enable() ran in that process, as in a Ray worker)
    that save must not enter the mend's barrier, which waits for workers that never come (a Ray
    recipe run failed there at its end)."""
    import keras

    from kerasdist._compat import _worker_saves
    from kerasdist._compat import keras_chief_saves as mend
    from kerasdist.training.outputs import save_model_atomic

    def never(strategy):
        raise AssertionError("the chief-only save entered the every-worker barrier")

    was = mend.installed()
    assert mend.install()
    try:
        monkeypatch.setattr(mend, "is_multi_worker", lambda strategy: True)  # as multi-worker
        monkeypatch.setattr(_worker_saves, "barrier", never)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        with pytest.raises(AssertionError, match="every-worker barrier"):  # the mend is live
            model.save(tmp_path / "direct.keras")
        save_model_atomic(model, tmp_path / "model.keras")
        assert keras.saving.load_model(tmp_path / "model.keras").count_params() == 3
    finally:
        if not was:
            mend.uninstall()


def test_upstream_keras_still_shares_added_losses_between_replica_threads():
    from kerasdist._compat import keras_replica_add_loss as mend

    assert mend.bug_present(), "upstream add_loss no longer uses a per-object list: check the mend"


def test_keras_train_step_still_matches_the_accumulating_copy(monkeypatch):
    """kerasdist.keras.accumulation's step is a copy of Keras's TF train_step on micro-batches
    (kerasdist/_compat/keras_accumulation_step.py); its probe flips when Keras's step changes."""
    from kerasdist._compat import keras_accumulation_step as step

    assert step.matches_keras(), (
        "Keras's train_step changed: it no longer uses "
        f"{step.missing_from_keras()}. Review kerasdist/_compat/keras_accumulation_step.py "
        "against the new keras/src/backend/tensorflow/trainer.py")
    monkeypatch.setattr(step, "_keras_step_source", lambda: "def train_step(self, data): ...")
    assert not step.matches_keras() and "self._compute_loss(" in step.missing_from_keras()


def test_accumulating_step_warns_when_keras_changed_its_step(monkeypatch, caplog):
    import logging

    import keras

    from kerasdist._compat import keras_accumulation_step as step
    from kerasdist.keras.accumulation import accumulate_gradients, accumulation_steps

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    monkeypatch.setattr(step, "_keras_step_source", lambda: "def train_step(self, data): ...")
    # kerasdist._log.configure (a CLI run earlier in this process) stops propagation to caplog
    monkeypatch.setattr(logging.getLogger("kerasdist"), "propagate", True)
    with caplog.at_level("WARNING", logger="kerasdist"):
        assert accumulate_gradients(model, 2) is model
    assert "Keras's own train_step changed" in caplog.text and accumulation_steps(model) == 2
    history = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_internals_public_twins_are_keras_own():
    """Where kerasdist uses the public API instead of keras.src, it is the same object."""
    import keras
    from keras.src import backend, tree
    from keras.src.trainers.data_adapters import data_adapter_utils

    assert keras.tree.map_structure is tree.map_structure
    assert keras.tree.lists_to_tuples is tree.lists_to_tuples
    assert keras.utils.unpack_x_y_sample_weight is data_adapter_utils.unpack_x_y_sample_weight
    assert keras.KerasTensor is backend.KerasTensor
    assert keras.backend.standardize_dtype is backend.standardize_dtype


@pytest.mark.parametrize("path, banned", [
    ("kerasdist/keras/new_module.py", True),
    ("kerasdist/training/new_module.py", True),
    ("kerasdist/_compat/new_module.py", False),
])
@pytest.mark.parametrize("line", ["from keras.src import tree",
                                  "from tensorflow.python.eager import context"])
def test_the_wall_refuses_internals_outside_compat(path, banned, line):
    """ruff (TID251, pyproject.toml) fails on a keras.src / tensorflow.python import outside
    kerasdist/_compat/ (the file is given on stdin under that path; nothing is written)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (the [test] extra has it)")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select",
                           "TID251", "--stdin-filename", path, "-"], input=f"{line}\n",
                          capture_output=True, text=True, cwd=root, timeout=60)
    assert (done.returncode == 1 and "TID251" in done.stdout) is banned, done.stdout + done.stderr


# A probe per patched symbol (issue 32): tools/compat_targets.py wrote, on the newest supported
# pair, every symbol a mend patches with its upstream signature. A symbol that is gone, or whose
# signature changed, fails here by name: read that mend before trusting it on this version.
_TARGETS = json.loads((Path(__file__).with_name("compat_targets.json")).read_text())


def _target_ids():
    return sorted(_TARGETS)


@pytest.mark.parametrize("symbol", _target_ids())
def test_every_patched_symbol_is_still_upstream_as_the_mend_expects(symbol):
    from kerasdist._compat import _patch

    found = {name: (mend, owner, attribute) for mend, name, owner, attribute in _compat.targets()}
    assert symbol in found, f"{symbol} ({_TARGETS[symbol]['mend']}) is no longer patched or gone"
    mend, owner, attribute = found[symbol]
    assert mend == _TARGETS[symbol]["mend"]
    assert _patch.signature(_patch.original(owner, attribute)) == _TARGETS[symbol]["signature"], (
        f"upstream changed {symbol}, patched by mend {mend}: check the mend, then regenerate "
        "tests/unit/compat_targets.json (python tools/compat_targets.py)")


def test_every_target_of_the_mends_is_in_the_probe_table():
    assert sorted(name for _, name, _, _ in _compat.targets()) == _target_ids()


def test_the_patch_helper_puts_back_an_inherited_method_and_records_the_target():
    from kerasdist._compat import _patch

    class Base:
        def hello(self):
            return "base"

    class Child(Base):
        pass

    def wrap(original):
        return lambda self: "mended " + original(self)

    assert _patch.install("test-mend", [_patch.Patch(Child, "hello", wrap)], lambda: False) is False
    assert "hello" not in vars(Child)
    assert _patch.install("test-mend", [_patch.Patch(Child, "hello", wrap)], lambda: True) is True
    assert Child().hello() == "mended base"
    assert _patch.install("test-mend", [_patch.Patch(Child, "hello", wrap)]) is True  # idempotent
    assert Child().hello() == "mended base"
    assert _patch.original(Child, "hello") is Base.__dict__["hello"]
    assert {"mend": "test-mend", "target": f"{__name__}.{Child.__qualname__}.hello"} in \
        _patch.records()
    with pytest.raises(RuntimeError, match="already patched by mend 'test-mend'"):
        _patch.install("other-mend", [_patch.Patch(Child, "hello", wrap)])
    _patch.uninstall("test-mend")
    assert "hello" not in vars(Child) and Child().hello() == "base"
    assert not any(r["mend"] == "test-mend" for r in _patch.records())


def test_the_pins_are_the_supported_range():
    import tomllib

    from kerasdist._compat import versions

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    for package, spec in versions.SUPPORTED.items():
        assert f"{package}{spec}" in project["dependencies"], (package, spec)


def test_an_untested_version_gets_one_warning_line_and_unknown_version_states(monkeypatch, caplog):
    import logging

    from kerasdist._compat import versions

    monkeypatch.setattr(versions, "installed", lambda: {"tensorflow": "2.99.0rc0", "keras": "3.15.1"})
    monkeypatch.setattr(versions, "_WARNED", [])
    logger = logging.getLogger("kerasdist.compat")
    with caplog.at_level(logging.WARNING, logger="kerasdist.compat"):
        first = versions.warn_if_untested(logger)
        assert versions.warn_if_untested(logger) is None  # once per process
    assert first == ("untested version: tensorflow 2.99.0rc0 (tested: >=2.20,<2.22); the mends "
                     "install by their probes, see `kerasdist env` for which are active")
    assert [r.getMessage() for r in caplog.records if r.name == "kerasdist.compat"] == [first]
    assert all(state.startswith("unknown version: ") for state in _compat.status().values())
    assert versions.untested({"tensorflow": "2.21.1rc0", "keras": "3.15.0"}) == {}
    assert versions.untested({"tensorflow": "2.18.1", "keras": "3.16.0"}) == {
        "tensorflow": "2.18.1", "keras": "3.16.0"}

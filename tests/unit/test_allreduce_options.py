"""The multi-worker all-reduce settings of a recipe reach TensorFlow's ``CommunicationOptions``,
and bad values are refused naming the field and the value received."""

from __future__ import annotations

import pytest

from kerasdist.config import load_recipe, validate_recipe
from kerasdist.config.strategy_configs import MultiWorkerStrategyConfig
from kerasdist.errors import RecipeError
from kerasdist.strategies.multi_worker import communication_options


def _strategy(**fields):
    return validate_recipe({"strategy": {"kind": "multi_worker", **fields},
                            "cluster": {"kind": "local", "workers": 2}}).strategy


def test_defaults_are_tfs_own():
    config = _strategy()
    assert (config.communication, config.bytes_per_pack, config.timeout_s,
            config.gradient_compression) == ("auto", 0, 60.0, "none")


@pytest.mark.parametrize("communication, name", [("auto", "AUTO"), ("ring", "RING"),
                                                 ("nccl", "NCCL")])
def test_every_field_reaches_communication_options(communication, name):
    options = communication_options(_strategy(communication=communication,
                                              bytes_per_pack=4 << 20, timeout_s=12.5))
    assert options.implementation.name == name
    assert options.bytes_per_pack == 4 << 20
    # no per-collective timeout (a sleeping thread per collective in TF): the collective
    # watchdog enforces strategy.timeout_s (tests/unit/test_collective_watchdog.py)
    assert options.timeout_seconds is None


@pytest.mark.parametrize("text, field, received", [
    ("bytes_per_pack: -1", "strategy.bytes_per_pack", "-1"),
    ("bytes_per_pack: 1.5", "strategy.bytes_per_pack", "1.5"),
    ("bytes_per_pack: lots", "strategy.bytes_per_pack", "'lots'"),
    ("bytes_per_pack: 99999999999999", "strategy.bytes_per_pack", "99999999999999"),
    ("timeout_s: 0", "strategy.timeout_s", "0"),
    ("timeout_s: -5", "strategy.timeout_s", "-5"),
    ("timeout_s: .inf", "strategy.timeout_s", "inf"),
    ("communication: mpi", "strategy.communication", "'mpi'"),
    ("gradient_compression: int8", "strategy.gradient_compression", "'int8'"),
])
def test_bad_values_are_refused_naming_field_and_value(write_recipe, text, field, received):
    path = write_recipe(f"cluster: {{kind: local, workers: 2}}\nstrategy:\n  kind: multi_worker\n  {text}\n")
    with pytest.raises(RecipeError, match="invalid recipe") as err:
        load_recipe(path)
    message = str(err.value)
    assert field in message and received in message, message


def test_override_on_the_command_line_reaches_the_options(write_recipe):
    recipe = load_recipe(write_recipe("cluster: {kind: local, workers: 2}\nstrategy: {kind: multi_worker}\n"),
                         ["strategy.bytes_per_pack=33554432", "strategy.communication=ring"])
    options = communication_options(recipe.strategy)
    assert (options.bytes_per_pack, options.implementation.name) == (32 << 20, "RING")


def test_unchecked_config_is_still_refused_with_the_field_named():
    # model_construct skips validation: the strategy module must not pass TF a bad value silently
    bad_pack = MultiWorkerStrategyConfig.model_construct(bytes_per_pack=-3)
    with pytest.raises(RecipeError, match=r"bytes_per_pack=-3"):
        communication_options(bad_pack)
    bad_kind = MultiWorkerStrategyConfig.model_construct(communication="mpi")
    with pytest.raises(RecipeError, match=r"strategy.communication.*Received: communication='mpi'"):
        communication_options(bad_kind)


HEARTBEAT_PROBE = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from kerasdist.strategies.multi_worker import configure_heartbeat
import tensorflow as tf
from tensorflow.python.eager import context

def resolver(workers):
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{i + 1}" for i in range(workers)]})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=0)

out = {}
for workers in (1, 2):  # one task first: it must leave the (process-wide) service unconfigured
    done = configure_heartbeat(resolver(workers), float(sys.argv[1]))
    service = context.context().coordination_service
    out[workers] = {"configured": done, "timeout_ms": service and service.heartbeat_timeout_in_ms,
                    "leader": service and service.service_leader,
                    "jobs": service and [[j.name, j.num_tasks] for j in service.coordinated_job_list]}
print(json.dumps(out))
"""


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(120)
def test_the_coordination_heartbeat_timeout_is_strategy_timeout_s():
    """TF's coordination service gets strategy.timeout_s as its heartbeat timeout (TF's own: a
    fixed 10 s, which failed 3 runs of 3 at 10 Mbit/s in tests/multiprocess/test_hosts.py), with
    the leader and jobs TF itself would configure; a one-task cluster is left alone. In a child
    process (the setting is process-wide): 10-38 s of TensorFlow start-up here, so left out of
    the README suite (extended)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HEARTBEAT_PROBE, "37.5"], capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["1"] == {"configured": False, "timeout_ms": None, "leader": None, "jobs": None}, out
    assert out["2"] == {"configured": True, "timeout_ms": 37500,
                        "leader": "/job:worker/replica:0/task:0", "jobs": [["worker", 2]]}, out

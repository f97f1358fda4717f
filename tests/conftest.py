"""Test-wide setup: quiet, few-thread TensorFlow; 2 logical CPUs; no leaked environment variables."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LOGICAL_CPUS = 2


def pytest_configure(config):
    # Split the CPU before any test initialises TensorFlow, so MirroredStrategy tests get 2 replicas.
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(LOGICAL_CPUS)])


IN_PROCESS_CLUSTER_FIXTURES = {"inprocess_ps_cluster", "ps_strategy"}


def pytest_collection_modifyitems(session, config, items):
    """Run the tests that connect this process to an in-process cluster last.

    ``tf.config.experimental_connect_to_cluster`` cannot be undone and its servers can never be
    stopped; a MirroredStrategy step run afterwards in the same process hangs. Keeping those
    tests at the end keeps every other test in a process that was never connected.
    """
    def connects(item) -> bool:
        return bool(IN_PROCESS_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())))

    items.sort(key=connects)  # stable: the original order within each group is kept


@pytest.fixture(autouse=True)
def no_leaked_environment():
    """Fail any test that leaves environment variables changed (TF_CONFIG above all)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    changed -= {"PYTEST_CURRENT_TEST"}
    if changed:
        os.environ.clear()
        os.environ.update(before)
        pytest.fail(f"test leaked environment variables: {sorted(changed)}")


@pytest.fixture
def write_recipe(tmp_path):
    """Write a YAML recipe text into tmp_path and return its path."""

    def write(text: str, name: str = "recipe.yaml"):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write

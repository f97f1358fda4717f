"""pytest fixtures for code that trains under ``ParameterServerStrategy``.

Use as a plugin, in a ``conftest.py`` or a test module::

    pytest_plugins = ["kerasdist.testing"]

    def test_my_training(ps_strategy):
        with ps_strategy.scope():
            model = ...

Fixtures (session-scoped: in-process servers cannot be stopped, so one cluster serves the whole
pytest session; see :mod:`kerasdist.cluster.inprocess`). Connecting to a cluster cannot be undone
either, and a ``MirroredStrategy`` step run later in the same process can hang: run the tests
that use these fixtures last, or in a process of their own (kerasdist's own ``tests/conftest.py``
runs each test file's such tests together in one child process).

* ``inprocess_ps_cluster``: an :class:`~kerasdist.cluster.inprocess.InProcessCluster` with 2
  workers and 2 ps (so that sharded variables really span ps tasks), worker servers
  configured against the 2-core deadlock.
* ``ps_strategy``: a ``tf.distribute.ParameterServerStrategy`` on that cluster (variables of
  different tests accumulate on the ps for the session; build fresh models per test).
* ``slurm_cluster`` and ``kerasdist_enabled`` (per test): see their docstrings.
"""

from __future__ import annotations

import pytest

NUM_WORKERS = 2
NUM_PS = 2


@pytest.fixture(scope="session")
def inprocess_ps_cluster():
    """A running in-process cluster: ``NUM_WORKERS`` workers, ``NUM_PS`` ps, for the session."""
    from kerasdist.cluster.inprocess import start_inprocess_cluster

    return start_inprocess_cluster(num_workers=NUM_WORKERS, num_ps=NUM_PS)


@pytest.fixture(scope="session")
def ps_strategy(inprocess_ps_cluster):
    """``tf.distribute.ParameterServerStrategy`` connected to ``inprocess_ps_cluster``.

    Its ``__init__`` sets ``TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE`` and
    ``TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY`` for the process: requesting this fixture makes that
    happen once, at session setup, so tests that build further strategies do not count as
    leaking them."""
    import tensorflow as tf

    return tf.distribute.ParameterServerStrategy(inprocess_ps_cluster.cluster_resolver)


@pytest.fixture
def kerasdist_enabled():
    """``kerasdist.enable()`` for the test (``model.fit``/``evaluate`` of ParameterServerStrategy
    models routed to kerasdist), undone afterwards when it was not enabled before."""
    from kerasdist import keras as kd_keras

    was_enabled = kd_keras.is_enabled()
    kd_keras.enable()
    yield
    if not was_enabled:
        kd_keras.disable()


@pytest.fixture
def slurm_cluster(tmp_path):
    """A real one-node Slurm cluster (:class:`kerasdist.testing.slurm.SlurmCluster`: munge,
    ``slurmctld``, ``slurmd``) for the test, stopped after it with every job it ran. Skips,
    naming why, where Slurm is not installed or the test does not run as root."""
    from kerasdist.testing.slurm import SlurmCluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(1, work_dir=tmp_path / "slurm") as cluster:
        yield cluster

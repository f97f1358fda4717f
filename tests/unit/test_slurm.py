"""Cluster roles from Slurm via TF's SlurmClusterResolver, with faked SLURM_* variables."""

from __future__ import annotations

import pytest

from kerasdist.errors import ClusterError
from kerasdist.launch.clusters.slurm import slurm_jobs, tf_config_from_slurm


@pytest.fixture
def slurm_step(monkeypatch):
    """Pretend to be Slurm task ``procid`` of a step on nodes n[1-2], 2 tasks per node."""

    def fake(procid: int, *, nodes="n[1-2]", tasks_per_node="2(x2)", num_tasks=4):
        monkeypatch.setenv("SLURM_PROCID", str(procid))
        monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(num_tasks))
        monkeypatch.setenv("SLURM_STEP_NODELIST", nodes)
        monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", tasks_per_node)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    return fake


def test_multi_worker_roles(slurm_step):
    slurm_step(3)
    config = tf_config_from_slurm(needs_ps=False, port_base=9000)
    assert config.cluster == {"worker": ("n1:9000", "n1:9001", "n2:9000", "n2:9001")}
    assert config.task_name == "worker:3" and not config.is_chief
    slurm_step(0)
    assert tf_config_from_slurm(needs_ps=False).is_chief


def test_parameter_server_roles(slurm_step):
    slurm_step(1)
    config = tf_config_from_slurm(needs_ps=True, num_ps=1)
    assert {job: len(addresses) for job, addresses in config.cluster.items()} == \
        {"chief": 1, "ps": 1, "worker": 2}
    assert config.task_name == "ps:0"


def test_resolver_does_not_touch_the_environment(slurm_step):
    import os

    slurm_step(2)
    before = dict(os.environ)
    tf_config_from_slurm(needs_ps=False)
    assert dict(os.environ) == before  # no CUDA_VISIBLE_DEVICES, no TF_CONFIG


def test_missing_variable_is_named(slurm_step, monkeypatch):
    slurm_step(0)
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    with pytest.raises(ClusterError, match="missing SLURM_STEP_NODELIST"):
        tf_config_from_slurm(needs_ps=False)


def test_too_few_tasks_for_parameter_server():
    with pytest.raises(ClusterError, match="Received: 2 task"):
        slurm_jobs(needs_ps=True, num_tasks=2, num_ps=1)


def test_recipe_with_slurm_cluster_dispatches_through_slurm(slurm_step, monkeypatch):
    from kerasdist.config import validate_recipe
    from kerasdist.launch import run_recipe
    from kerasdist.launch.clusters import tf_config

    slurm_step(1, nodes="n7", tasks_per_node="2", num_tasks=2)
    seen = {}
    monkeypatch.setattr(tf_config, "run_session", lambda recipe, **kw: seen.update(kw))
    recipe = validate_recipe({"strategy": {"kind": "multi_worker"},
                              "cluster": {"kind": "slurm", "port_base": 7000}})
    run_recipe(recipe)
    assert seen["tf_config"].cluster == {"worker": ("n7:7000", "n7:7001")}
    assert seen["tf_config"].task_name == "worker:1"


def test_the_shared_role_counts_name_what_is_missing():
    """kerasdist.cluster.roles serves Slurm, JobSet and Trainer v2 alike: the counts and the rank
    order (chief, ps, workers: TF's SlurmClusterResolver order)."""
    from kerasdist.cluster.roles import rank_roles, task_counts

    with pytest.raises(ClusterError, match=r"cluster.kind 'jobset' with a parameter-server .*"
                                           r"Received: cluster.workers=2, cluster.ps=0"):
        task_counts(needs_ps=True, workers=2, ps=0, where="cluster.kind 'jobset'")
    counts = task_counts(needs_ps=True, workers=2, ps=1, where="x")
    assert counts == slurm_jobs(needs_ps=True, num_tasks=4, num_ps=1)
    assert rank_roles(counts) == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    assert rank_roles(task_counts(needs_ps=False, workers=2, ps=0, where="x")) == \
        [("worker", 0), ("worker", 1)]

"""Cluster spec / TF_CONFIG validation: every bad spec names the task and what was received."""

from __future__ import annotations

import json
import socket

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.cluster.spec import (
    check_port_free,
    check_ports_free,
    from_flags,
    local_cluster,
    parse_tf_config,
    split_address,
    validate,
)
from kerasdist.errors import ClusterError

CLUSTER = {"chief": ["localhost:2000"], "worker": ["localhost:2001", "localhost:2002"],
           "ps": ["localhost:2003"]}


def _tf_config(task_type="worker", index=1, cluster=None):
    return json.dumps({"cluster": cluster or CLUSTER, "task": {"type": task_type, "index": index}})


def test_parse_valid_tf_config():
    cfg = parse_tf_config(_tf_config())
    assert cfg.task_name == "worker:1" and cfg.address == "localhost:2002"
    assert not cfg.is_chief and cfg.num("worker") == 2
    assert json.loads(cfg.to_json()) == json.loads(_tf_config())
    assert parse_tf_config(_tf_config("chief", 0)).is_chief
    no_chief = {"worker": ["a:1", "b:2"]}
    assert parse_tf_config(_tf_config("worker", 0, no_chief)).is_chief


@pytest.mark.parametrize("text, needle", [
    (None, "needs the TF_CONFIG environment variable"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"', "not valid JSON (line 1, column"),
    ('{"cluster": {}}', "needs 'cluster' and 'task'"),
    (_tf_config(cluster={"wrker": ["a:1"]}, task_type="wrker", index=0), "unknown task type 'wrker'"),
    (_tf_config(index=2), "index out of range for 'worker' (2 task(s)). Received: index=2"),
    (_tf_config(index=-1), "Received: index=-1"),
    (_tf_config("ps", 0, {"worker": ["a:1"]}), "task.type 'ps' is not in the cluster"),
    (_tf_config(index="one"), "task.index must be an integer (or a string of digits). "
                              "Received: index='one'"),
    (_tf_config(index=True), "Received: index=True"),
    (_tf_config(index="-1"), "Received: index='-1'"),
    (_tf_config(index="2"), "index out of range for 'worker' (2 task(s)). Received: index='2'"),
    (_tf_config("evaluator", 0, {"worker": ["a:1"], "evaluator": ["b:1", "c:1"]}),
     "cluster.evaluator holds at most one task"),
    (_tf_config("evaluator", -1), "index out of range for 'evaluator' (not in the cluster)"),
    (_tf_config(cluster={"worker": ["::1:2222"]}, index=0),
     "an IPv6 address needs brackets, e.g. '[::1]:2222'. Received: '::1:2222'"),
    (_tf_config(cluster={"worker": ["[host]:2222"]}, index=0), "brackets hold an IPv6 address only"),
    (_tf_config(cluster={"worker": ["[::1]:"]}, index=0), "bad port in address. Received: '[::1]:'"),
    (_tf_config(cluster={"worker": ["a:1", "a:1"]}, index=0),
     "tasks worker:0 and worker:1 have the same address 'a:1'"),
    (_tf_config(cluster={"worker": ["a:99999"]}, index=0), "bad port in address. Received: 'a:99999'"),
    (_tf_config(cluster={"worker": ["nohostport"]}, index=0), "worker:0: address must be"),
    (_tf_config(cluster={"worker": "a:1"}, index=0), "must be a non-empty list"),
])
def test_bad_tf_config(text, needle):
    with pytest.raises(ClusterError) as err:
        parse_tf_config(text)
    assert needle in str(err.value)


def test_layouts_tensorflow_accepts():
    # Vertex AI / TF docs sidecar evaluator: the evaluator is not listed in "cluster".
    sidecar = parse_tf_config(_tf_config("evaluator", 0), require_ps=True)
    assert sidecar.task_name == "evaluator:0" and not sidecar.is_chief
    assert sidecar.num("evaluator") == 0 and sidecar.num("worker") == 2
    with pytest.raises(ClusterError, match="evaluator:0 is not in the cluster, so it has no address"):
        _ = sidecar.address
    listed = parse_tf_config(_tf_config("evaluator", 0, {**CLUSTER, "evaluator": ["localhost:2004"]}))
    assert listed.address == "localhost:2004"
    # A string index, as templated manifests write it (TF reads int(task["index"])).
    assert parse_tf_config(_tf_config(index="1")).task_index == 1
    assert json.loads(parse_tf_config(_tf_config(index="1")).to_json())["task"]["index"] == 1
    # Bracketed IPv6 addresses.
    v6 = parse_tf_config(_tf_config(cluster={"worker": ["[::1]:2222", "[fd00::2]:2222"]}, index=1))
    assert v6.address == "[fd00::2]:2222"
    assert split_address(v6.address) == ("fd00::2", 2222)
    assert split_address("localhost:2000") == ("localhost", 2000)


def test_evaluator_task_runs_the_sidecar_evaluator_not_training(write_recipe, tmp_path,
                                                               monkeypatch):
    run_dir = tmp_path / "run"
    linear = (f"model: {{name: linear}}\ndata: {{source: {{kind: synthetic_linear, num_examples: 200}}, "
              f"train_split: train, eval_split: test, batch_size: 50}}\ntrainer: {{epochs: 1, "
              f"verbose: 0}}\noutput: {{run_dir: '{run_dir}', tensorboard: false}}\n")
    assert main(["fit", str(write_recipe(linear, "train.yaml"))]) == 0  # the run to follow
    steps = json.loads((run_dir / "metrics.json").read_text())["global_steps"]
    cluster = write_recipe(linear.replace("trainer:", "strategy: {kind: multi_worker}\n"
                                          "cluster: {kind: tf_config}\ntrainer:"), "eval.yaml")
    monkeypatch.setenv("TF_CONFIG", _tf_config("evaluator", 0, {"worker": ["localhost:2001"]}))
    assert main(["fit", str(cluster)]) == 0
    (evaluation,) = json.loads((run_dir / "eval.json").read_text())["evaluations"]
    assert evaluation["global_step"] == steps and evaluation["checkpoint"] == f"ckpt-{steps}"


def test_parameter_server_needs_a_ps_task():
    with pytest.raises(ClusterError, match="needs at least one 'ps' task"):
        validate({"chief": ["a:1"], "worker": ["b:2"]}, "chief", 0, require_ps=True)


def test_seed_style_flags():
    cfg = from_flags(job_name="ps", task_index=0, ps_hosts="h0:2222",
                     worker_hosts="h1:2222, h2:2222")
    assert cfg.cluster == {"worker": ("h1:2222", "h2:2222"), "ps": ("h0:2222",)}
    with pytest.raises(ClusterError, match="index out of range for 'worker'"):
        from_flags(job_name="worker", task_index=5, ps_hosts="h0:1", worker_hosts="h1:1")


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, ""),
                                          (socket.AF_INET6, "::1")])
def test_port_in_use_names_task_and_port(family, host):
    """TF binds every interface, so a listener on any local address takes the port."""
    try:
        sock = socket.socket(family)
        sock.bind((host, 0))
    except OSError:
        pytest.skip(f"no {family.name} {host!r} on this machine")
    with sock:
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ClusterError, match=f"task ps:0: port {port} on 'localhost'"):
            check_port_free(f"localhost:{port}", "ps:0")
        with pytest.raises(ClusterError, match=f"task worker:1: port {port} on '::1'"):
            check_ports_free(validate({"worker": ["localhost:1", f"[::1]:{port}"]}, "worker", 0))
    check_port_free(f"localhost:{port}", "ps:0")  # free again once closed


def test_local_cluster_uses_distinct_free_ports():
    cfg = local_cluster(workers=3, ps=2, chief=True)
    addresses = [a for job in cfg.cluster.values() for a in job]
    assert len(set(addresses)) == 6 and cfg.task_name == "chief:0"
    assert cfg.for_task("ps", 1).address == cfg.cluster["ps"][1]


def test_cli_rejects_bad_tf_config_before_starting(write_recipe, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    path = write_recipe(f"strategy: {{kind: parameter_server}}\ncluster: {{kind: tf_config}}\n"
                        f"output: {{run_dir: '{run_dir}'}}\n")
    monkeypatch.setenv("TF_CONFIG", _tf_config(cluster={"chief": ["a:1"], "worker": ["b:2"]},
                                               task_type="chief", index=0))
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    assert "needs at least one 'ps' task" in capsys.readouterr().err
    assert not run_dir.exists()
    monkeypatch.delenv("TF_CONFIG")
    assert main(["fit", str(path), "--job-name", "worker", "--task-index", "3",
                 "--ps-hosts", "h:1", "--worker-hosts", "h:2"]) == EXIT_BAD_INPUT
    assert "index out of range for 'worker'" in capsys.readouterr().err

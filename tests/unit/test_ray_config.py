"""``cluster.kind: ray`` without starting Ray: recipe fields, placement checks, error unwrapping,
and the run-directory lock handed to workers that are not the launcher's descendants."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kerasdist.config import validate_recipe
from kerasdist.errors import ClusterError, DataError, RecipeError, RunDirError
from kerasdist.launch.clusters import ray as ray_kind
from kerasdist.launch.plan import worker_recipe
from kerasdist.training import rundir_lock

RAY = {"strategy": {"kind": "multi_worker"}, "cluster": {"kind": "ray", "workers": 2}}


def test_ray_cluster_fields_and_defaults():
    recipe = validate_recipe({**RAY, "cluster": {**RAY["cluster"], "address": "auto",
                                                 "gpus_per_worker": 0.5}})
    placement = ray_kind.RayPlacement.of(recipe)
    assert (placement.workers, placement.cpus, placement.gpus, placement.address) == (2, 1.0, 0.5,
                                                                                     "auto")
    data = worker_recipe(recipe)
    assert data["cluster"]["kind"] == "tf_config" and "address" not in data["cluster"]
    validate_recipe(data)  # what each worker validates again


def test_address_is_refused_outside_ray():
    with pytest.raises(RecipeError, match=r"cluster.address is not a field of cluster.kind "
                                          r"'local'; it belongs to 'ray'.*kind='local', "
                                          r"address='auto'"):
        validate_recipe({"strategy": {"kind": "multi_worker"},
                         "cluster": {"kind": "local", "workers": 2, "address": "auto"}})


@pytest.mark.parametrize("field,value", [("cpus_per_worker", 0), ("gpus_per_worker", -1),
                                         ("workers", 0)])
def test_bad_ray_resources_name_the_field(field, value):
    with pytest.raises(RecipeError, match=field):
        validate_recipe({**RAY, "cluster": {**RAY["cluster"], field: value}})


def test_parameter_server_on_ray_names_the_reason():
    with pytest.raises(RecipeError, match=r"cannot run on cluster.kind 'ray': Ray Train's "
                                          r"TensorFlow backend .* Received: kind='ray'"):
        validate_recipe({"strategy": {"kind": "parameter_server"}, "cluster": {"kind": "ray"}})


class _FakeRay:
    def __init__(self, *nodes):
        self._nodes = [{"Alive": True, "Resources": n} for n in nodes]

    def nodes(self):
        return self._nodes + [{"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]


def test_placement_counts_whole_workers_per_live_node():
    two_nodes = _FakeRay({"CPU": 3.0, "GPU": 1.0}, {"CPU": 2.0})
    ray_kind._check_fits(two_nodes, ray_kind.RayPlacement(workers=5, cpus=1.0))
    with pytest.raises(ClusterError, match=r"can place 2 worker\(s\) of 2 CPU and 0 GPU each "
                                           r"\(2 node\(s\), 5 CPU and 1 GPU in all\).*workers=3"):
        ray_kind._check_fits(two_nodes, ray_kind.RayPlacement(workers=3, cpus=2.0))
    with pytest.raises(ClusterError, match=r"can place 1 worker\(s\).*gpus_per_worker=1"):
        ray_kind._check_fits(two_nodes, ray_kind.RayPlacement(workers=2, cpus=1.0, gpus=1.0))


def test_workers_own_kerasdist_error_is_found_inside_rays_wrapping():
    class WorkerGroupError(RuntimeError):
        def __init__(self):
            super().__init__("training failed")
            self.worker_failures = {1: RuntimeError("peer lost"), 0: DataError("label 11 >= 10")}

    try:
        try:
            raise WorkerGroupError()
        except WorkerGroupError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as err:
        found = ray_kind._own_error(err)
    assert isinstance(found, DataError) and "label 11" in str(found)
    assert ray_kind._own_error(RuntimeError("nothing of ours")) is None


@pytest.mark.parametrize("address", ["nonsense", "host:", ":80", "host:port"])
def test_malformed_address_is_refused(address):
    with pytest.raises(ClusterError, match="cluster.address must be 'auto' or HOST:PORT"):
        ray_kind.check_address(address)


def test_lock_token_lets_a_non_descendant_task_run_under_the_lock(tmp_path, monkeypatch):
    """The holder is a child of this test process, so this process is not its descendant: only
    the token (what Ray workers get) makes it run under the lock."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from kerasdist.training.rundir_lock import RunDirLock
        with RunDirLock(Path({str(tmp_path)!r})) as lock:
            print(lock.token, flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        token = holder.stdout.readline().strip()
        assert rundir_lock.lock_token(tmp_path) == token and len(token) == 32
        monkeypatch.delenv(rundir_lock.LOCK_TOKEN_ENV, raising=False)
        with pytest.raises(RunDirError, match="is in use by another run"):
            rundir_lock.RunDirLock(tmp_path).__enter__()
        monkeypatch.setenv(rundir_lock.LOCK_TOKEN_ENV, "0" * 32)
        with pytest.raises(RunDirError, match="is in use by another run"):
            rundir_lock.RunDirLock(tmp_path).__enter__()
        monkeypatch.setenv(rundir_lock.LOCK_TOKEN_ENV, token)
        with rundir_lock.RunDirLock(tmp_path) as lock:
            assert lock.inherited and lock.token == token
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert not (tmp_path / rundir_lock.LOCK_NAME).exists()  # released by its holder, nothing left


def test_bench_ray_row_is_the_multi_worker_row_on_ray(tmp_path):
    from kerasdist.bench.runner import STRATEGIES, strategy_recipe

    raw = {"strategy": {"kind": "default"}, "cluster": {"kind": "this_process"},
           "data": {"batch_size": 64}}
    mw, on_ray = (validate_recipe(strategy_recipe(raw, row, workers=2, run_dir=tmp_path / row))
                  for row in ("multi_worker", "ray"))
    assert "ray" in STRATEGIES
    assert on_ray.strategy == mw.strategy and on_ray.cluster.workers == mw.cluster.workers == 2
    assert (mw.cluster.kind, on_ray.cluster.kind) == ("local", "ray")



class _RecordingRay(_FakeRay):
    LoggingConfig = staticmethod(lambda **kw: kw)

    def __init__(self):
        super().__init__({"CPU": 4.0})
        self.init_kwargs = None

    def init(self, **kwargs):
        self.init_kwargs = kwargs

    def shutdown(self):
        pass


def test_a_local_ray_is_started_even_where_another_cluster_is_advertised(monkeypatch):
    """CI regression: with no address, ray.init joins the cluster RAY_ADDRESS or a `ray start`'s
    /tmp/ray/ray_current_cluster names and then refuses num_cpus. The address kerasdist passes
    must make Ray's own address resolution start a local instance whatever is advertised."""
    monkeypatch.setenv("RAY_CLIENT_MODE", "0")  # what importing Ray sets; undone after the test
    pytest.importorskip("ray")
    from ray._private.services import canonicalize_bootstrap_address

    fake = _RecordingRay()
    monkeypatch.setattr(ray_kind, "require_ray", lambda: fake)
    with ray_kind.ray_session(ray_kind.RayPlacement(workers=2)):
        pass
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert canonicalize_bootstrap_address(fake.init_kwargs.get("address")) is None
    assert fake.init_kwargs["num_cpus"] >= 2


def test_an_elastic_ray_recipe_needs_every_worker_count_to_divide_the_global_batch(monkeypatch):
    """cluster.min_workers on Ray is Ray Train's ScalingConfig(num_workers=(min, max)); Ray may run
    any count in between, so each must divide the global batch (refused before anything starts);
    the workers run the recipe as a plain tf_config task."""
    monkeypatch.setenv("RAY_CLIENT_MODE", "0")  # what importing Ray sets; undone after the test
    pytest.importorskip("ray.train")

    def ray_recipe(batch, **cluster):
        return validate_recipe({**RAY, "data": {"batch_size": batch},
                                "cluster": {"kind": "ray", **cluster}})

    elastic = ray_recipe(96, workers=3, min_workers=2, resize_check_s=10)
    ray_kind.check_elastic(elastic)
    placement = ray_kind.RayPlacement.of(elastic)
    assert placement.num_workers == (2, 3) and placement.resize_check_s == 10
    assert ray_kind.RayPlacement.of(ray_recipe(64, workers=2)).num_workers == 2
    assert ray_kind.RayPlacement.of(ray_recipe(64, workers=2, min_workers=2)).num_workers == 2
    data = worker_recipe(elastic)
    assert "min_workers" not in data["cluster"]
    validate_recipe(data)  # what each worker validates again (min_workers refused on tf_config)
    ray_kind.check_elastic(ray_recipe(64, workers=3))  # fixed: 3 replicas checked at start-up
    with pytest.raises(RecipeError, match=r"cluster.min_workers=2, workers=3: Ray may run the "
                                          r"group with 3 workers.*batch_size=64"):
        ray_kind.check_elastic(ray_recipe(64, workers=3, min_workers=2))
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "0")
    with pytest.raises(ClusterError, match=r"needs Ray Train V2.*RAY_TRAIN_V2_ENABLED='0'"):
        ray_kind.check_elastic(elastic)


def test_launch_ray_workers_min_max_is_rays_elastic_group_and_dry_run_shows_it(tmp_path, capsys):
    """``launch --ray --workers 1:3``: Ray Train's ScalingConfig(num_workers=(1, 3)) with the
    resize interval; ``--dry-run`` prints it and starts, connects to and writes nothing."""
    from kerasdist.cli import main

    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(3)\n")
    logs = tmp_path / "logs"
    assert main(["launch", "--ray", "--workers", "1:3", "--resize-check-s", "7.5",
                 "--max-restarts", "2", "--ray-address", "127.0.0.1:1", "--log-dir", str(logs),
                 "--dry-run", str(script), "--epochs", "4"]) == 0
    out = capsys.readouterr().out
    assert "elastic: 1 to 3 workers" in out
    assert "ScalingConfig(num_workers=(1, 3), elastic_resize_monitor_interval_s=7.5" in out
    assert "FailureConfig(max_failures=2)" in out and "127.0.0.1:1" in out
    assert f"{script.resolve()} --epochs 4" in out
    assert main(["launch", "--ray", "--workers", "2", "--log-dir", str(logs), "--dry-run",
                 str(script)]) == 0
    out = capsys.readouterr().out
    assert "2 worker(s), fixed" in out and "ScalingConfig(num_workers=2," in out
    assert "elastic" not in out and not logs.exists()
    placement = ray_kind.RayPlacement(workers=3, min_workers=1, resize_check_s=7.5)
    assert placement.num_workers == (1, 3)
    assert ray_kind.RayPlacement(workers=2, min_workers=None).num_workers == 2


@pytest.mark.parametrize("flags,named", [
    (["--workers", "2:1"], "--workers '2:1'"), (["--workers", "0:2"], "--workers '0:2'"),
    (["--workers", "1:x"], "--workers '1:x'"), (["--workers", "1:"], "--workers '1:'"),
    (["--workers", "0"], "--workers '0'"),
    (["--workers", "1:2", "--resize-check-s", "0"], "--resize-check-s 0"),
    (["--workers", "1:2", "--resize-check-s", "nan"], "--resize-check-s nan"),
    (["--workers", "1:2", "--cpus-per-worker", "0"], "--cpus-per-worker 0"),
    (["--workers", "1:2", "--max-restarts", "-1"], "--max-restarts -1")])
@pytest.mark.parametrize("dry_run", [True, False])
def test_launch_ray_bad_worker_range_exits_2_naming_flag_and_value_before_anything(
        tmp_path, capsys, monkeypatch, flags, named, dry_run):
    from kerasdist.cli import EXIT_BAD_INPUT, main

    def started(*args, **kwargs):
        raise AssertionError("Ray was started or joined")

    monkeypatch.setattr(ray_kind, "ray_session", started)
    monkeypatch.setattr(ray_kind, "launch_script", started)
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(3)\n")
    logs = tmp_path / "logs"
    assert main(["launch", "--ray", *flags, "--log-dir", str(logs), *(["--dry-run"] * dry_run),
                 str(script)]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert named in captured.err and not captured.out
    assert not logs.exists()


def test_launch_ray_workers_min_max_without_ray_train_v2_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAY_CLIENT_MODE", "0")  # what importing Ray sets; undone after the test
    pytest.importorskip("ray.train")
    from kerasdist.cli import EXIT_BAD_INPUT, main

    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "0")
    monkeypatch.setattr(ray_kind, "ray_session", None)  # never reached
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(3)\n")
    assert main(["launch", "--ray", "--workers", "1:2", "--log-dir", str(tmp_path / "logs"),
                 str(script)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--workers MIN:MAX on Ray needs Ray Train V2" in err
    assert "RAY_TRAIN_V2_ENABLED='0'" in err and "--workers 1:2" in err
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("value, refused", [(None, False), ("1", False), ("TRUE", False),
                                            ("0", True), ("false", True), ("off", True)])
def test_the_v2_switch_is_read_as_ray_reads_it(monkeypatch, value, refused):
    """``RAY_TRAIN_V2_ENABLED`` as Ray 2.60 reads it (its private ``is_v2_enabled``, not imported
    by kerasdist): unset, '1' or 'true' keep V2 on; anything else selects V1 (no elastic group)."""
    pytest.importorskip("ray")
    from ray.train.v2._internal.constants import is_v2_enabled

    if value is None:
        monkeypatch.delenv("RAY_TRAIN_V2_ENABLED", raising=False)
    else:
        monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", value)
    assert is_v2_enabled() is not refused  # kerasdist's reading agrees with Ray's
    placement = ray_kind.RayPlacement(workers=2, min_workers=1)
    if refused:
        with pytest.raises(ClusterError, match="needs Ray Train V2"):
            ray_kind.check_elastic_v2(placement, flag="--workers 1:2")
    else:
        ray_kind.check_elastic_v2(placement, flag="--workers 1:2")

"""``kerasdist bench``: the same model, data and global batch under each strategy and baseline.

Every run is a separate process tree (``python -m kerasdist fit ...`` for strategies, the baseline
modules for baselines) so runs never share TensorFlow state; a sampler thread sums the RSS of all
processes of the tree every 0.2 s to give the peak memory of all tasks.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerasdist.errors import RecipeError

STRATEGIES = ("default", "default_stream", "mirrored", "multi_worker", "multi_worker_bf16",
              "parameter_server", "legacy", "ray")
BASELINES = ("plain_keras", "raw_step", "tf_keras", "keras_enable")
CLUSTER_STRATEGIES = ("multi_worker", "parameter_server")
ROW_OPTIONS = {"mirrored": {"logical_cpus": 2}, "multi_worker_bf16": {"gradient_compression": "bf16"}}
"""Strategy settings of a bench row beyond its kind (mirrored: 2 logical CPUs on a CPU host;
multi_worker_bf16: gradients all-reduced in bfloat16)."""
ROW_CLUSTERS = {"ray": ("multi_worker", "ray"), "multi_worker_bf16": ("multi_worker", "local"),
                "default_stream": ("default", "local")}
"""Rows that are not named after their strategy kind: row -> (strategy kind, cluster.kind). The
``ray`` row is multi_worker on a local Ray (``pip install 'kerasdist[ray]'``);
``multi_worker_bf16`` is the multi_worker row with 16-bit all-reduce (the "best settings" target
of :mod:`kerasdist.bench.targets` reads it); ``default_stream`` is the default row with its data
read from TFRecord files as a stream (:func:`kerasdist.bench.command.stream_data`: the same
examples, written by the bench before the rows run) instead of whole into memory."""


@dataclass
class Measurement:
    """One run: its figures (from metrics.json or the baseline's JSON) plus process-tree memory."""

    name: str
    returncode: int
    wall_time_s: float
    peak_rss_mb: float
    figures: dict[str, Any] = field(default_factory=dict)
    log: str = ""


class _RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self):
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            total = 0
            try:
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        total += proc.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                break
            self.peak = max(self.peak, total)
            self.stop.wait(0.2)


def run_measured(name: str, argv: list[str], *, log_path: Path, timeout_s: float,
                 env: dict | None = None) -> tuple[int, float, float]:
    """Run ``argv``; return (returncode, wall seconds, peak RSS of its process tree in MiB)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                env=env or dict(os.environ), start_new_session=True)
        sampler = _RssSampler(proc.pid)
        sampler.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            code = proc.wait()
        finally:
            sampler.stop.set()
            sampler.join()
    return code, time.perf_counter() - start, sampler.peak / 2**20


def run_json_job(tag: str, argv: list[str], out: Path, *, timeout_s, env=None) -> Measurement:
    """Run ``argv`` with the path of its result file ``<out>/results/<tag>.json`` appended, its
    output in ``<out>/logs/<tag>.log``; the figures are that file's JSON (empty when the run
    failed or wrote none)."""
    result = out / "results" / f"{tag}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    log = out / "logs" / f"{tag}.log"
    code, wall, rss = run_measured(tag, [*argv, str(result)], log_path=log, timeout_s=timeout_s,
                                   env=env)
    figures = json.loads(result.read_text()) if code == 0 and result.exists() else {}
    return Measurement(tag, code, wall, rss, figures, str(log))


def write_result(result: dict | None, out_path: str) -> int:
    """A bench job's end: ``result`` written as JSON to ``out_path`` (nothing for None: a task
    other than the chief); returns the exit code 0."""
    if result is not None:
        Path(out_path).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


def is_coordinator(kind: str) -> bool:
    """Whether the strategy kind runs a coordinator with ps tasks (from its declared traits)."""
    from kerasdist.config.schema import strategy_config_classes

    return strategy_config_classes()[kind].traits.topology == "coordinator"


def strategy_recipe(raw: dict, strategy: str, *, workers: int, run_dir: Path) -> dict:
    """The recipe mapping for one strategy row (same model, data, global batch)."""
    from kerasdist.config.cluster_configs import cluster_config_classes
    from kerasdist.config.schema import strategy_config_classes

    data = json.loads(json.dumps(raw))
    kind, cluster_kind = ROW_CLUSTERS.get(strategy, (strategy, "local"))
    data["strategy"] = {"kind": kind, **ROW_OPTIONS.get(strategy, {})}
    traits = strategy_config_classes()[kind].traits
    if traits.topology == "single":
        data["cluster"] = {"kind": "this_process"}
        data["data"] = {**data.get("data", {}), "auto_shard": "auto"}  # one pipeline: no sharding
    else:
        fields = cluster_config_classes()[cluster_kind].model_fields
        cluster = {k: v for k, v in data.get("cluster", {}).items() if k in fields}
        data["cluster"] = {**cluster, "kind": cluster_kind, "workers": workers,
                           **({"ps": 1} if traits.needs_ps else {})}
    data["output"] = {**data.get("output", {}), "run_dir": str(run_dir)}
    data["trainer"] = {**data.get("trainer", {}), "verbose": 0}
    return data


def _figures_from_metrics(path: Path) -> dict[str, Any]:
    metrics = json.loads(path.read_text(encoding="utf-8"))
    history = metrics.get("history", {})
    return {"throughput": metrics.get("throughput", {}),
            "val_accuracy": history.get("val_accuracy", []),
            "val_loss": history.get("val_loss", []),
            "final_accuracy": metrics.get("evaluation", {}).get("accuracy"),
            "staleness": _staleness(metrics.get("parameter_server")),
            "ps": metrics.get("parameter_server")}


def _staleness(ps: dict | None) -> dict | None:
    """Parameter-server staleness (updates applied by others between a step's read of the
    variables and its own update), mean and max over the run; None for other strategies."""
    if not ps or "staleness_mean" not in ps:
        return None
    return {"mean": ps["staleness_mean"], "max": ps.get("staleness_max")}


def time_to_target(figures: dict[str, Any], target: float) -> float | None:
    """Seconds from the start of training to the end of the first epoch with held-out accuracy
    >= ``target``; None if never reached."""
    ends = figures.get("throughput", {}).get("epoch_end_s", [])
    for accuracy, end in zip(figures.get("val_accuracy", []), ends, strict=False):
        if accuracy >= target:
            return end
    return None


def validate_names(strategies: list[str], baselines: list[str]) -> None:
    """Raises RecipeError for unknown strategy/baseline names (listing the known ones)."""
    for flag, what, names, known in (("--strategies", "strategy", strategies, STRATEGIES),
                                     ("--baselines", "baseline", baselines, BASELINES)):
        for name in names:
            if name not in known:
                raise RecipeError(f"{flag}: unknown {what} '{name}'. Available: {', '.join(known)}")


def summarize(rows: list[Measurement], target: float) -> dict[str, Any]:
    """Median and spread over the repeats of one row."""
    ok = [r for r in rows if r.returncode == 0 and r.figures]
    rates = [r.figures["throughput"].get("examples_per_sec", 0.0) for r in ok]
    ttas = [t for t in (time_to_target(r.figures, target) for r in ok) if t is not None]
    accs = [r.figures.get("final_accuracy") for r in ok if r.figures.get("final_accuracy")]
    stale = [r.figures["staleness"] for r in ok if r.figures.get("staleness")]
    epoch_level = [rate for rate in (_epoch_level_rate(r.figures) for r in ok) if rate]
    return {
        "runs": len(rows), "succeeded": len(ok),
        "examples_per_sec_median": statistics.median(rates) if rates else None,
        "examples_per_sec_min": min(rates) if rates else None,
        "examples_per_sec_max": max(rates) if rates else None,
        "examples_per_sec_epoch_level_median": statistics.median(epoch_level) if epoch_level else None,
        "time_to_target_s_median": statistics.median(ttas) if ttas else None,
        "reached_target": f"{len(ttas)}/{len(ok)}",
        "final_accuracy_median": statistics.median(accs) if accs else None,
        "peak_rss_mb_median": statistics.median([r.peak_rss_mb for r in rows]) if rows else None,
        "staleness": stale[0] if stale else None,
    }


def _epoch_level_rate(figures: dict[str, Any]) -> float | None:
    """examples/s over whole epochs 2..n where the row has it: kerasdist's parameter-server runs
    record it beside the per-step figure; tf_keras's PS baseline has only this one."""
    throughput = figures.get("throughput", {})
    if throughput.get("timed_epochs"):
        return throughput.get("examples_per_sec")
    return (figures.get("ps") or {}).get("whole_epoch_examples_per_sec")


def environment() -> dict[str, Any]:
    """Versions, CPU count and devices of this machine (imports TensorFlow)."""
    import keras
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": keras.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "processor": platform.processor(),
            "devices": [d.name for d in tf.config.list_physical_devices()],
            "note": "all tasks of a cluster run on this one machine and share its CPU cores"}


def python() -> str:
    return sys.executable

"""Helpers of the multi-worker (MWMS) multiprocess tests: launch ``kerasdist fit``, watch, clean up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import yaml

REPO = Path(__file__).parents[2]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def linear_recipe(tmp_path: Path, name: str, **sections) -> Path:
    """recipes/linear_mwms.yaml made small and deterministic (2048 examples, 64 steps/epoch x 2,
    backups every 10 steps, 20 s collective timeout); ``sections`` update it section by section.
    With ``KERASDIST_TEST_EXPOSED=1`` in the environment (and ``KERASDIST_NO_NETNS=1``), the
    cluster runs exposed, its launcher in the command's process: the tests then exercise the
    forked tasks of :mod:`kerasdist.launch.forking`."""
    raw = yaml.safe_load((REPO / "recipes" / "linear_mwms.yaml").read_text())
    raw["data"].update(shuffle_seed=7)
    raw["data"]["source"]["num_examples"] = 2048
    raw["optimizer"].update(learning_rate=0.02, momentum=0.9)
    raw["strategy"]["timeout_s"] = 20
    raw["cluster"].update(max_restarts=1, threads_per_task=1)
    raw["trainer"].update(epochs=2, deterministic=True, checkpoint={"every_steps": 10})
    raw["output"] = {"run_dir": str(tmp_path / name), "tensorboard": False}
    if os.environ.get("KERASDIST_TEST_EXPOSED") == "1":
        raw["cluster"]["allow_network_exposure"] = True
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def bad_label_recipe(tmp_path: Path, name: str, **cluster) -> Path:
    """The MNIST CNN on 512 random digits (``bad.npz``) whose train label 7 is 12, out of range
    for its 10 classes: a recipe the checks refuse (exit 2) before any task starts."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (512, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, 512).astype(np.int64)
    y[7] = 12
    data = tmp_path / "bad.npz"
    np.savez(data, x_train=x, y_train=y, x_test=x[:64], y_test=y[:64] % 10)
    return linear_recipe(
        tmp_path, name, model={"name": "mnist_cnn", "params": {}},
        data={"source": {"kind": "npz", "path": str(data)}, "train_split": "train",
              "eval_split": "test", "batch_size": 64, "shuffle_buffer": 0},
        optimizer={"name": "adam", "learning_rate": 0.001, "momentum": 0.0},
        cluster={"max_restarts": 2, **cluster})


def launch(recipe: Path, *args: str) -> subprocess.Popen:
    """Start ``python -m kerasdist fit recipe`` (the local launcher) with output captured."""
    return subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", str(recipe), *args],
                            cwd=REPO, env=dict(os.environ, **QUIET), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, timeout_s: float) -> str:
    """Wait for ``process``; return its output. Kills its whole tree on timeout (then raises)."""
    try:
        out, _ = process.communicate(timeout=timeout_s)
        return out
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        out, _ = process.communicate()
        raise AssertionError(f"kerasdist fit did not finish in {timeout_s} s:\n{out[-6000:]}") from None


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (a test's last resort; never leaves processes)."""
    try:
        parent = psutil.Process(pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def task_process(launcher_pid: int, name: str) -> psutil.Process | None:
    """The process of the launcher's tree that runs task ``name`` (``'worker:1'``) now, found by
    the log its standard output goes to (:func:`kerasdist._task_logs.local_task`: a
    started and a forked task alike); None if none does."""
    from kerasdist._task_logs import local_task

    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        found = local_task(child.pid)
        if found is None or found[1] != name:
            continue
        try:
            parent = local_task(child.ppid())
        except psutil.Error:
            continue
        if parent is None or parent[1] != name:  # the task itself, not a process it started
            return child
    return None


def worker_process(launcher_pid: int, index: int, timeout_s: float = 60) -> psutil.Process:
    """The launcher's child process that runs ``worker:index`` (:func:`task_process`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = task_process(launcher_pid, f"worker:{index}")
        if found is not None:
            return found
        time.sleep(0.1)
    raise AssertionError(f"worker:{index} of launcher {launcher_pid} not found")


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Global steps of the chief's complete checkpoints."""
    return sorted(int(m.group(1)) for p in (run_dir / "checkpoints").glob("ckpt-*.index")
                  if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name)))


def wait_for_checkpoint(run_dir: Path, process: subprocess.Popen, *, min_step: int,
                        timeout_s: float) -> int:
    """Wait until the chief has a checkpoint at step >= ``min_step``; return that step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        steps = [s for s in checkpoint_steps(run_dir) if s >= min_step]
        if steps:
            return steps[0]
        if process.poll() is not None:
            raise AssertionError(f"launcher exited early:\n{process.stdout.read()[-6000:]}")
        time.sleep(0.05)
    kill_tree(process.pid)
    raise AssertionError(f"no checkpoint at step >= {min_step} within {timeout_s} s")


def epoch_digests(log: Path) -> dict[int, str]:
    """``{epoch: weights sha256}`` from a worker log's ``kerasdist: epoch E step S weights`` lines."""
    text = log.read_text(encoding="utf-8", errors="replace")
    pattern = r"kerasdist(?:\[[\w:]+\])?: epoch (\d+) step \d+ weights sha256 (\w+)"
    return {int(e): h for e, h in re.findall(pattern, text)}


def final_weights(run_dir: Path) -> list[np.ndarray]:
    import keras

    model = keras.saving.load_model(run_dir / "model.keras", compile=False)
    return [np.asarray(w) for w in model.get_weights()]


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def no_processes_left(pids) -> bool:
    """True when none of ``pids`` is alive (zombies count as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def sigterm(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGTERM)


def _saving(folder: Path) -> str | None:
    """The name of a checkpoint being written in ``folder`` right now: TF writes a save into a
    ``<prefix>_temp`` folder and merges it into ``<prefix>.index`` + data when complete."""
    try:
        names = {entry.name for entry in os.scandir(folder)}
    except OSError:
        return None
    for name in names:
        prefix, sep, _ = name.partition("_temp")
        if sep and f"{prefix}.index" not in names:
            return prefix
    return None


def kill_mid_save(process: subprocess.Popen, victim: psutil.Process, folder: Path, *,
                  min_step: int = 0, timeout_s: float = 180) -> str:
    """SIGKILL ``victim`` while it is writing a checkpoint into ``folder``; return its prefix.

    Polls ``folder`` for a save in progress (a ``*_temp`` folder without its ``.index``); then
    freezes ``victim`` (SIGSTOP), checks that the save is still unfinished, and SIGKILLs it; a save
    that finished in between is let go (SIGCONT) and the next one is tried. ``min_step``: only
    saves numbered ``ckpt-N`` with N >= min_step (a non-chief's scratch save is named ``ckpt``).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        prefix = _saving(folder)
        number = prefix.rpartition("-")[2] if prefix else ""
        if prefix and (not number.isdigit() or int(number) >= min_step):
            victim.suspend()
            while victim.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                time.sleep(0.001)
            if _saving(folder) == prefix:
                victim.kill()
                victim.wait(30)
                return prefix
            victim.resume()
        if process.poll() is not None:
            raise AssertionError(f"launcher exited early:\n{process.stdout.read()[-6000:]}")
        time.sleep(0.002)
    kill_tree(process.pid)
    raise AssertionError(f"no save caught in progress in {folder} within {timeout_s} s")


def evaluate_single_process(run_dir: Path, recipe: Path) -> dict[str, float]:
    """Plain Keras in this process: ``model.keras`` of ``run_dir`` evaluated on the recipe's
    evaluation split (every example once, one process, no strategy)."""
    import keras

    from kerasdist import load_recipe
    from kerasdist.data import load_split

    config = load_recipe(recipe).data
    x, y = load_split(config, config.eval_split)
    model = keras.saving.load_model(run_dir / "model.keras")
    logs = model.evaluate(x, y, batch_size=config.batch_size, verbose=0, return_dict=True)
    return {key: float(value) for key, value in logs.items()}

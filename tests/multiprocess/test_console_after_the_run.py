"""The console of a successful parameter-server run ends with its last line (kerasdist's run
summary, or the script's own) on clusters whose tasks someone else starts: each task a
``kerasdist`` process with its own TF_CONFIG (``cluster.kind: tf_config``, as JobSet pods and
Slurm steps start them; ``kerasdist launch --this-task``), its output a file as in a scheduler's
log. No TensorFlow error or warning line follows it (the real Slurm's:
test_slurm_real.py::test_a_parameter_server_job_ends_when_its_chief_ends)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import mwms_support as mw
import pytest
import yaml

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TASKS = [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
NATIVE = re.compile(r"^[EW]\d{4} ", re.M)

# A tutorial-style script run by the chief (top-level code: its functions live until the
# interpreter ends). Its last act asks the test to stop the ps and worker servers and waits until
# they are gone, as a scheduler releases them when the chief is done (Slurm: release_servers).
SCRIPT = """\
import pathlib, sys, time
import keras, numpy as np, tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
x = np.random.default_rng(0).random((512, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)

def dataset_fn(context):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(dataset_fn, epochs=2, steps_per_epoch=10, verbose=2)
print("the script trained", flush=True)
release, released = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
release.touch()
deadline = time.monotonic() + 120
while not released.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print("the script ends", flush=True)
"""


def _start_as_a_scheduler(tmp_path: Path, argv: list[str]) -> dict[str, str]:
    """Run chief, ps and two workers as ``python -m kerasdist ARGV`` with their own TF_CONFIG in a
    private network namespace; stop the servers once the chief ends, or once it asks (a file
    ``release``: then write ``released``). Returns each task's output (stdout and stderr)."""
    from kerasdist.cluster.spec import local_cluster
    from kerasdist.launch.isolation import isolated_argv, unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"needs a private network namespace for its servers: {unavailable_reason()}")
    spec = local_cluster(workers=2, ps=1, chief=True)
    configs = [spec.for_task(kind, index).to_json() for kind, index in TASKS]
    outs = [str(tmp_path / f"{kind}-{index}.out") for kind, index in TASKS]
    driver = textwrap.dedent(f"""
        import os, pathlib, subprocess, sys, time
        env = {{k: v for k, v in os.environ.items()
               if k not in ("KERASDIST_STATUS_FILE", "TF_CPP_MIN_LOG_LEVEL", "KERASDIST_RAW_STDERR")}}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, "-m", "kerasdist", *{argv!r}],
                                  env={{**env, "TF_CONFIG": c}}, stdout=open(out, "w"),
                                  stderr=subprocess.STDOUT)
                 for c, out in zip({configs!r}, {outs!r})]
        release = pathlib.Path({str(tmp_path / "release")!r})
        deadline = time.monotonic() + 400
        while procs[0].poll() is None and not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        for server in procs[1:]:
            server.terminate()
            server.wait(timeout=60)
        release.with_name("released").touch()
        sys.exit(procs[0].wait(timeout=max(1, deadline - time.monotonic())))
    """)
    done = subprocess.run(isolated_argv([sys.executable, "-c", driver]), capture_output=True,
                          text=True, timeout=480, cwd=tmp_path)
    outputs = {f"{kind}:{index}": Path(out).read_text(errors="replace")
               for (kind, index), out in zip(TASKS, outs, strict=True)}
    assert done.returncode == 0, "\n".join(f"== {k}\n{v[-3000:]}" for k, v in outputs.items()) \
        + done.stderr[-2000:]
    return outputs


@pytest.mark.timeout(600)
def test_a_tf_config_parameter_server_chiefs_console_ends_with_the_summary(tmp_path):
    raw = yaml.safe_load((mw.REPO / "recipes" / "mnist_cnn_ps.yaml").read_text())
    raw["cluster"] = {"kind": "tf_config", "threads_per_task": 1}
    raw["trainer"].update(epochs=1, steps_per_epoch=20)
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    recipe = tmp_path / "ps.yaml"
    recipe.write_text(yaml.safe_dump(raw), encoding="utf-8")
    outputs = _start_as_a_scheduler(tmp_path, ["fit", str(recipe)])
    chief = outputs["chief:0"]
    assert chief.rstrip("\n").splitlines()[-1] == "=" * 64, chief[-3000:]  # the summary's end
    assert "kerasdist run summary" in chief, chief[-3000:]
    for task, out in outputs.items():
        assert not NATIVE.findall(out), f"{task}:\n{out[-3000:]}"


@pytest.mark.timeout(600)
def test_launch_this_task_chiefs_console_ends_with_the_scripts_last_line(tmp_path):
    """The chief's servers leave before it ends (its script waits for that): the functions it
    releases at its end then fail to reach them. Before, that wrote a flood of "E0000 ...
    context.cc:...] Failed to remove function remotely" blocks after the script's last line."""
    script = tmp_path / "ps_script.py"
    script.write_text(SCRIPT, encoding="utf-8")
    outputs = _start_as_a_scheduler(tmp_path, ["launch", "--this-task", "--ps", "1", str(script),
                                               str(tmp_path / "release"),
                                               str(tmp_path / "released")])
    chief = outputs["chief:0"]
    assert "the script trained" in chief, chief[-3000:]
    assert chief.rstrip("\n").splitlines()[-1] == "the script ends", chief[-3000:]
    assert not NATIVE.findall(chief), chief[-3000:]

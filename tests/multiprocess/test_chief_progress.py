"""Issue 42 item 2 on a local 2-worker multi_worker cluster: the console shows the chief's
progress while it trains (Keras's one line an epoch, kerasdist's notices; Keras writes no
"Epoch 1/1" header for one epoch) without TensorFlow's start-up noise or kerasdist's
verification records (issue 51 item 3), and the summary once; ``fit --quiet`` keeps the progress
in the logs only."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import mwms_support as mw
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_the_chiefs_progress_reaches_the_console_and_quiet_keeps_it_in_the_logs(tmp_path):
    """The weights digests (per epoch, and at the end) are records: in every worker's log and,
    the chief's, in metrics.json; not on the console (before, the chief's log echoed them)."""
    recipe = mw.linear_recipe(tmp_path, "run", trainer={"epochs": 1})
    out = mw.finish(mw.launch(recipe), timeout_s=280)
    assert "64/64 - " in out and " - loss: " in out, out[-4000:]  # Keras's epoch line
    assert "kerasdist[worker:0]: training from global step 0 of 64" in out, out[-4000:]
    assert out.count("kerasdist run summary") == 1, out[-4000:]
    assert "oneDNN" not in out and "cudart_stub" not in out, out[-4000:]
    assert "[worker:1]" not in out and "kerasdist[worker:1]" not in out  # one task speaks
    assert "weights sha256" not in out, out[-4000:]
    logs = tmp_path / "run" / "logs"
    digests = [mw.epoch_digests(logs / f"worker-{i}.log") for i in range(2)]
    assert list(digests[0]) == [1] and digests[0] == digests[1], digests
    assert mw.metrics(tmp_path / "run")["epoch_weights_sha256"] == [
        {"epoch": 1, "step": 64, "sha256": digests[0][1]}]
    assert "done at global step 64; weights sha256" in (logs / "worker-1.log").read_text()
    quiet = mw.finish(mw.launch(recipe, "--quiet", "--set", "trainer.epochs=2"), timeout_s=280)
    assert "Epoch 2/2" not in quiet and "kerasdist run summary" in quiet, quiet[-4000:]
    assert "Epoch 2/2" in (tmp_path / "run" / "logs" / "worker-0.log").read_text()


def test_on_a_console_the_tasks_share_only_the_chief_shows_its_progress(tmp_path):
    """Issue 42 item 2 beyond local clusters: two ``kerasdist fit`` tasks started as a scheduler
    starts them (their own TF_CONFIG; a Slurm step, pods, ``--this-task`` terminals), each
    stdout a file as in a Slurm output file. The chief writes one line an epoch (no progress-bar
    backspaces or colour codes in a file); worker 1 writes no progress of its own (before: both
    wrote Keras's bar, unprefixed)."""
    from kerasdist.cluster.spec import local_cluster
    from kerasdist.launch.isolation import isolated_argv, unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"needs a private network namespace for its servers: {unavailable_reason()}")
    recipe = mw.linear_recipe(tmp_path, "run", trainer={"epochs": 2},
                              cluster={"kind": "tf_config"})
    spec = local_cluster(workers=2)
    outs = [tmp_path / f"worker-{i}.out" for i in range(2)]
    driver = textwrap.dedent(f"""
        import os, subprocess, sys
        env = {{k: v for k, v in os.environ.items() if k != "KERASDIST_STATUS_FILE"}}
        procs = [subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", {str(recipe)!r}],
                                  env={{**env, **{mw.QUIET!r}, "TF_CONFIG": c}},
                                  stdout=open(out, "w"), stderr=subprocess.STDOUT)
                 for c, out in zip({[spec.for_task("worker", i).to_json() for i in range(2)]!r},
                                   {[str(out) for out in outs]!r})]
        sys.exit(max(p.wait(timeout=260) for p in procs))
    """)
    done = subprocess.run(isolated_argv([sys.executable, "-c", driver]), capture_output=True,
                          text=True, timeout=290, cwd=mw.REPO)
    chief, other = (out.read_text() for out in outs)
    assert done.returncode == 0, chief[-3000:] + other[-3000:] + done.stderr[-2000:]
    assert chief.count("64/64 - ") == 2 and "\x08" not in chief and "\x1b[" not in chief, chief[-3000:]
    assert "kerasdist run summary" in chief, chief[-3000:]
    assert "64/64" not in other and "Epoch" not in other and "\x08" not in other, other[-3000:]
    assert "weights sha256" not in chief + other, chief[-3000:]  # records: metrics.json
    assert [r["epoch"] for r in mw.metrics(tmp_path / "run")["epoch_weights_sha256"]] == [1, 2]

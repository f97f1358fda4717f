"""The closing paragraph of a failed run (kerasdist.launch.explain) and the failure classes it
reads: a transient TensorFlow RPC error is a lost peer (retryable), a deterministic error is not;
the task, the resume step and the logs are named; no traceback without --debug (issue 39)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from kerasdist.errors import FATAL, PEER_LOST, TaskFailedError, TrainingError, classify
from kerasdist.launch import status
from kerasdist.launch.explain import failed_task, latest_step, paragraph

pytestmark = pytest.mark.timeout(60)

GARBLED = ("From /job:worker/replica:0/task:1:\nUnable to parse request\n"
           "Additional GRPC error information from remote target /job:worker/replica:0/task:1 "
           "while calling /tensorflow.eager.EagerService/RunComponentFunction:\n"
           ":{\"created\":\"@1795779255.5\",\"description\":\"Error received from peer\"}")


def _checkpoints(run_dir, *steps):
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    for step in steps:
        (folder / f"ckpt-{step}.index").write_bytes(b"")
        (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"")
    (folder / "ckpt-99.index").write_bytes(b"")  # no data file: an incomplete checkpoint


def test_a_garbled_rpc_is_a_lost_peer_but_an_internal_error_of_the_computation_is_not():
    assert classify(tf.errors.InternalError(None, None, GARBLED)) == PEER_LOST
    assert classify(tf.errors.InternalError(None, None, "Blas GEMM launch failed")) == FATAL
    assert classify(tf.errors.InvalidArgumentError(None, None, "Unable to parse request")) == FATAL
    assert classify(RuntimeError("EagerService/RunComponentFunction")) == FATAL


def test_latest_step_is_the_newest_complete_checkpoint(tmp_path):
    assert latest_step(tmp_path / "checkpoints") is None
    _checkpoints(tmp_path, 20, 40)
    assert latest_step(tmp_path / "checkpoints") == 40


def test_a_transient_rpc_error_names_the_task_the_step_and_a_resuming_rerun(tmp_path):
    _checkpoints(tmp_path, 20, 40)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker-1.log").write_text("x")
    err = tf.errors.InternalError(None, None, GARBLED)
    assert failed_task(err) == "worker:1"
    text = paragraph(err, run_dir=tmp_path, max_restarts=0)
    lines = text.splitlines()
    assert lines[0] == "kerasdist: the run failed."
    assert "task worker:1, InternalError: Unable to parse request" in text
    assert "global step 40" in text and "retryable: yes" in text
    assert "re-run the same command to resume from global step 40" in text
    assert "cluster.max_restarts" in text and "worker-1.log" in text
    assert len(lines) <= 6


def test_a_deterministic_error_is_not_retryable(tmp_path):
    err = TrainingError("task worker:0 exited with code 1; not restarted: ValueError: bad")
    text = paragraph(err, run_dir=tmp_path, max_restarts=2)
    assert "task worker:0" in text and "retryable: no" in text
    assert "no checkpoint was written yet" in text and "start again from step 0" in text


def test_the_task_survives_the_namespace_childs_report():
    err = TaskFailedError("multi-worker training failed after 1 attempt(s): task worker:1 was "
                          "killed by signal SIGKILL")
    err.task, err.error = "worker:1", ""
    rebuilt = status.rebuild(status.record(err))
    assert isinstance(rebuilt, TaskFailedError) and rebuilt.task == "worker:1"
    assert "retryable: yes" in paragraph(rebuilt, run_dir=None, max_restarts=1)


def test_the_cli_prints_no_traceback_without_debug_and_one_with_it(capsys, tmp_path):
    from kerasdist.cli import _failed
    from kerasdist.launch.explain import RUN

    RUN.update(run_dir=str(tmp_path), max_restarts=1)
    try:
        try:
            raise tf.errors.InternalError(None, None, GARBLED + "\n" * 3 + "x\n" * 250)
        except tf.errors.InternalError as err:
            assert _failed(err, command="fit") == 1
            out = capsys.readouterr().err
            assert "Traceback" not in out and out.count("\n") < 20
            assert out.rstrip().splitlines()[0].startswith("kerasdist: failed: InternalError")
            assert "retryable: yes" in out.rstrip().splitlines()[-2] + out.rstrip().splitlines()[-1]
            assert _failed(err, command="fit", debug=True) == 1
            assert "Traceback" in capsys.readouterr().err
    finally:
        RUN.clear()

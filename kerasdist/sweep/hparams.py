"""A sweep's COMPLETE trials in TensorBoard's HParams view: ``<output.dir>/tensorboard/trial-NNNN/``
holds a trial's parameters (a ``tensorboard.plugins.hparams`` session, the folder's name as its
id) and its objective (a scalar named after ``objective.metric``, at step 0). Each is written whole
in ``<output.dir>/.tensorboard-tmp/`` and renamed in, only for a trial that has none, so a driver
killed and run again neither repeats a trial nor leaves one out (:func:`write_new` runs when the
driver starts and after each trial ends).
"""

from __future__ import annotations

import shutil

from kerasdist._log import get_logger
from kerasdist.sweep.plan import SweepPlan

log = get_logger("sweep")
FOLDER = "tensorboard"


def write_new(plan: SweepPlan, study) -> None:
    """Write the HParams run of each COMPLETE trial of ``study`` that has none yet. One that cannot
    be written is logged and left out (a viewer does not end the sweep); the next call tries again.
    """
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import api as hp
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    board, temp = plan.out / FOLDER, plan.out / f".{FOLDER}-tmp"
    for trial in study.get_trials(deepcopy=False):
        name = f"trial-{trial.number:04d}"
        if trial.state.name != "COMPLETE" or (board / name).exists():
            continue
        params = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                  for k, v in trial.params.items()}
        start = trial.datetime_start.timestamp()
        value = summary_pb2.Summary.Value(tag=plan.config.objective.metric, simple_value=trial.value)
        try:
            shutil.rmtree(temp / name, ignore_errors=True)  # left by a driver killed while writing
            writer = EventFileWriter(str(temp / name))
            for summary in (hp.hparams_pb(params, trial_id=name, start_time_secs=start),
                            summary_pb2.Summary(value=[value])):
                writer.add_event(event_pb2.Event(wall_time=start, step=0, summary=summary))
            writer.close()
            board.mkdir(exist_ok=True)
            (temp / name).rename(board / name)
        except OSError as err:
            log.warning(f"tensorboard: trial {trial.number} not written to {board}: {err}")

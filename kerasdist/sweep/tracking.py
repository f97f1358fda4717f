"""MLflow for a sweep whose base recipe tracks (``output.tracking: {kind: mlflow}``): one parent
run for the sweep (named after ``output.study``; its id kept in the study's user attribute
:data:`PARENT_ATTR`, so a resumed sweep continues it), and each trial's own run (created by its
``kerasdist fit``) made its child; ``docs/sweep.md`` ("Tracking") lists their params, metrics and
tags. Every trial logs into one store: the recipe's ``output.tracking.uri``, or
``sqlite:///<output.dir>/mlflow.db`` when it names none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kerasdist._log import get_logger
from kerasdist.sweep.plan import SweepPlan

log = get_logger("sweep")
PARENT_ATTR = "kerasdist.mlflow_parent"


def start(plan: SweepPlan, study) -> SweepTracker | None:
    """The parent run (created, or continued from the study), or None when the recipe does not
    track."""
    config = plan.base.output.tracking
    if config is None:
        return None
    from kerasdist.tracking.mlflow_store import client_for, require_mlflow

    require_mlflow()
    uri = config.uri or f"sqlite:///{plan.out / 'mlflow.db'}"
    client = client_for(uri)
    parent = study.user_attrs.get(PARENT_ATTR)
    if parent:
        client.update_run(parent, status="RUNNING")
    else:
        from kerasdist.tracking.mlflow_tracker import _experiment_id

        experiment = _experiment_id(client, config.experiment, uri, plan.out)
        sweep = plan.config
        run = client.create_run(experiment, run_name=sweep.output.study, tags={
            "kerasdist.sweep": str(plan.source), "kerasdist.sweep.dir": str(plan.out)})
        parent = run.info.run_id
        params = {f"space.{k}": json.dumps(v.model_dump(mode="json")) for k, v in sweep.space.items()}
        params.update({"recipe": str(sweep.recipe), "objective.metric": sweep.objective.metric,
                       "objective.direction": sweep.objective.direction,
                       "sampler.name": sweep.sampler.name, "pruner.name": sweep.pruner.name,
                       "trials": str(sweep.trials), "parallel": str(sweep.parallel)})
        params.update({f"set.{k}": json.dumps(v) for k, v in sweep.set.items()})
        from mlflow.entities import Param

        client.log_batch(parent, params=[Param(k, v[:6000]) for k, v in params.items()])
        study.set_user_attr(PARENT_ATTR, parent)
    log.info(f"tracking: MLflow parent run {parent} at {uri}")
    return SweepTracker(client, parent, plan)


class SweepTracker:
    """Logs a sweep's trials into MLflow (see module docs)."""

    def __init__(self, client, parent: str, plan: SweepPlan):
        self.client, self.parent, self.plan = client, parent, plan

    def trial_started(self, number: int, params: dict[str, Any]) -> None:
        """Nothing yet: the trial creates its own run when its chief starts."""

    def trial_finished(self, number: int, *, state: str, value: float | None) -> None:
        """Make the trial's run a child of the parent; log its state and objective."""
        from kerasdist.sweep.study import run_dir, trial_dir

        record = _record(run_dir(trial_dir(self.plan, number)))
        try:
            if record is not None:
                run_id = record["run_id"]
                self.client.set_tag(run_id, "mlflow.parentRunId", self.parent)
                self.client.set_tag(run_id, "kerasdist.sweep.trial", str(number))
                self.client.set_tag(run_id, "kerasdist.sweep.state", state)
                if value is not None:
                    self.client.log_metric(run_id, "objective", value)
            if value is not None:
                self.client.log_metric(self.parent, "trial_value", value, step=number)
        except Exception as err:  # noqa: BLE001 - tracking must not end the sweep
            log.warning(f"tracking: trial {number} not logged to MLflow: {err}")

    def finish(self, study, *, failed: bool) -> None:
        """Log the best value and trial on the parent; set it FINISHED (FAILED)."""
        from kerasdist.sweep.outputs import best_trial

        best = best_trial(study)
        try:
            if best is not None:
                self.client.log_metric(self.parent, "best_value", best.value)
                self.client.set_tag(self.parent, "kerasdist.sweep.best_trial", str(best.number))
            self.client.set_terminated(self.parent, status="FAILED" if failed else "FINISHED")
        except Exception as err:  # noqa: BLE001
            log.warning(f"tracking: the sweep's MLflow run not finished: {err}")


def _record(folder: Path) -> dict | None:
    from kerasdist._files import read_json
    from kerasdist.tracking.mlflow_store import TRACKING_FILE

    return read_json(folder / TRACKING_FILE)

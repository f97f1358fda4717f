"""The core of the conformance matrix, in the README's suite: 18 of the 87 cases, chosen to
cover each kind of mend and input path (BatchNormalization statistics, a confusion metric on
uneven shards, class_weight, clipping and gradient accumulation before the all-reduce, a
chief-aware callback, NumPy input with ``validation_split``, a ``PyDataset``, and issue 29's
round 2: metrics built outside the scope, ``steps_per_execution``, ``reduction="sum"`` and
``"mean_with_sample_weight"``,
``add_loss``, ``Model.save`` on every worker), issue 40's round 3 (Adam's sparse gradients on
an ``Embedding``, ModelCheckpoint and BackupAndRestore to each worker's own folder,
``jit_compile=True``), under every strategy, judged against the same
``expected.json`` as the full matrix (``test_matrix.py``, extended tier: ``-m extended``)."""

from __future__ import annotations

import pytest
from matrix_support import EXPECTED, KNOWN_FAILURES, STRATEGY_TIMEOUT_S, check_cell, module_matrix

from kerasdist.conformance import driver
from kerasdist.conformance.cases import all_cases, select

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

CORE = ("sequential", "batchnorm", "metrics_confusion_uneven", "class_weight", "clipnorm",
        "gradient_accumulation", "cb_model_checkpoint", "input_numpy", "pydataset",
        "metrics_outside_scope", "steps_per_execution", "loss_sum", "loss_weighted_mean", "add_loss",
        "save_every_worker", "sparse_adam", "cb_checkpoint_own_path", "jit_compile")
CASES = select(CORE)


matrix = module_matrix(CASES)


@pytest.mark.timeout(STRATEGY_TIMEOUT_S + 600)
@pytest.mark.parametrize("strategy", driver.STRATEGIES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_core_cell(matrix, strategy, case):
    check_cell(matrix, strategy, case)


def test_the_expected_table_names_every_case_and_strategy():
    assert sorted(EXPECTED) == sorted(c.name for c in all_cases())
    for case, row in EXPECTED.items():
        assert sorted(row) == sorted(driver.STRATEGIES), case
        assert set(row.values()) <= {"pass", "refused", "fail"}, case
        for strategy, verdict in row.items():
            assert (verdict == "fail") == ((case, strategy) in KNOWN_FAILURES), (case, strategy)

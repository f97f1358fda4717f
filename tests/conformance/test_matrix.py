"""The conformance matrix (``kerasdist conformance``) as tests: one test per (strategy, case) cell.
Extended tier (``-m extended``; ``.ci/run`` runs it after the README's suite, which runs the core
cases in ``test_matrix_core.py``).

The strategy-free reference runs once, in this process, for the module; then every strategy's
processes start **once**, all four at the same time (one process for default/mirrored, a local
2-worker cluster for multi_worker, 1 ps + 2 workers + coordinator for parameter_server) and run
every case; each test then judges one cell
with :func:`kerasdist.conformance.oracle.judge` (the oracle is documented there and in
docs/conformance.md). A cell passes, or is refused up front with ``UnsupportedFeatureError``
naming the feature and the strategy; anything else fails the test with the oracle's findings.

Several of these cells are the regression tests of issue 18's defects (each failed on the main
branch before its mend): ``batchnorm`` under multi_worker/mirrored (moving statistics differed
across replicas), ``gradient_accumulation`` and ``use_ema`` (merge_call inside a cond),
``clipnorm``/``clipvalue``/``global_clipnorm`` (clipped before the all-reduce),
``custom_train_test_step``/``custom_compute_loss`` (loss divided by the replicas), the string-input
cases under mirrored, ``cb_tensorboard`` under multi_worker (one writer per task),
``mixed_bfloat16`` under multi_worker (predict), and every parameter_server cell (predict,
nested logs of a custom step, class_weight).
"""

from __future__ import annotations

import pytest
from matrix_support import STRATEGY_TIMEOUT_S, check_cell, module_matrix

from kerasdist.conformance import driver, runner
from kerasdist.conformance.cases import all_cases

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.extended]

CASES = all_cases()


matrix = module_matrix(CASES)


@pytest.mark.timeout(STRATEGY_TIMEOUT_S + 600)
@pytest.mark.parametrize("strategy", driver.STRATEGIES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cell(matrix, strategy, case):
    check_cell(matrix, strategy, case)


def test_reference_is_deterministic(matrix, tmp_path):
    """The oracle is only as good as its reference: a second strategy-free run of a case gives
    bit-for-bit the same weights."""
    case = next(c for c in CASES if c.name == "adam")
    first = matrix["reference"]["adam"]
    again = runner.run_case(case, None, workdir=tmp_path,
                            initial=first["initial_weights"])
    for a, b in zip(first["weights"] + first["optimizer"], again["weights"] + again["optimizer"],
                    strict=True):
        assert (a == b).all()

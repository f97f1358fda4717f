"""The arithmetic of tools/scaling_model.py (no TensorFlow)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "scaling_model.py"
_SPEC = importlib.util.spec_from_file_location("scaling_model", _PATH)
sm = importlib.util.module_from_spec(_SPEC)
sys.modules["scaling_model"] = sm
_SPEC.loader.exec_module(sm)

CAL = sm.Calibration()


def test_ring_allreduce_sends_2_n_minus_1_over_n_of_the_bytes():
    assert sm.ring_allreduce_bytes(1, 100.0) == 0.0
    assert sm.ring_allreduce_bytes(2, 100.0) == pytest.approx(100.0)
    assert sm.ring_allreduce_bytes(4, 100.0) == pytest.approx(150.0)
    assert sm.ring_allreduce_bytes(128, 100.0) == pytest.approx(2 * 127 / 128 * 100)
    with pytest.raises(ValueError, match="n=0"):
        sm.ring_allreduce_bytes(0, 1.0)


def test_seed_cnn_bytes_and_per_byte_cost():
    assert sum(sm.SEED_VARIABLES) == 3_274_634  # the seed CNN's parameter count
    assert CAL.gradient_bytes == 4 * 3_274_634
    assert sm.per_byte_s(10, 0.0) == pytest.approx(0.8e-9)  # 8 bits / 10 Gb/s


@pytest.mark.parametrize("n", [2, 8, 128])
def test_efficiency_rises_with_bandwidth_accumulation_and_bf16(n):
    effs = [sm.multi_worker(CAL, n, g)["efficiency"] for g in (1, 10, 25, 100, 400)]
    assert effs == sorted(effs) and effs[0] < effs[-1] <= 1.0
    by_k = [sm.multi_worker(CAL, n, 10, k=k)["efficiency"] for k in (1, 2, 4, 8)]
    assert by_k == sorted(by_k)
    assert sm.multi_worker(CAL, n, 10, bf16=True)["comm_s"] < sm.multi_worker(CAL, n, 10)["comm_s"]
    ps = [sm.parameter_server(CAL, n, g, num_ps=4, partitioned=True)["efficiency"]
          for g in (1, 10, 25, 100)]
    assert ps == sorted(ps)


def test_one_worker_has_no_communication_and_full_efficiency():
    one = sm.multi_worker(CAL, 1, 10)
    assert one["comm_s"] == 0.0 and one["efficiency"] == pytest.approx(1.0)
    assert one["examples_per_s"] == pytest.approx(64 / CAL.t_comp(64))


def test_partitioning_spreads_the_big_dense_kernel_over_the_ps_tasks():
    whole = sm.ps_bytes(CAL, 8, partitioned=False)
    split = sm.ps_bytes(CAL, 8, partitioned=True)
    assert whole >= 3_211_264 * 4  # the 3136x1024 kernel stays on one ps
    # an even eighth, plus at most the largest variable too small to split (conv2's kernel)
    assert CAL.gradient_bytes / 8 <= split <= CAL.gradient_bytes / 8 + 51_200 * 4
    assert sm.ps_bytes(CAL, 1, partitioned=True) == pytest.approx(CAL.gradient_bytes)


def test_parameter_server_is_capped_by_its_busiest_ps():
    few = sm.parameter_server(CAL, 128, 10, num_ps=1)
    many = sm.parameter_server(CAL, 128, 10, num_ps=8, partitioned=True)
    assert few["limit"] == "ps" and many["examples_per_s"] > few["examples_per_s"]


def test_wire_time_counts_frame_headers_and_the_link_efficiency():
    """Measured on simulated hosts (docs/benchmarks.md): 1.046-1.048 x the payload crossed the
    links, the 1514/1448 of full TCP segments in 1500-byte-MTU frames."""
    cal = sm.Calibration()
    ring = sm.ring_allreduce_bytes(2, cal.gradient_bytes)
    wire = sm.multi_worker(cal, 2, 0.1)["wire_s"] - 2 * cal.latency_s
    assert wire == pytest.approx(ring * 1514 / 1448 * 8 / 0.1e9)
    half = sm.multi_worker(sm.replace(cal, link_efficiency=0.5), 2, 0.1)["wire_s"] - 2 * cal.latency_s
    assert half == pytest.approx(2 * wire)
    ps = sm.parameter_server(cal, 2, 0.1)
    ps_half = sm.parameter_server(sm.replace(cal, link_efficiency=0.5), 2, 0.1)
    assert ps_half["examples_per_s"] < 0.55 * ps["examples_per_s"]
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="link_efficiency"):
            sm.multi_worker(sm.replace(cal, link_efficiency=bad), 2, 0.1)


def test_a_partitioned_variable_gradient_crosses_the_worker_link_once_per_shard():
    """Measured on simulated hosts (docs/benchmarks.md): 2 ps, variable_partitioning min_size,
    each worker sent 2.0 x its gradients per step."""
    cal = sm.Calibration()
    grad = cal.gradient_bytes
    assert sm.ps_push_bytes(cal, 1, False) == grad
    assert sm.ps_push_bytes(cal, 2, False) == grad
    assert sm.ps_push_bytes(cal, 1, True) == grad
    assert sm.ps_push_bytes(cal, 2, True) == grad + 3136 * 1024 * 4  # only the dense kernel > 256 KiB
    # ... and every ps holding a shard receives it whole: partitioning does not spread the writes
    assert sm.ps_in_bytes(cal, 2, True) == 3136 * 1024 * 4 + max(
        sum(e * 4 for i, e in enumerate(sm.SEED_VARIABLES) if i % 2 == r and i != 4) for r in (0, 1))
    assert sm.ps_in_bytes(cal, 1, False) == grad
    assert sm.ps_bytes(cal, 2, True) < 0.6 * grad  # while each ps sends about half the variables
    one = sm.parameter_server(cal, 2, 0.1, num_ps=1)
    two = sm.parameter_server(cal, 2, 0.1, num_ps=2, partitioned=True)
    assert two["limit"] == "workers" and two["examples_per_s"] < 0.8 * one["examples_per_s"]


def test_a_measured_cpu_step_replaces_the_calibrated_cpu_parts():
    """The simulated-hosts check (docs/benchmarks.md): a capped row's step = the same row's
    uncapped step + the modelled wire time."""
    cal = sm.Calibration()
    mw = sm.multi_worker(cal, 2, 0.1, batch=32, cpu_step_s=1.0)
    assert mw["step_s"] == pytest.approx(1.0 + mw["wire_s"])
    assert mw["examples_per_s"] == pytest.approx(64 / (1.0 + mw["wire_s"]))
    assert sm.multi_worker(cal, 2, math.inf, batch=32, cpu_step_s=1.0)["step_s"] == pytest.approx(
        1.0 + 2 * cal.latency_s)
    wire = 2 * cal.gradient_bytes * cal.frame_overhead * 8 / 0.1e9 + 2 * cal.latency_s
    ps = sm.parameter_server(cal, 2, 0.1, batch=64, cpu_step_s=0.25)
    assert ps["examples_per_s"] == pytest.approx(2 / (2 * 0.25 + wire) * 64)
    free = sm.parameter_server(cal, 2, math.inf, batch=64, cpu_step_s=0.25)
    assert free["examples_per_s"] == pytest.approx(64 / 0.25, rel=1e-3)

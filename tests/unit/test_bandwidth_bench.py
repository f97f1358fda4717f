"""The pure logic of tools/bandwidth_bench.py (counters, windows, the model's figures) and the
name prefix of kerasdist.testing.hosts (no TensorFlow, no root)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

_TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, _TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bb = _load("bandwidth_bench")
sm = bb.sm

# Two links as `ip -s -j link show` prints them (trimmed to the fields that matter).
IP_JSON = json.dumps([
    {"ifname": "br0", "stats64": {"rx": {"bytes": 10, "packets": 1}, "tx": {"bytes": 20, "packets": 2}}},
    {"ifname": "kdbwabcdefp0", "stats64": {"rx": {"bytes": 123456789012, "packets": 9},
                                           "tx": {"bytes": 5, "packets": 1}}},
])


def test_link_counters_parse_from_ip_json():
    assert bb.parse_link_bytes(IP_JSON) == {"br0": (10, 20), "kdbwabcdefp0": (123456789012, 5)}
    with pytest.raises(ValueError, match="not `ip -s -j link` output"):
        bb.parse_link_bytes("3: br0: <BROADCAST> mtu 1500")
    with pytest.raises(ValueError, match="KeyError"):
        bb.parse_link_bytes(json.dumps([{"ifname": "lo"}]))


def test_counters_interpolate_between_samples_and_refuse_outside():
    samples = [(10.0, 1000.0), (11.0, 3000.0), (13.0, 3000.0)]
    assert bb.interpolate(samples, 10.0) == 1000.0
    assert bb.interpolate(samples, 10.25) == pytest.approx(1500.0)
    assert bb.interpolate(samples, 12.0) == 3000.0
    with pytest.raises(ValueError, match="outside the sampled span"):
        bb.interpolate(samples, 13.5)
    with pytest.raises(ValueError, match="outside the sampled span"):
        bb.interpolate(samples[:1], 10.0)


def test_stamps_parse_and_the_window_leaves_out_the_first_steps():
    text = "0 0 100.0\n0 1 101.0\n0 2 101.5\n0 3 102.0\n0 4 10"  # a torn last line
    stamps = bb.parse_stamps(text + "x\n")
    assert stamps == [(0, 0, 100.0), (0, 1, 101.0), (0, 2, 101.5), (0, 3, 102.0)]
    # from the end of the 2nd step (batch 1) to the end of the last (batch 3): 2 steps, 1 s
    assert bb.steady_window(stamps, skip=2) == (101.0, 102.0, 2)
    assert bb.steady_window(stamps, skip=1) == (100.0, 102.0, 3)
    # only the last epoch counts; parameter_server stamps a call of 4 steps at a time
    calls = [(0, 3, 1.0), (0, 7, 2.0), (1, 3, 10.0), (1, 7, 12.0), (1, 11, 14.0)]
    assert bb.steady_window(calls, skip=1) == (10.0, 14.0, 8)
    with pytest.raises(ValueError, match="more than 2 are needed"):
        bb.steady_window(stamps[:2], skip=2)
    with pytest.raises(ValueError, match="no step"):
        bb.steady_window([], skip=1)


def test_bytes_per_step_is_the_counter_delta_over_the_window():
    samples = {"p0": [(0.0, 0.0), (10.0, 1e9)], "p1": [(0.0, 5.0), (10.0, 5.0)]}
    got = bb.bytes_per_step(samples, 2.0, 6.0, 4)
    assert got == {"p0": pytest.approx(1e8), "p1": 0.0}
    with pytest.raises(ValueError, match="steps must be >= 1"):
        bb.bytes_per_step(samples, 2.0, 6.0, 0)


def test_model_bytes_per_step_ring_and_parameter_server():
    grad = sm.Calibration().gradient_bytes * 1514 / 1448  # float32 seed CNN, in 1500-MTU frames
    assert bb.model_bytes(bb.Row("mw-f32", 2, 100)) == pytest.approx(2 * grad)
    assert bb.model_bytes(bb.Row("mw-f32", 4, 100)) == pytest.approx(6 * grad)  # 2 (n-1) G
    assert bb.model_bytes(bb.Row("mw-bf16", 4, 100)) == pytest.approx(3 * grad)
    assert bb.model_bytes(bb.Row("mw-pack", 3, None)) == pytest.approx(4 * grad)
    assert bb.model_bytes(bb.Row("ps1", 2, 1000)) == pytest.approx(2 * grad)
    # 2 ps, partitioned: the 3136x1024 dense kernel's gradient (12.8 MB) crosses twice
    assert bb.model_bytes(bb.Row("ps2", 2, 1000)) == pytest.approx(
        2 * grad + 3136 * 1024 * 4 * 1514 / 1448)


def test_rows_hosts_batches_and_the_trimmed_grid():
    ps2 = bb.Row("ps2", 2, 100)
    assert (ps2.strategy, ps2.num_ps, ps2.num_hosts, ps2.global_batch) == ("parameter_server", 2, 4, 64)
    assert bb.Row("ps1", 2, None).num_hosts == 3
    mw = bb.Row("mw-bf16", 3, 1000)
    assert (mw.strategy, mw.num_hosts, mw.global_batch) == ("multi_worker", 3, 96)
    full = bb.grid(trim=False)
    trimmed = bb.grid()
    assert len(full) == 3 * (2 + 3 * 3) and len(trimmed) == 3 * (2 + 3 + 2 + 1)
    assert {r.workers for r in trimmed if r.name == "mw-pack"} == {4}


def test_prediction_a_capped_link_is_wire_bound_and_shared_cores_slow_the_cpu():
    cal = sm.Calibration()
    capped = bb.predict(bb.Row("mw-f32", 2, 100), cal, cores=2)
    wire = cal.gradient_bytes * 1514 / 1448 * 8 / 100e6  # ring bytes of 2 workers: G each
    assert capped["wire_s"] == pytest.approx(wire + 2 * cal.latency_s)
    assert capped["limit"] == "wire"
    assert capped["examples_per_s"] == pytest.approx(64 / capped["step_s"])
    # uncapped: no wire time; 4 one-thread workers on 2 cores take twice the CPU time of 2
    free2 = bb.predict(bb.Row("mw-f32", 2, None), cal, cores=2)
    free4 = bb.predict(bb.Row("mw-f32", 4, None), cal, cores=2)
    alone4 = bb.predict(bb.Row("mw-f32", 4, None), cal, cores=None)
    assert free2["wire_s"] == pytest.approx(2 * cal.latency_s) and free2["limit"] == "cpu"
    assert free4["step_s"] > 1.9 * alone4["step_s"] - 1e-3
    # parameter_server: one core for 4 tasks caps the cluster at the CPU one global step needs
    one_core = bb.predict(bb.Row("ps1", 2, None), cal, cores=1)
    cpu_per_step = cal.t_comp(64) + 2 * cal.gradient_bytes * cal.ps_cpu_s_per_byte + cal.coordinator_rate_s
    assert one_core["limit"] == "cpu"
    assert one_core["examples_per_s"] == pytest.approx(64 / cpu_per_step)
    assert bb.predict(bb.Row("ps1", 2, None), cal, cores=None)["limit"] != "cpu"
    assert bb.predict(bb.Row("ps1", 2, 100), cal, cores=2)["limit"] == "workers"


def test_shared_cores_stretch():
    assert sm.shared_cores(1, 2) == 1.0
    assert sm.shared_cores(3, 2) == 1.5
    assert sm.shared_cores(8, None) == 1.0
    with pytest.raises(ValueError, match="cores=0"):
        sm.shared_cores(2, 0)
    one = sm.multi_worker(sm.Calibration(), 1, math.inf, cores=2)
    assert one["comm_s"] == 0.0 and one["efficiency"] == pytest.approx(1.0)


def test_host_set_name_prefix_is_checked_and_used(tmp_path):
    from kerasdist.testing.hosts import HostSet

    hosts = HostSet(2, prefix="kdbw", log_dir=tmp_path)
    assert hosts.namespace(1).startswith("kdbw") and hosts.switch_ns.startswith("kdbw")
    assert HostSet(2, log_dir=tmp_path).namespace(0).startswith("kd")
    # Linux's interface-name limit (15) holds for the longest prefix and host index
    assert len(HostSet(250, prefix="abcde", log_dir=tmp_path).switch_if(249)) <= 15
    for bad in ("k", "kdbwxy", "Kd", "1k", "k-d", None):
        with pytest.raises(ValueError, match="prefix must be 2 to 5"):
            HostSet(2, prefix=bad, log_dir=tmp_path)


def test_bad_arguments_name_the_option_and_exit_2(capsys):
    assert bb.parse_grid("mw-f32,ps1", "2,4", "100,none") == (["mw-f32", "ps1"], [2, 4], [100.0, None])
    for rows, hosts, caps in (("mw-f64", "2", "100"), ("mw-f32", "1", "100"),
                              ("mw-f32", "2", "-5"), ("mw-f32", "two", "100")):
        with pytest.raises(ValueError, match="Received: --rows"):
            bb.parse_grid(rows, hosts, caps)
    assert bb.main(["--hosts", "9"]) == 2
    assert "--hosts '9'" in capsys.readouterr().err
    assert bb.main(["--link-efficiency", "0"]) == 2
    assert "--link-efficiency must be within (0, 1]" in capsys.readouterr().err


def test_the_uncapped_row_gives_the_capped_rows_their_cpu_step():
    base = {"name": "mw-f32", "workers": 2, "hosts": 2, "global_batch": 64, "steps": 6,
            "bytes_per_step": 2.7e7, "link_mbit_by_host": [40, 40]}
    rows = [dict(base, cap_mbit=100, examples_per_s=23.5), dict(base, cap_mbit=None, examples_per_s=64.0),
            dict(base, name="ps1", cap_mbit=100, error="RuntimeError: worker:0 exited 1")]
    uncapped = bb.uncapped_steps(rows)
    assert uncapped == {("mw-f32", 2): pytest.approx(1.0)}
    capped = bb.remodel(rows[0], sm.Calibration(), uncapped)
    wire = sm.Calibration().gradient_bytes * 1514 / 1448 * 8 / 100e6 + 2 * sm.Calibration().latency_s
    assert capped["model_on_uncapped_examples_per_s"] == pytest.approx(64 / (1.0 + wire))
    assert capped["ratio_on_uncapped"] == pytest.approx(23.5 / capped["model_on_uncapped_examples_per_s"])
    assert bb.remodel(rows[2], sm.Calibration(), uncapped) is rows[2]
    line = bb.table_line(capped)
    assert line.startswith("| mw-f32 | 2 | 100 Mbit/s | 6 | 23.5 | 27.00 | 27.39 | 40 |")
    assert line.count("|") == 13 and "failed" in bb.table_line(rows[2])


def test_the_embedding_row_has_no_model_figures():
    emb = bb.Row("emb", 2, 100)
    assert (emb.strategy, emb.num_ps, emb.num_hosts, emb.global_batch) == ("parameter_server", 2, 4, 256)
    assert "emb" not in bb.DEFAULT_ROWS and all(r.name != "emb" for r in bb.grid())
    r = {"name": "emb", "workers": 2, "hosts": 4, "cap_mbit": None, "global_batch": 256, "steps": 26,
         "examples_per_s": 900.0, "bytes_per_step": 1e5, "link_mbit_by_host": [1, 2, 3, 4]}
    out = bb.remodel(r, sm.Calibration(), {})
    assert out["model_examples_per_s"] is None and out["ratio"] is None
    assert bb.table_line(out) == "| emb | 4 | uncapped | 26 | 900.0 | 0.10 | – | 4 | – | – | – | – |"

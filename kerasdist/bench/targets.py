"""The project's speed targets judged on a bench result: MET, MISSED or n/a for each
(``docs/benchmarks.md``, "Targets and where the other figures are").

Every target reads the medians the bench computed (round-robin repeats); a target whose rows are
absent from the result is ``n/a (rows missing)``, and one judged on fewer than
:data:`MIN_REPEATS` repeats is ``n/a (fewer than 3 repeats)``: never MET. Ratios are those of
:func:`kerasdist.bench.command._assemble` (kerasdist's parameter-server row against tf_keras's PS
uses the whole-epoch figure, the only one tf_keras allows).
"""

from __future__ import annotations

import re
from typing import Any

MET, MISSED, ROWS_MISSING = "MET", "MISSED", "n/a (rows missing)"
MIN_REPEATS = 3  # a verdict needs at least 3 round-robin repeats of its rows
TOO_FEW_REPEATS = f"n/a (fewer than {MIN_REPEATS} repeats)"
LIFECYCLE_OVERHEAD_MAX = 0.03  # the recipe lifecycle costs at most 3 % per strategy
NOT_MEASURED = "n/a (time to 0.98 not measured: bench --target-accuracy differs)"
TIME_TO_ACCURACY = 0.98  # the held-out accuracy of the time-to-target targets

_MULTI_WORKER_ROW = re.compile(r"multi_worker(_.+)?")
"""Bench rows of multi_worker: the plain row and its variants (``multi_worker_<settings>``)."""


def _verdict(name: str, text: str, *, value=None, threshold=None, ok=None, detail="",
             unjudged: str = ROWS_MISSING) -> dict:
    verdict = unjudged if ok is None else (MET if ok else MISSED)
    return {"name": name, "target": text, "verdict": verdict, "value": value,
            "threshold": threshold, "detail": detail}


def _summary(result: dict, row: str) -> dict | None:
    entry = result.get("rows", {}).get(row)
    if not entry or not entry["summary"].get("succeeded"):
        return None
    return entry["summary"]


def _ratio(result: dict, row: str, base: str) -> float | None:
    mine = _summary(result, row)
    if mine is None or _summary(result, base) is None:
        return None
    return (mine.get("ratio_examples_per_sec") or {}).get(base)


def _ratio_target(result, name, row, base, threshold, text) -> dict:
    ratio = _ratio(result, row, base)
    return _verdict(name, text, value=ratio, threshold=threshold,
                    ok=None if ratio is None else ratio >= threshold,
                    detail="" if ratio is None else f"{ratio:.3f}x {base}")


def _multi_worker_best(result: dict) -> dict:
    """multi_worker with its best settings: the ``multi_worker*`` strategy row with the highest
    examples/s ratio to plain Keras must reach 0.75x and time to 0.98 <= 1.2x plain Keras."""
    text = ("multi_worker (best accumulation/compression settings) >= 0.75x plain Keras "
            "examples/s and time to 0.98 <= 1.2x plain Keras")
    rows = [n for n, r in result.get("rows", {}).items()
            if r.get("kind") == "strategy" and _MULTI_WORKER_ROW.fullmatch(n)]
    ratios = {n: _ratio(result, n, "plain_keras") for n in rows}
    ratios = {n: r for n, r in ratios.items() if r is not None}
    if not ratios:
        return _verdict("multi_worker_best_vs_plain_keras", text)
    best = max(ratios, key=ratios.get)
    tta = _summary(result, best).get("ratio_time_to_target_vs_plain_keras")
    accuracy = result.get("settings", {}).get("target_accuracy")
    detail = f"{best}: {ratios[best]:.3f}x examples/s"
    if accuracy != TIME_TO_ACCURACY:
        return _verdict("multi_worker_best_vs_plain_keras", text, value=ratios[best],
                        threshold=0.75, unjudged=NOT_MEASURED,
                        detail=detail + f"; time to target measured at {accuracy}")
    ok = ratios[best] >= 0.75 and tta is not None and tta <= 1.2
    detail += ("; 0.98 not reached by both rows" if tta is None
               else f"; time to 0.98 {tta:.3f}x")
    return _verdict("multi_worker_best_vs_plain_keras", text, value=ratios[best],
                    threshold=0.75, ok=ok, detail=detail)


def _coordinator(result: dict) -> dict:
    text = "coordinator scaling: kerasdist >= tf_keras steps/s at every worker count"
    points = (result.get("coordinator_scaling") or {}).get("points", [])
    rate = {(p["impl"], p["workers"]): p.get("steps_per_sec") for p in points}
    counts = sorted({n for _, n in rate})
    pairs = [(n, rate.get(("kerasdist", n)), rate.get(("tf_keras", n))) for n in counts]
    if not pairs or any(mine is None or theirs is None for _, mine, theirs in pairs):
        return _verdict("coordinator_kerasdist_vs_tf_keras", text)
    ratios = {n: mine / theirs for n, mine, theirs in pairs}
    detail = ", ".join(f"{n}w {r:.2f}x" for n, r in ratios.items())
    return _verdict("coordinator_kerasdist_vs_tf_keras", text, value=min(ratios.values()),
                    threshold=1.0, ok=all(r >= 1.0 for r in ratios.values()), detail=detail)


def _lifecycle(result: dict) -> list[dict]:
    """One target per strategy row that has its ``keras_enable_<row>`` row: the recipe row's
    examples/s at least (1 - 3 %) of the same strategy with only ``kerasdist.enable()``."""
    verdicts = []
    for name, row in result.get("rows", {}).items():
        base = f"keras_enable_{name}"
        if row.get("kind") != "strategy" or base not in result["rows"]:
            continue
        text = (f"{name}: kerasdist's lifecycle cost <= {LIFECYCLE_OVERHEAD_MAX:.0%} "
                f"(recipe row vs {base})")
        ratio = _ratio(result, name, base)
        verdicts.append(_verdict(
            f"lifecycle_overhead_{name}", text, value=None if ratio is None else 1 - ratio,
            threshold=LIFECYCLE_OVERHEAD_MAX,
            ok=None if ratio is None else 1 - ratio <= LIFECYCLE_OVERHEAD_MAX,
            detail="" if ratio is None else f"{(1 - ratio):+.1%} ({ratio:.3f}x {base})"))
    return verdicts


def _enough_repeats(verdict: dict, repeats: int) -> dict:
    if verdict["verdict"] in (MET, MISSED) and repeats < MIN_REPEATS:
        verdict = {**verdict, "verdict": TOO_FEW_REPEATS,
                   "detail": f"{verdict['detail']}; {repeats} repeat(s)"}
    return verdict


def evaluate(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Judge every speed target on ``result`` (bench.json content).

    Returns:
        One dict per target: ``name``, ``target`` (text), ``verdict`` (``MET``, ``MISSED``,
        ``n/a (rows missing)``, :data:`TOO_FEW_REPEATS` or :data:`NOT_MEASURED`), ``value``
        (the ratio judged, or the lifecycle overhead as a fraction, or None), ``threshold`` and
        ``detail``.
    """
    repeats = int(result.get("settings", {}).get("repeats") or 0)
    scaling = (result.get("coordinator_scaling") or {}).get("settings", {})
    return [_enough_repeats(v, int(scaling.get("repeats") or 0)
                            if v["name"] == "coordinator_kerasdist_vs_tf_keras" else repeats)
            for v in _targets(result)]


def _targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        _ratio_target(result, "parameter_server_vs_tf_keras_ps", "parameter_server",
                      "tf_keras_parameter_server", 1.05,
                      "parameter_server >= 1.05x tf_keras parameter server (whole epochs 2..n)"),
        _ratio_target(result, "multi_worker_vs_tf_keras_mwms", "multi_worker",
                      "tf_keras_multi_worker", 1.05,
                      "multi_worker >= 1.05x tf_keras multi-worker"),
        _multi_worker_best(result),
        _ratio_target(result, "parameter_server_vs_plain_keras", "parameter_server",
                      "plain_keras", 0.85, "parameter_server >= 0.85x plain Keras"),
        _ratio_target(result, "default_vs_plain_keras", "default", "plain_keras", 1.2,
                      "default >= 1.2x plain Keras"),
        *_lifecycle(result),
        _ratio_target(result, "stream_vs_in_memory", "default_stream", "default", 1.0,
                      "the streaming input (default_stream) not slower than the in-memory one "
                      "(default)"),
        _coordinator(result),
    ]

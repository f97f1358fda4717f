"""The oracle of each matrix cell: what a strategy run must equal, and the verdict.

:func:`judge` applies the oracle stated in :data:`kerasdist.conformance.report.ORACLE` (the text
of ``docs/conformance.md``): synchronous strategies (:data:`SYNC`) must hold bit-for-bit identical
variables on every replica and match the strategy-free run within ``Case.tolerance`` (except
where ``Case.per_replica`` says Keras defines per-replica semantics: there, and under parameter
server, the loss must fall instead); every strategy's ``evaluate``/``predict`` must equal a
strategy-free evaluation of its trained weights, it must stop at the reference's epoch, and the
case's own check must find nothing wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SYNC = ("default", "mirrored", "multi_worker")


@dataclass
class Verdict:
    """One cell: ``status`` is ``pass``, ``refused``, ``fail`` or ``not_run``; ``detail`` says why."""

    status: str
    detail: str = ""

    def as_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail}


def _close(a, b, tol) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=tol[0], atol=tol[1], equal_nan=True))


def _max_diff(a, b) -> str:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    with np.errstate(invalid="ignore"):
        return f"max abs diff {np.nanmax(np.abs(a - b)) if a.size else 0:.3g}"


def compare_lists(name: str, got: list, want: list, tol) -> list[str]:
    """Problems where two lists of arrays differ beyond ``tol``."""
    if len(got) != len(want):
        return [f"{name}: {len(got)} arrays vs {len(want)}"]
    return [f"{name}[{i}] {_max_diff(g, w)}" for i, (g, w) in enumerate(zip(got, want, strict=True))
            if not _close(g, w, tol)]


def compare_dicts(name: str, got: dict, want: dict, tol) -> list[str]:
    if set(got) != set(want):
        return [f"{name} keys {sorted(got)} vs {sorted(want)}"]
    return [f"{name}['{k}'] {got[k]!r} vs {want[k]!r}" for k in sorted(got)
            if not _close(got[k], want[k], tol)]


def _identical(results: dict) -> list[str]:
    problems = [f"{task}: replicas hold different values of some variable"
                for task, r in results.items() if not r.get("replicas_identical", True)]
    tasks = sorted(results)
    for other in tasks[1:]:
        for key in ("weights", "optimizer"):
            a, b = results[tasks[0]][key], results[other][key]
            diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False))
                    if not np.array_equal(x, y, equal_nan=True)]
            if diff or len(a) != len(b):
                problems.append(f"{key} {diff} differ between {tasks[0]} and {other}")
    return problems


def _history(result: dict, reference: dict, tol, *, values: bool) -> list[str]:
    got, want = result["history"], reference["history"]
    epochs = {k: len(v) for k, v in got.items()}
    want_epochs = len(next(iter(want.values()), []))
    if any(n != want_epochs for n in epochs.values()):
        return [f"ran {sorted(set(epochs.values()))} epochs, the strategy-free run {want_epochs}"]
    if not values:
        return []
    keys = set(got) & set(want)
    return [f"history['{k}'] {_max_diff(got[k], want[k])}" for k in sorted(keys)
            if not _close(got[k], want[k], tol)]


def judge(case, strategy: str, results: dict, reference: dict, same_weights: dict,
          initial_loss: float | None, problems_from_check: list[str]) -> Verdict:
    """The verdict of one cell.

    Args:
        case: the :class:`~kerasdist.conformance.cases.Case`.
        strategy: matrix column.
        results: ``{task: result}`` of the strategy run (one task, or every worker).
        reference: the strategy-free run's result.
        same_weights: ``{"evaluation": ..., "predict": ...}`` of a strategy-free evaluate/predict
            of the chief's trained weights.
        initial_loss: strategy-free evaluation loss of the initial weights.
        problems_from_check: what ``case.check`` found in the run's outputs.
    """
    chief = results.get("main") or results.get("worker-0")
    if chief is None or any(r.get("status") == "not_run" for r in results.values()):
        return Verdict("not_run", (chief or {}).get("error", "no result"))
    errors = [r for r in results.values() if r.get("status") == "error"]
    if errors:
        err = errors[0]
        kind = "refused" if all(r.get("refused") for r in errors) else "fail"
        return Verdict(kind, f"{err['error_class']}: {err['error'].splitlines()[0][:300]}")
    tol = case.tolerance
    problems = []
    exact = strategy == "default" or not case.per_replica
    if strategy in SYNC:
        problems += _identical(results)
        if exact:
            problems += compare_lists("weights", chief["weights"], reference["weights"], tol)
            problems += compare_lists("optimizer", chief["optimizer"], reference["optimizer"], tol)
    problems += _history(chief, reference, tol, values=strategy in SYNC and exact)
    problems += compare_dicts("evaluate", chief["evaluation"], same_weights["evaluation"], tol)
    problems += compare_lists("predict", chief["predict"], same_weights["predict"], tol)
    if not (strategy in SYNC and exact):
        problems += _loss_falls(chief, same_weights, initial_loss, reference)
    problems += problems_from_check
    if problems:
        return Verdict("fail", "; ".join(problems)[:600])
    return Verdict("pass")


def _loss_falls(result: dict, same_weights: dict, initial_loss, reference: dict) -> list[str]:
    ref_loss = reference["history"].get("loss", [0.0])
    if np.isnan(ref_loss).any():  # the case diverges on purpose (TerminateOnNaN)
        return [] if np.isnan(result["history"].get("loss", [0.0])).any() else [
            "the strategy-free run reached NaN; this run did not"]
    final = same_weights["evaluation"].get("loss")
    if initial_loss is None or final is None or not final < initial_loss:
        return [f"loss did not fall: {initial_loss} -> {final}"]
    return []

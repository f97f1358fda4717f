"""A learning-rate schedule evaluated before training: a rate that is negative, not finite, or 0
wherever it is checked is bad input (exit 2, naming ``optimizer.learning_rate``), not a run that
diverges or stands still."""

from __future__ import annotations

from typing import Any

from kerasdist.errors import RecipeError

BOUNDARY_KEYS = ("warmup_steps", "decay_steps", "first_decay_steps")
"""Config keys of Keras's schedules whose value is a step where the rate starts to change
(``boundaries`` of ``PiecewiseConstantDecay`` too)."""


def schedule_steps(schedule) -> list[int]:
    """The steps :func:`check_schedule_rates` evaluates: 0 and either side of the schedule's
    first decay boundary (the smallest positive ``warmup_steps``, ``decay_steps``,
    ``first_decay_steps`` or ``boundaries`` entry of its ``get_config()``), or 0 and 1 for a
    schedule without one."""
    try:
        config = schedule.get_config() or {}
    except (NotImplementedError, TypeError, AttributeError):  # a schedule of the user's own
        config = {}
    candidates = [config.get(key) for key in BOUNDARY_KEYS] + list(config.get("boundaries") or [])
    steps = [int(c) for c in candidates if isinstance(c, (int, float)) and c > 0]
    boundary = min(steps) if steps else 1
    return sorted({0, boundary, boundary + 1})


def check_schedule_rates(schedule, *, field: str, shown: Any) -> None:
    """Evaluate ``schedule`` at :func:`schedule_steps` and refuse a rate that is negative or not
    finite at any of them, or 0 at all of them (nothing would train). A rate of 0 at one of them
    alone is accepted: a warm-up from 0 (``CosineDecay(0.0, ..., warmup_target=...)``) and a
    cosine decay to 0 (``alpha=0``, Keras's default) are common forms.

    Raises:
        RecipeError: naming ``field``, the step and the rate found; also when evaluating the
            schedule raised (the user's own ``__call__``).
    """
    import math

    import keras

    rates = {}
    for step in schedule_steps(schedule):
        try:
            rates[step] = float(keras.ops.convert_to_numpy(schedule(step)))
        except Exception as err:  # noqa: BLE001 - a schedule of the user's own
            raise RecipeError(f"{field}: evaluating the schedule at step {step} raised "
                              f"{type(err).__name__}: {err}. Received: {shown!r}") from None
    shown_rates = ", ".join(f"step {step}: {rate:g}" for step, rate in rates.items())
    bad = [step for step, rate in rates.items() if not math.isfinite(rate) or rate < 0]
    if bad or not any(rate > 0 for rate in rates.values()):
        why = (f"the rate at step {bad[0]} is {rates[bad[0]]:g}" if bad
               else "every rate checked is 0")
        raise RecipeError(f"{field}: a learning rate must be finite and > 0 ({why}; checked "
                          f"{shown_rates}). Received: {shown!r}")

"""``class_weight`` for parameter-server training: per-example weights ``class_weight[label]``
computed as Keras computes them, on the workers' input pipelines (:mod:`kerasdist.keras.ps_input`
builds those pipelines).
"""

from __future__ import annotations

import numpy as np

from kerasdist.keras.ps_input import PSInput, to_ps_input


def _check_class_weight(class_weight) -> dict:
    if isinstance(class_weight, dict) and class_weight and all(
            isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0
            for k in class_weight):
        try:
            return {int(k): float(v) for k, v in class_weight.items()}
        except (TypeError, ValueError):
            pass
    raise ValueError("`class_weight` must be a dict {class id (int >= 0): weight (float)} "
                     f"(ParameterServerStrategy, as Keras). Received: class_weight={class_weight!r}")


def _refuse_class_weight_with(y, sample_weight, class_weight) -> None:
    """Keras 3's own refusals, raised up front (Keras raises them in its data adapters)."""
    import keras

    if sample_weight is not None:
        raise ValueError("You cannot pass `class_weight` and `sample_weight` at the same time "
                         "(Keras 3 refuses it under every strategy; multiply the class weights "
                         "into `sample_weight` yourself). Received: class_weight="
                         f"{class_weight!r} and a sample_weight")
    if y is None or keras.tree.is_nested(y):
        raise ValueError("`class_weight` is only supported for models with a single output and "
                         "needs targets `y` (as in Keras; ParameterServerStrategy). Received: "
                         f"class_weight={class_weight!r} with y structure "
                         f"{keras.tree.map_structure(lambda _: '.', y) if y is not None else None}")


def class_weighted(x, y=None, *, sample_weight=None, class_weight, batch_size=None,
                   shuffle: bool = False, num_workers: int) -> PSInput:
    """The training input of ``fit(x, y, class_weight=...)``: per-example weights
    ``class_weight[label]`` computed as Keras computes them, on the workers' pipelines.

    Arrays: Keras's array mapping (``class_weight_to_sample_weights``: one-hot ``y`` argmax'ed, a
    class missing from the dict weighs 1.0) gives a float ``sample_weight`` of shape ``(n,)``,
    sharded with the examples. A dataset or dataset function: Keras's
    ``make_class_weight_map_fn`` is mapped over each worker's pipeline (batches become
    ``(x, y, class_weight[y])``; a label above the largest key fails there, as in Keras).

    Raises:
        ValueError: naming ``class_weight`` when it is not a non-empty dict of int keys >= 0 and
            float weights, with ``sample_weight`` too (Keras 3 refuses the pair), or with ``y``
            missing or nested; for a dataset function when its pipeline is traced.
    """
    import keras
    import tensorflow as tf

    from kerasdist._compat import internals

    weights = _check_class_weight(class_weight)
    if not callable(x) and not isinstance(x, tf.data.Dataset):
        _refuse_class_weight_with(y, sample_weight, class_weight)
        per_example = internals.class_weight_to_sample_weights(y, weights)
        return to_ps_input(x, y, sample_weight=per_example, batch_size=batch_size,
                           shuffle=shuffle, num_workers=num_workers)
    ps_input = to_ps_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                           num_workers=num_workers)
    if isinstance(x, tf.data.Dataset):
        _, y_spec, w_spec = keras.utils.unpack_x_y_sample_weight(x.element_spec)
        _refuse_class_weight_with(y_spec, w_spec, class_weight)
    return with_class_weight(ps_input, class_weight)


def with_class_weight(ps_input: PSInput, class_weight: dict) -> PSInput:
    """``ps_input`` whose batches ``(x, y)`` become ``(x, y, class_weight[y])`` on the workers
    (Keras's ``make_class_weight_map_fn``; see :func:`class_weighted`).

    Raises:
        ValueError: a bad ``class_weight``; when traced, batches with a sample weight or a
            nested ``y`` (messages name ``class_weight``).
    """
    import dataclasses

    import keras

    from kerasdist._compat import internals

    keras_map = internals.make_class_weight_map_fn(_check_class_weight(class_weight))

    def map_fn(*batch):
        _, y_batch, w_batch = keras.utils.unpack_x_y_sample_weight(batch)
        _refuse_class_weight_with(y_batch, w_batch, class_weight)
        return keras_map(*batch)

    inner = ps_input.dataset_fn
    return dataclasses.replace(ps_input, dataset_fn=lambda ctx: inner(ctx).map(map_fn))

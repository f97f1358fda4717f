"""Sources ``synthetic_linear`` (the seed-001 regression ``y = 2 x + 10 + noise``) and
``synthetic_clicks`` (click logs for the embedding models), generated from ``data.shuffle_seed``
and the split name (:func:`kerasdist.data.readers.synthetic_linear`,
:func:`~kerasdist.data.readers.synthetic_clicks`)."""

from __future__ import annotations

from kerasdist.data.readers import synthetic_clicks, synthetic_linear
from kerasdist.data.sources.memory import MemoryKind


class SyntheticLinearKind(MemoryKind):
    kind = "synthetic_linear"

    def whole(self, config, name):
        return synthetic_linear(name, num_examples=config.source.num_examples,
                                noise_std=config.source.noise_std, seed=config.shuffle_seed)


class SyntheticClicksKind(MemoryKind):
    kind = "synthetic_clicks"

    def whole(self, config, name):
        return synthetic_clicks(name, num_examples=config.source.num_examples,
                                num_users=config.source.num_users, num_items=config.source.num_items,
                                seed=config.shuffle_seed)

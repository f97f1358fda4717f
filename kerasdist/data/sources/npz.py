"""Source ``npz``: a Keras ``mnist.npz`` file (``x_<split>``, ``y_<split>`` arrays)."""

from __future__ import annotations

from pathlib import Path

from kerasdist.data.readers import load_npz_split
from kerasdist.data.sources.memory import MemoryKind


class NpzKind(MemoryKind):
    kind = "npz"

    def whole(self, config, name):
        return load_npz_split(Path(config.source.path), name)

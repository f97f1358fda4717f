"""Source ``idx``: a folder of the original MNIST IDX files (``train-images-idx3-ubyte[.gz]``,
...); splits ``train`` and ``test``."""

from __future__ import annotations

from pathlib import Path

from kerasdist.data.readers import load_idx_split
from kerasdist.data.sources.memory import MemoryKind


class IdxKind(MemoryKind):
    kind = "idx"

    def whole(self, config, name):
        return load_idx_split(Path(config.source.path), name)

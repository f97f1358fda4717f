"""Source ``embedded``: the real MNIST test set shipped inside the package (10,000 digits, IDX
files), so the quickstart runs with no network. Only the split ``test`` exists (slices such as
``test[:80%]`` select from it)."""

from __future__ import annotations

from kerasdist.data.readers import embedded_dir, load_idx_split
from kerasdist.data.sources.memory import MemoryKind
from kerasdist.errors import DataError


class EmbeddedKind(MemoryKind):
    kind = "embedded"

    def whole(self, config, name):
        if name != "test":
            raise DataError(f"the embedded sample holds only the MNIST 'test' split (10,000 real "
                            f"digits); use e.g. 'test[:80%]'. Received: split '{name}'")
        return load_idx_split(embedded_dir(), "test")

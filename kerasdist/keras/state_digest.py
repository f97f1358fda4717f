"""Digests of a model's whole training state, to prove that a resume restored it exactly.

The chief records, beside its checkpoints, the SHA-256 of the state it saved (every model weight and
every optimizer variable: ``iterations``, the learning rate, Adam's moments...); after a restore
every task recomputes it from the restored variables. Equal digests mean the restored weights,
optimizer slots and global step are bit-for-bit the saved ones; CRC checks of the files alone do not
show that the right values reached the right variables.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from kerasdist._files import read_json, write_text_atomic

DIGESTS_FILE = "state-sha256.json"
"""``{checkpoint name: sha256}`` in the checkpoint folder, written by the chief (atomically)."""


def state_digest(model) -> str:
    """SHA-256 (hex, 64 characters) of the bytes of ``model.weights`` then
    ``model.optimizer.variables``, in order."""
    import keras

    digest = hashlib.sha256()
    for variable in [*model.weights, *model.optimizer.variables]:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(variable)).tobytes())
    return digest.hexdigest()


def read(directory: Path) -> dict[str, str]:
    """The recorded digests (empty when missing or unreadable)."""
    data = read_json(Path(directory) / DIGESTS_FILE)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def record(directory: Path, checkpoint: str, digest: str) -> None:
    """Add ``checkpoint``'s digest (before it is written); forget the others whose index file is
    gone."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    kept = {name: value for name, value in read(directory).items()
            if (directory / f"{name}.index").exists() or name == Path(checkpoint).name}
    kept[Path(checkpoint).name] = digest
    write_text_atomic(directory / DIGESTS_FILE, json.dumps(kept, indent=1))

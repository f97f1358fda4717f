"""Per-task scratch folders (no TensorFlow, no Keras: the local launcher deletes them without
importing either, which would add seconds before the first task starts)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path


def temp_dir(directory: Path, task_name: str) -> Path:
    """A non-chief task's scratch folder for its throw-away saves: in the system temp folder, named
    after the run's checkpoint folder and the task, so the next attempt of the same task finds and
    deletes what a killed attempt left."""
    key = hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"kerasdist-{key}-{task_name.replace(':', '-')}"

"""Files written atomically: a crash never leaves a truncated file in place.

Each file is written to a temporary name in the same folder and moved over the old one with
``os.replace`` (atomic on POSIX and Windows within one filesystem).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def temp_path(target: Path, suffix: str) -> Path:
    """A new, empty temporary file beside ``target`` (``.<name>.<random><suffix>``)."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    return Path(name)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file + ``os.replace``."""
    path = Path(path)
    tmp = temp_path(path, ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented, strictly valid JSON (NaN and infinities become ``null``),
    atomically."""
    text = json.dumps(_finite(data), indent=2, sort_keys=False, default=str, allow_nan=False)
    return write_text_atomic(path, text + "\n")


__all__ = ["temp_path", "write_json_atomic", "write_text_atomic"]

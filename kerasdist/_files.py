"""The files kerasdist writes and reads back: written atomically (a crash never leaves a truncated
file in place: each is written to a temporary name in the same folder and moved over the old one
with ``os.replace``, atomic within one filesystem), read without raising."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def write_atomic(path: str | Path, write: Callable[[Path], object], suffix: str = ".tmp") -> Path:
    """``write(temporary path)``, then move the temporary file (named ``.<name>.<random><suffix>``
    beside ``path``) over ``path``; the temporary file is removed whatever happens."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


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


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``, or None when the file is missing, unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


__all__ = ["read_json", "write_atomic", "write_json_atomic", "write_text_atomic"]

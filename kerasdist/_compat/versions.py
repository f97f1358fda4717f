"""The TensorFlow and Keras versions kerasdist is tested with (:data:`SUPPORTED`, the same range as
``pyproject.toml``'s pins: ``tests/unit/test_compat.py`` checks; what CI runs on it:
``docs/architecture.md``), and the one-line warning for any other version, which is not refused:
the mends still install by their probes. Reads package metadata only (no TensorFlow import).
"""

from __future__ import annotations

from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

SUPPORTED = {"tensorflow": ">=2.20,<2.22", "keras": ">=3.14,<3.16"}
_DISTRIBUTIONS = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"), "keras": ("keras",)}
_WARNED: list[str] = []


def installed() -> dict[str, str | None]:
    """``{"tensorflow": "2.21.0", "keras": "3.15.1"}`` from the installed packages' metadata
    (None for one that is not installed)."""
    found: dict[str, str | None] = {}
    for key, names in _DISTRIBUTIONS.items():
        found[key] = None
        for name in names:
            try:
                found[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def untested(versions: dict[str, str | None] | None = None) -> dict[str, str]:
    """``{package: version}`` for each installed TensorFlow/Keras outside :data:`SUPPORTED`
    (pre-releases of a supported minor count as inside; an unparsable version as outside)."""
    versions = installed() if versions is None else versions
    outside = {}
    for key, spec in SUPPORTED.items():
        version = versions.get(key)
        if version is None:
            continue
        try:
            inside = SpecifierSet(spec).contains(Version(version), prereleases=True)
        except InvalidVersion:
            inside = False
        if not inside:
            outside[key] = version
    return outside


def warning_line(versions: dict[str, str | None] | None = None) -> str | None:
    """The warning for untested versions, or None when every version is inside the range."""
    outside = untested(versions)
    if not outside:
        return None
    shown = ", ".join(f"{key} {version} (tested: {SUPPORTED[key]})" for key, version in outside.items())
    return (f"untested version: {shown}; the mends install by their probes, see `kerasdist env` "
            "for which are active")


def warn_if_untested(logger) -> str | None:
    """Log :func:`warning_line` once per process on ``logger`` (a warning, never an error).
    Returns the line when one was logged by this call."""
    line = warning_line()
    if line is None or line in _WARNED:
        return None
    _WARNED.append(line)
    logger.warning("%s", line)
    return line

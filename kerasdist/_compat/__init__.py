"""Version-gated mends of upstream Keras/TensorFlow bugs. Each names its upstream issue.

``apply()`` installs every mend whose bug is present in the installed versions; it is idempotent.
"""

from __future__ import annotations


def apply() -> list[str]:
    """Install the mends needed by the installed Keras/TF; return the names of those applied."""
    return []

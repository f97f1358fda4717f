"""``python -m kerasdist``: the same as the ``kerasdist`` console script."""

import sys

from kerasdist.cli import console

if __name__ == "__main__":
    sys.exit(console())

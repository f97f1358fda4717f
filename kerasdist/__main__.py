"""``python -m kerasdist``: the same as the ``kerasdist`` console script."""

import sys

from kerasdist.cli import main

if __name__ == "__main__":
    sys.exit(main())

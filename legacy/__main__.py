"""``python -m legacy <flow>``: see legacy/runner.py."""

import sys

from legacy.runner import main

sys.exit(main())

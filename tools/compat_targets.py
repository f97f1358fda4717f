"""Write ``tests/unit/compat_targets.json``: every symbol a kerasdist mend patches, with the mend's
name and the upstream signature on the installed Keras/TF (issue 32: a probe per patched symbol).

``tests/unit/test_compat.py::test_every_patched_symbol_is_still_upstream_as_the_mend_expects``
checks the installed versions against it, one test per symbol. Regenerate it (and read the
mends of every symbol whose signature changed) when the supported range moves::

    python tools/compat_targets.py            # write the table
    python tools/compat_targets.py --check    # print {"symbols": N, "differ": {...}} (tools/canary.py)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "compat_targets.json"


def table() -> dict[str, dict[str, str]]:
    """``{"module.Class.attribute": {"mend": name, "signature": "(self, ...)"}}``."""
    from kerasdist import _compat
    from kerasdist._compat import _patch

    return {name: {"mend": mend, "signature": _patch.signature(_patch.original(owner, attribute))}
            for mend, name, owner, attribute in _compat.targets()}


def check() -> dict:
    """The symbols whose mend or signature differs from the table: ``{name: [table, here]}``."""
    now, ref = table(), json.loads(OUT.read_text())
    return {"symbols": len(now),
            "differ": {k: [ref.get(k), now.get(k)] for k in sorted(set(ref) | set(now))
                       if ref.get(k) != now.get(k)}}


if __name__ == "__main__":
    sys.path.insert(0, str(OUT.parent.parent.parent))
    if sys.argv[1:] == ["--check"]:
        print(json.dumps(check()))
    else:
        OUT.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {OUT}")

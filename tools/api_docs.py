"""Build the Python API reference from kerasdist's docstrings with pdoc (docs/api.md).

    python tools/api_docs.py [OUT]          # default OUT: site/api (git-ignored)

pdoc documents only the submodules a package lists in ``__all__``, and kerasdist's packages list
the names they export, so ``pdoc kerasdist`` alone writes one page; this passes every public
module (no ``._`` in its dotted name) explicitly, with ``-d google`` for the Google-style
``Args:``/``Returns:``/``Raises:`` sections. Needs ``pip install -e ".[docs]"`` (pdoc).
"""

from __future__ import annotations

import pkgutil
import sys
import warnings
from pathlib import Path


def public_modules() -> list[str]:
    """Dotted names of kerasdist and every public submodule, sorted.

    Returns:
        e.g. ``["kerasdist", "kerasdist.bench", ...]``; private modules (``kerasdist._compat.*``,
        ``kerasdist.__main__``) are left out.
    """
    import kerasdist

    found = {m.name for m in pkgutil.walk_packages(kerasdist.__path__, "kerasdist.")}
    return ["kerasdist", *sorted(name for name in found if "._" not in name)]


def build(out: Path, modules: list[str] | None = None) -> Path:
    """Write the HTML reference of ``modules`` (default: :func:`public_modules`) into ``out``.

    Returns:
        ``out``; open ``out/index.html``.

    Raises:
        ModuleNotFoundError: pdoc is not installed.
    """
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google")
    with warnings.catch_warnings():  # "module specification ... named twice": harmless
        warnings.simplefilter("ignore")
        pdoc.pdoc(*(modules or public_modules()), output_directory=Path(out))
    return Path(out)


if __name__ == "__main__":
    target = build(Path(sys.argv[1] if len(sys.argv) > 1 else "site/api"))
    print(f"wrote {target / 'index.html'}")

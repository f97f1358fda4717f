"""The package version, in a module of its own so that every layer can read it without importing
the package ``__init__`` (which would make ``kerasdist`` import itself)."""

__version__ = "0.2.0"

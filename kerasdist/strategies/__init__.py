"""Strategy registry: ``default`` and ``mirrored`` (one host, synchronous), more to come."""

from kerasdist.strategies.registry import available, build, get, register

__all__ = ["available", "build", "get", "register"]

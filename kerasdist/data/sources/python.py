"""Source ``python``: the user's ``data.source.function`` returns a split's ``tf.data.Dataset``
(:mod:`kerasdist.data.python_source`)."""

from __future__ import annotations

from kerasdist.data import python_source
from kerasdist.data.sources.base import FunctionKind


class PythonKind(FunctionKind):
    kind = "python"

    def function(self, config):
        return python_source.load_function(config)

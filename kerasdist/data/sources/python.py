"""Source ``python``: the user's ``data.source.function`` (an import path ``pkg.module:function``)
returns a split's ``tf.data.Dataset``, streamed as every function source is
(:mod:`kerasdist.data.sources.functions`, which states the function's contract).

Security: the import path is imported and called, like any Python file you run; a recipe naming
it is as trusted as that code.
"""

from __future__ import annotations

from typing import Callable

from kerasdist.data.sources.functions import FunctionKind
from kerasdist.errors import DataError
from kerasdist.importpath import import_attribute, is_builtin, require_kind


def load_function(config) -> Callable:
    """Import ``data.source.function`` and check it is a function taking ``split`` (nothing is called).

    Raises:
        DataError: the module does not import, has no callable of that name, or it is not a
            function of one positional argument (a class, a built-in, the standard library).
    """
    path = config.source.function
    fn = import_attribute(path, field="data.source.function", error=DataError,
                          received=f"function='{path}'", what="Python function")
    if is_builtin(fn):
        raise DataError(f"data.source.function: '{path}' is a Python built-in, not a data "
                        f"function of your own. Received: function='{path}'")
    # checked before it is ever called: a function of (split) (not a class, not the stdlib)
    return require_kind(fn, path, field="data.source.function", error=DataError,
                        what="a function (split, input_context=None) -> tf.data.Dataset",
                        function_args=(1,))


class PythonKind(FunctionKind):
    kind = "python"

    def function(self, config):
        return load_function(config)

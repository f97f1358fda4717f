"""Registry of model builders: name -> builder plus the loss and metrics it trains with.

A builder is a function of keyword arguments returning an *uncompiled* ``keras.Model``. Recipes name
a registered builder (``model.name: mnist_cnn``) or any importable one (``my_pkg.models:build``).
Lookup and argument checking never import TensorFlow, so ``kerasdist validate`` stays fast.

An import path runs code: importing ``pkg.module`` executes it, and training calls the function
with ``model.params``, like any Python file you run. Inside :func:`no_imports` (what
``kerasdist validate`` does unless given ``--import``) an import path is checked for syntax only
and never imported, and its ``model.params`` are not checked against the builder. Built-in
callables (``os:system``, ``builtins:eval``) are refused as builders, but that is a guard against
mistakes, not a sandbox: a recipe with an import path is as trusted as the code it names.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from kerasdist.errors import RecipeError
from kerasdist.importpath import import_attribute, is_builtin, require_kind


@dataclass(frozen=True)
class ModelSpec:
    """A registered builder with its default loss and metrics (Keras identifiers)."""

    build: Callable[..., Any]
    loss: str
    metrics: tuple[str, ...] = field(default_factory=tuple)
    task: str = "classification"
    imported: bool = True
    """False for an import path checked for syntax only (inside :func:`no_imports`)."""


_REGISTRY: dict[str, ModelSpec] = {}
_IMPORTS = contextvars.ContextVar("kerasdist_import_builders", default=True)


@contextlib.contextmanager
def no_imports():
    """Within this block, import paths in ``model.name`` are checked for syntax only, never
    imported (``kerasdist validate`` without ``--import``)."""
    token = _IMPORTS.set(False)
    try:
        yield
    finally:
        _IMPORTS.reset(token)


def is_import_path(name: str) -> bool:
    """True when ``name`` is an import path ``pkg.module:function`` rather than a registered name."""
    _load_builtin()
    return name not in _REGISTRY and ":" in name


def register(name: str, *, loss: str, metrics: tuple[str, ...] = (), task: str = "classification"):
    """Decorator registering ``fn`` as builder ``name``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[name] = ModelSpec(build=fn, loss=loss, metrics=tuple(metrics), task=task)
        return fn

    return wrap


def available() -> list[str]:
    """Names of the registered builders, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    """Register the seed builders (done here, so that ``seed`` does not import the registry)."""
    if "mnist_cnn" not in _REGISTRY:
        from kerasdist.models import seed

        register("mnist_cnn", loss="sparse_categorical_crossentropy_from_logits",
                 metrics=("accuracy",))(seed.mnist_cnn)
        register("linear", loss="mse", metrics=(), task="regression")(seed.linear)
        from kerasdist.models import recommender

        register("click_model", loss="binary_crossentropy",
                 metrics=("accuracy",))(recommender.click_model)


def resolve(name: str, loss: str | None = None, metrics: list[str] | None = None) -> ModelSpec:
    """Return the :class:`ModelSpec` for ``name`` (registered name or ``module:function``).

    Raises:
        RecipeError: unknown name, unimportable path, or a custom builder without ``loss``.
    """
    _load_builtin()
    if name in _REGISTRY:
        spec = _REGISTRY[name]
    elif ":" in name:
        _check_import_path(name)
        if _IMPORTS.get():
            spec = ModelSpec(build=_import_builder(name), loss=loss or "", metrics=())
        else:
            spec = ModelSpec(build=_not_imported, loss=loss or "", metrics=(), imported=False)
        if not loss:
            raise RecipeError(
                f"model.loss is required for the custom builder '{name}'. Received: loss=None"
            )
    else:
        raise RecipeError(
            f"model.name: unknown model '{name}'. Available: {', '.join(available())}, "
            "or an import path 'package.module:function'."
        )
    return dataclasses.replace(spec, loss=loss or spec.loss,
                               metrics=tuple(metrics) if metrics is not None else spec.metrics)


def _not_imported(**_params):
    raise RecipeError("model.name: this import path was checked for syntax only (no_imports()); "
                      "it cannot build a model")


def _check_import_path(path: str) -> None:
    module_name, _, attr = path.partition(":")
    if not (all(part.isidentifier() for part in module_name.split(".")) and attr.isidentifier()):
        raise RecipeError("model.name: not an import path 'package.module:function'. "
                          f"Received: name='{path}'")


def _import_builder(path: str) -> Callable[..., Any]:
    """The builder an import path names, checked before it is ever called: a ``keras.Model``
    subclass or a function (not a class of any other kind, a built-in or the standard library).

    Raises:
        RecipeError: naming ``model.name`` and the path.
    """
    builder = import_attribute(path, field="model.name", error=RecipeError,
                               received=f"name='{path}'", what="callable")
    if is_builtin(builder):
        raise RecipeError(f"model.name: '{path}' is a built-in callable, not a model builder (a "
                          "Python function or class returning an uncompiled keras.Model). "
                          f"Received: name='{path}'")
    classes: tuple[type, ...] = ()
    if inspect.isclass(builder):  # Keras only for a class: a function needs no TF import here
        import keras

        classes = (keras.Model,)
    return require_kind(builder, path, field="model.name", error=RecipeError,
                        what="a function returning an uncompiled keras.Model, or a keras.Model "
                             "subclass", classes=classes,
                        function_args=None if classes else ())


def check(config: Any) -> ModelSpec:
    """Validate a :class:`~kerasdist.config.ModelConfig`: name resolves and params fit the builder.

    Raises:
        RecipeError: naming ``model.name`` or ``model.params.<key>``.
    """
    spec = resolve(config.name, config.loss, config.metrics)
    if not spec.imported:
        return spec
    try:
        sig = inspect.signature(spec.build)
    except (TypeError, ValueError):  # a callable without an introspectable signature
        return spec
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    if not takes_kwargs:
        for key in config.params:
            if key not in sig.parameters:
                raise RecipeError(
                    f"model.params.{key}: not a parameter of model '{config.name}' "
                    f"(accepted: {', '.join(sig.parameters) or 'none'}). Received: {key}="
                    f"{config.params[key]!r}"
                )
    return spec


def build(config: Any):
    """Build the uncompiled ``keras.Model`` described by a ``ModelConfig``."""
    spec = check(config)
    return spec.build(**config.params)

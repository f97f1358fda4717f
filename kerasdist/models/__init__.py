"""Model builders: the seed CNN and linear regression, plus a registry for user builders."""

from kerasdist.models.registry import ModelSpec, available, build, register, resolve
from kerasdist.models.seed import linear, mnist_cnn

__all__ = ["ModelSpec", "available", "build", "linear", "mnist_cnn", "register", "resolve"]

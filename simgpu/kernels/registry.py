"""The kernel models by name, and the chain :func:`make_predictor` builds of them.

Each model's module imports :mod:`simgpu.kernels.base` and registers itself there; this module
imports the models (when a predictor is first made), and no model imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config.platform import PlatformSpec
from .base import MODELS, Chain, Predictor


def make_predictor(names: str | Sequence[str], platform: PlatformSpec) -> Predictor:
    """A chain of the named models, in order (a single name gives that model alone)."""
    from . import analytical, learned, measured  # noqa: F401  (registration on import)

    seq = [names] if isinstance(names, str) else list(names)
    models = []
    for name in seq:
        try:
            models.append(MODELS[name](platform))
        except KeyError:
            raise KeyError(f"unknown kernel model {name!r}; known: {', '.join(sorted(MODELS))}") from None
    return models[0] if len(models) == 1 else Chain(models)

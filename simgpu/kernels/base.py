"""The kernel-time predictor interface and the registry of kernel models.

A predictor times a list of :class:`~simgpu.workload.graph.KernelSpec` in one call, before the
event loop; it returns seconds per kernel and the name of the model that timed each one, so that a
report can say which model timed which share of the iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ..config.platform import PlatformSpec
from ..workload.graph import KernelSpec


class Predictor(Protocol):
    """``predict(kernels)`` -> (seconds per kernel, model name per kernel)."""

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]: ...


PredictorFactory = Callable[[PlatformSpec], Predictor]
_MODELS: dict[str, PredictorFactory] = {}


def register(name: str) -> Callable[[PredictorFactory], PredictorFactory]:
    def deco(factory: PredictorFactory) -> PredictorFactory:
        if name in _MODELS:
            raise ValueError(f"kernel model {name!r} is registered twice")
        _MODELS[name] = factory
        return factory
    return deco


def make_predictor(name: str, platform: PlatformSpec) -> Predictor:
    from . import analytical  # noqa: F401  (registration on import)

    try:
        return _MODELS[name](platform)
    except KeyError:
        raise KeyError(f"unknown kernel model {name!r}; known: {', '.join(sorted(_MODELS))}") from None

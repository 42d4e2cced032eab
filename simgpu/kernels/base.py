"""The kernel-time predictor interface, the registry of kernel models, and their chain.

A predictor times a list of :class:`~simgpu.graph.KernelSpec` in one call, before the
event loop; it returns seconds per kernel and the name of the model that timed each one, so that a
report can say which model timed which share of the iteration. A :class:`Chain` asks its models in
order and gives each kernel to the first that ``supports`` it (for example measured durations, then
a learned model where the platform has data for the family, then the analytical model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ..config.platform import PlatformSpec
from ..graph import KernelSpec


class Predictor(Protocol):
    """``predict(kernels)`` -> (seconds per kernel, model name per kernel)."""

    name: str

    def supports(self, kernel: KernelSpec) -> bool: ...

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]: ...


class Chain:
    """The first model that supports a kernel times it; all kernels of a model in one call."""

    name = "chain"

    def __init__(self, models: Sequence[Predictor]) -> None:
        if not models:
            raise ValueError("a chain needs at least one kernel model")
        self.models = list(models)

    def supports(self, kernel: KernelSpec) -> bool:
        return any(m.supports(kernel) for m in self.models)

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]:
        out = np.full(len(kernels), np.nan)
        names = [""] * len(kernels)
        todo = list(range(len(kernels)))
        for model in self.models:
            mine = [i for i in todo if model.supports(kernels[i])]
            if mine:
                secs, who = model.predict([kernels[i] for i in mine])
                for j, i in enumerate(mine):
                    out[i], names[i] = secs[j], who[j]
                todo = [i for i in todo if names[i] == ""]
        if todo:
            fams = sorted({kernels[i].family for i in todo})
            raise ValueError(f"no kernel model can time the families: {', '.join(fams)}")
        return out, names


PredictorFactory = Callable[[PlatformSpec], Predictor]
_MODELS: dict[str, PredictorFactory] = {}


def register(name: str) -> Callable[[PredictorFactory], PredictorFactory]:
    def deco(factory: PredictorFactory) -> PredictorFactory:
        if name in _MODELS:
            raise ValueError(f"kernel model {name!r} is registered twice")
        _MODELS[name] = factory
        return factory
    return deco


def make_predictor(names: str | Sequence[str], platform: PlatformSpec) -> Predictor:
    """A chain of the named models, in order (a single name gives that model alone)."""
    from . import analytical, learned  # noqa: F401  (registration on import)

    seq = [names] if isinstance(names, str) else list(names)
    models = []
    for name in seq:
        try:
            models.append(_MODELS[name](platform))
        except KeyError:
            raise KeyError(f"unknown kernel model {name!r}; known: {', '.join(sorted(_MODELS))}") from None
    return models[0] if len(models) == 1 else Chain(models)

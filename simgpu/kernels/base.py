"""The kernel-time predictor interface, the table kernel models register in, and their chain.

A predictor times a list of :class:`~simgpu.graph.KernelSpec` in one call, before the
event loop; it returns seconds per kernel and the name of the model that timed each one, so that a
report can say which model timed which share of the iteration. A :class:`Chain` asks its models in
order and gives each kernel to the first that ``supports`` it (for example measured durations, then
a learned model where the platform has data for the family, then the analytical model). Each
model registers itself here by name as its module is imported; :mod:`simgpu.kernels.registry`
imports the models and makes chains of them.
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
#: The kernel models by name (filled as their modules are imported).
MODELS: dict[str, PredictorFactory] = {}


def register(name: str) -> Callable[[PredictorFactory], PredictorFactory]:
    def deco(factory: PredictorFactory) -> PredictorFactory:
        if name in MODELS:
            raise ValueError(f"kernel model {name!r} is registered twice")
        MODELS[name] = factory
        return factory
    return deco

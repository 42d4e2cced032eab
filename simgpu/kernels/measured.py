"""Measured kernel durations: the kernel model of a replayed trace.

A kernel of family ``measured`` carries its own duration (``us``, microseconds, as a profiler
recorded it, possibly re-scaled by a what-if); this model returns it unchanged, in seconds. It
supports no other family, so in a chain (``("measured", "analytical")``) every other kernel falls
through to the next model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config.platform import PlatformSpec
from ..graph import KernelSpec
from .base import register

#: The kernel family this model times.
FAMILY = "measured"


class Measured:
    """Times ``measured`` kernels by the duration they carry (parameter ``us``)."""

    name = "measured"

    def supports(self, kernel: KernelSpec) -> bool:
        return kernel.family == FAMILY

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]:
        out = np.empty(len(kernels))
        for i, k in enumerate(kernels):
            if k.family != FAMILY:
                raise ValueError(f"the measured model does not time kernel family {k.family!r}")
            us = k.get("us")
            if not us >= 0:
                raise ValueError(f"a measured kernel needs a duration us >= 0, got {us}")
            out[i] = us * 1e-6
        return out, [self.name] * len(kernels)


@register("measured")
def _factory(platform: PlatformSpec) -> Measured:
    return Measured()

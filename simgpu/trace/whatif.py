"""Re-timing a trace for another platform: compute kernels by GPU ratios, collectives by their size.

A measured kernel is scaled by how much longer (or shorter) the same work takes on the target GPU
than on the traced one: where its GEMM shape is known, by the ratio of the kernel model's times on
the two platforms; otherwise by its class: peak FLOP/s (times achievable efficiency) for
compute-bound kernels (GEMM, convolution, attention), HBM bandwidth for memory-bound ones (and for
kernels of unknown class), PCIe bandwidth for host copies. On the same GPU every ratio is 1.

Collectives are re-timed by the engine's collective model from their sizes; a collective whose size
the trace does not record gets the size whose collective-model time on the traced platform is
its measured time (an upper bound, since measured NCCL kernels include waiting for peers). Group
mapping for another world size assumes data parallelism: a group spanning the traced world spans
the new one; a strided subgroup keeps its size and stride.

Units: seconds and bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..comm.plan import CollectiveRequest
from ..comm.planner import Planner
from ..config.platform import PlatformSpec
from ..graph import KernelSpec
from ..kernels.registry import make_predictor
from ..platform.topology import Topology
from .classify import KernelInfo

#: Largest collective size considered when inferring one from its time (bytes), and the bisection steps.
MAX_BYTES, BISECTIONS = 1 << 44, 48


def _flops_rate(p: PlatformSpec, dtype: str) -> float:
    peaks = {str(k): float(v) for k, v in p.gpu.peak_tflops.items()}
    for d in (dtype, "fp32", "tf32", "bf16"):
        if d in peaks:
            return float(peaks[d]) * 1e12 * p.gpu.matmul_efficiency
    raise ValueError(f"{p.gpu.name} has no peak TFLOP/s in its platform file")


def _hbm(p: PlatformSpec) -> float:
    return p.gpu.hbm_gbytes_per_s * 1e9 * p.gpu.memory_efficiency


def _pcie(p: PlatformSpec) -> float:
    return p.node.pcie.gbytes_per_s * 1e9 * p.node.pcie.efficiency


class Retimer:
    """Scale factors (target time / traced time) of measured kernels; see the module docstring."""

    def __init__(self, source: PlatformSpec, target: PlatformSpec, kernel_model: str = "analytical") -> None:
        self.source, self.target = source, target
        self.same = source.gpu == target.gpu and source.node.pcie == target.node.pcie
        self.kernel_model = kernel_model
        self.by_model = 0

    def factors(self, infos: Sequence[KernelInfo]) -> list[float]:
        """One factor per info; GEMMs with known shapes are timed in one bulk call per platform."""
        if self.same:
            return [1.0] * len(infos)
        out = [self._class_factor(i) for i in infos]
        shaped = [k for k, i in enumerate(infos) if i.gemm is not None and i.dtype in self.target.gpu.peak_tflops
                  and i.dtype in self.source.gpu.peak_tflops]
        if shaped:
            specs = []
            for k in shaped:
                b, m, n, kk = infos[k].gemm or (0.0, 0.0, 0.0, 0.0)
                specs.append(KernelSpec.make("gemm", infos[k].dtype, b=b, m=m, n=n, k=kk))
            t_src, _ = make_predictor(self.kernel_model, self.source).predict(specs)
            t_tgt, _ = make_predictor(self.kernel_model, self.target).predict(specs)
            for j, k in enumerate(shaped):
                if t_src[j] > 0 and math.isfinite(t_tgt[j] / t_src[j]):
                    out[k] = float(t_tgt[j] / t_src[j])
                    self.by_model += 1
        return out

    def _class_factor(self, info: KernelInfo) -> float:
        s, t = self.source, self.target
        if info.cls == "flops":
            return _flops_rate(s, info.dtype) / _flops_rate(t, info.dtype)
        if info.cls == "pcie":
            return _pcie(s) / _pcie(t)
        return _hbm(s) / _hbm(t)


class SizeInference:
    """Bytes a collective must have moved to take its measured time on the traced platform."""

    def __init__(self, source: PlatformSpec, world: int) -> None:
        gpn = min(max(world, 1), source.node.gpus)
        self.topo = Topology(source, math.ceil(max(world, 1) / gpn), gpn)
        self.planner = Planner(self.topo, source.collectives)
        self._found: dict[tuple[str, int, float], int] = {}

    def time(self, op: str, n: int, nbytes: int) -> float:
        """Seconds ``op`` of ``nbytes`` over ``n`` ranks takes alone on the traced platform."""
        group = (0, n - 1) if op == "send_recv" else tuple(range(n))
        return self.planner.plan(CollectiveRequest(op, group, nbytes)).isolated_time(self.topo)

    def nbytes(self, op: str, group_size: int, duration_s: float) -> int:
        """The size whose collective-model time is ``duration_s`` (bisection on a log scale)."""
        n = min(group_size, self.topo.world)
        key = (op, n, round(duration_s, 7))
        if n < 2:
            return 0
        if key not in self._found:
            lo, hi = 0.0, math.log2(MAX_BYTES)
            if self.time(op, n, 1) >= duration_s:
                self._found[key] = 0
            else:
                for _ in range(BISECTIONS):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if self.time(op, n, int(2**mid)) < duration_s else (lo, mid)
                self._found[key] = int(2**lo)
        return self._found[key]


def group_of(rank: int, group: tuple[int, ...], traced_world: int, world: int) -> tuple[int, ...] | None:
    """The members of ``rank``'s group in a job of ``world`` ranks, for a traced ``group``.

    A group of the whole traced world becomes the whole new world; a group of ``g`` ranks with a
    constant stride ``s`` becomes the ``g`` ranks with stride ``s`` around ``rank`` (blocks of
    ``g * s``); None when the pattern is irregular or does not tile ``world``.
    """
    g = len(group)
    if g == traced_world or g == 0:
        return tuple(range(world))
    stride = group[1] - group[0] if g > 1 else 1
    if stride <= 0 or any(group[i + 1] - group[i] != stride for i in range(g - 1)):
        return None
    block = g * stride
    if world % block:
        return None
    base = (rank // block) * block + rank % stride
    return tuple(base + k * stride for k in range(g))

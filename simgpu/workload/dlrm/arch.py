"""The dense side of a DLRM: bottom MLP, feature interaction and top MLP.

This module owns the dense layers and their parameters in the order backward makes their gradients
ready, the forward and backward ops of the three interactions (``dot``: pairwise dot products of
the bottom output and the pooled embeddings; ``cat``: their concatenation; ``dcn``: DCNv2 cross
layers ``x_{l+1} = x0 * (W x_l + b) + x_l`` over the concatenation, W optionally of low rank
``U V``), the activations the dense side keeps for backward, and the useful FLOPs. It emits ops
only; the MLPs themselves are :mod:`simgpu.workload.common`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config.dlrm import DLRMModel
from ..common import Emitter, GradBuckets, Linear, Param, aux_dtype, dtype_bytes, linear_bwd, linear_fwd
from .embedding import Table


@dataclass(frozen=True)
class Arch:
    """The dense layers. ``cross`` holds the DCN layers' linears in forward order (per layer V then
    W when of low rank, W alone at full rank); ``width`` is the top MLP's input width."""

    interaction: str
    bottom: tuple[Linear, ...]
    cross: tuple[Linear, ...]
    top: tuple[Linear, ...]
    features: int  # F, embedding tables
    dim: int       # the bottom MLP's output width
    emb_dims: int  # sum of the tables' dims
    width: int     # top MLP input width
    low_rank: bool = False

    @property
    def linears(self) -> tuple[Linear, ...]:
        return self.bottom + self.cross + self.top

    @property
    def dense_numel(self) -> int:
        return sum(lin.numel for lin in self.linears)

    @property
    def cross_width(self) -> int:
        """Width of the DCN's x0: the bottom output and every pooled embedding."""
        return self.dim + self.emb_dims

    def ready_order(self, replicated: Sequence[Param] = ()) -> list[Param]:
        """Parameters in the order backward makes their gradients ready: top MLP, cross layers,
        the ``replicated`` (data-parallel) embedding tables, bottom MLP, each layer last to first."""
        def rev(layers: Sequence[Linear]) -> list[Param]:
            return [p for lin in reversed(layers) for p in lin.params]
        return rev(self.top) + rev(self.cross) + list(replicated) + rev(self.bottom)


def make_arch(model: DLRMModel, tables: Sequence[Table]) -> Arch:
    f = len(tables)
    d = model.bottom_mlp[-1]
    emb = sum(t.dim for t in tables)
    cross: list[Linear] = []
    # dot: the bottom output and the pairwise dot products; cat and dcn: everything side by side
    width = d + f * (f + 1) // 2 if model.interaction == "dot" else d + emb
    if model.dcn is not None:
        r = model.dcn.low_rank
        for i in range(model.dcn.layers):
            if r is None:
                cross.append(Linear(f"cross{i}.w", width, width))
            else:
                cross += [Linear(f"cross{i}.v", width, r, bias=False), Linear(f"cross{i}.w", r, width)]
    widths_b = [model.dense_features, *model.bottom_mlp]
    widths_t = [width, *model.top_mlp]
    bottom = tuple(Linear(f"bot{i}", widths_b[i], widths_b[i + 1]) for i in range(len(model.bottom_mlp)))
    top = tuple(Linear(f"top{i}", widths_t[i], widths_t[i + 1]) for i in range(len(model.top_mlp)))
    low = model.dcn is not None and model.dcn.low_rank is not None
    return Arch(model.interaction, bottom, tuple(cross), top, f, d, emb, width, low)


def _cross_layers(arch: Arch) -> list[tuple[Linear, ...]]:
    step = 2 if arch.low_rank else 1
    return [arch.cross[i:i + step] for i in range(0, len(arch.cross), step)]


def interaction_fwd(em: Emitter, arch: Arch, b: int, precision: str, *, deps: Sequence[int],
                    cast_weights: bool = True) -> int:
    """The interaction over ``b`` samples once the pooled embeddings (``deps``) have arrived
    (``cast_weights``: see :func:`~simgpu.workload.common.linear_fwd`)."""
    aux = aux_dtype(precision)
    f, d = arch.features, arch.dim
    if arch.interaction == "dot":
        em.elementwise("interaction.cat", b * (f + 1) * d, 1, 1, aux, op="cat", phase="fwd", deps=deps)
        em.kernel("interaction.bmm", "bmm", precision, phase="fwd", b=b, m=f + 1, n=f + 1, k=d)
        em.elementwise("interaction.triu_gather", b * f * (f + 1) // 2, 1, 1, aux, op="gather", phase="fwd")
        return em.elementwise("interaction.cat_dense", b * arch.width, 1, 1, aux, op="cat", phase="fwd")
    last = em.elementwise("interaction.cat", b * arch.width, 1, 1, aux, op="cat", phase="fwd", deps=deps)
    n = arch.cross_width
    for layer in _cross_layers(arch):
        for lin in layer:
            linear_fwd(em, lin, b, precision, cast_weights=cast_weights)
        # x0 * (W x_l + b) + x_l, fused
        last = em.elementwise(f"{layer[-1].name.rsplit('.', 1)[0]}.mul_add", b * n, 3, 1, aux, op="fma", phase="fwd")
    return last


def interaction_bwd(em: Emitter, arch: Arch, b: int, precision: str, grads: GradBuckets) -> int:
    """Backward of :func:`interaction_fwd`; the cross layers' gradients go to ``grads``."""
    aux = aux_dtype(precision)
    f, d = arch.features, arch.dim
    last = -1
    if arch.interaction == "dot":
        em.elementwise("interaction.triu_scatter", b * (f + 1) ** 2, 1, 1, aux, op="scatter_add", phase="bwd")
        # Z = T @ T^T: dT = dZ @ T + dZ^T @ T
        for i in range(2):
            em.kernel(f"interaction.bmm_bwd{i}", "bmm", precision, phase="bwd", b=b, m=f + 1, n=d, k=f + 1)
        return em.elementwise("interaction.dense_grad_add", b * d, 2, 1, aux, op="add", phase="bwd")
    n = arch.cross_width
    for layer in reversed(_cross_layers(arch)):
        name = layer[-1].name.rsplit(".", 1)[0]
        # g: grad of x_{l+1}. d(W x_l + b) = g * x0; dx0 += g * (W x_l + b)
        em.elementwise(f"{name}.mul_bwd", b * n, 3, 2, aux, op="fma_bwd", phase="bwd")
        for lin in reversed(layer):
            linear_bwd(em, lin, b, precision, grads=grads)
        last = em.elementwise(f"{name}.residual_bwd", b * n, 2, 1, aux, op="add", phase="bwd")  # dx_l += g
    if arch.cross:
        last = em.elementwise("interaction.x0_grad_add", b * n, 2, 1, aux, op="add", phase="bwd")
    return last


def activation_bytes(arch: Arch, b: int, precision: str) -> float:
    """Bytes the dense side keeps for backward over ``b`` samples: each MLP layer's gemm and ReLU
    outputs (the last layer's gemm output only), the interaction's tensors, and the cross layers'
    inputs and intermediate products."""
    width = dtype_bytes(aux_dtype(precision))
    act = sum(2 * b * lin.outputs * width for lin in arch.bottom)
    act += sum((1 if i == len(arch.top) - 1 else 2) * b * lin.outputs * width for i, lin in enumerate(arch.top))
    f, d = arch.features, arch.dim
    if arch.interaction == "dot":
        act += b * ((f + 1) * d + (f + 1) ** 2 + arch.width) * width
    else:
        act += b * arch.width * width
    # per cross layer: x_l, the inner product V x_l (low rank) and W(V x_l) + b
    act += sum(b * lin.outputs * width for lin in arch.cross) + len(_cross_layers(arch)) * b * arch.cross_width * width
    return float(act)


def model_flops(arch: Arch, samples: int) -> float:
    """Useful FLOPs of one iteration: 3x the forward matmuls (MLPs, cross layers and the dot
    interaction's bmm). Embedding lookups are memory traffic, not FLOPs, and are left out."""
    fwd = sum(lin.flops(samples) for lin in arch.linears)
    if arch.interaction == "dot":
        fwd += 2 * samples * (arch.features + 1) ** 2 * arch.dim
    return 3.0 * fwd

"""The slowdown of a kernel beside an NCCL kernel, derived per collective kind from what NCCL takes.

Where no profiler trace of the GPU measures it (``python -m simgpu.trace.overlap``), the figure of
``gpu.overlap_slowdown_by_op`` follows from two shares of the GPU that a running collective holds:

- **SMs**: NCCL's kernel runs one thread block (CTA) per channel, each resident on its own SM for
  the kernel's whole duration (NCCL_MIN_CTAS / NCCL_MAX_CTAS bound the count). A kernel that fills
  the GPU runs on the SMs left, ``c / (S - c)`` slower: the rule the engine applies to a kernel
  beside userbuffers' communication (``Op.sm_taken``). The channels by kind
  (:func:`nccl_ctas`): rings and trees (all-reduce, all-gather, reduce-scatter, broadcast,
  reduce) and all-to-all run on the communicator's channels, twice the rings NCCL finds, one ring
  per NIC of the node (src/graph/connect.cc duplicates the rings; the planner's rule in
  ``simgpu.comm.algorithms.comm_channels``), at most NCCL's MAXCHANNELS (32, src/include/device.h:
  a node of 72 GPUs and 72 NICs runs 32, not 144); an all-reduce in the NVSwitch (NVLS) on
  NCCL_NVLS_NCHANNELS, 16 by default (src/transport/nvls.cc); a send/recv pair on the two channels
  NCCL gives a peer (NCCL_NCHANNELS_PER_NET_PEER, 2, src/graph/paths.cc).
- **HBM**: the collective's bytes cross HBM about three times per byte the GPU receives (the
  peer's write into the receive buffer, the read of it, and the read of the local operand it is
  reduced with or the write of the copy out), at the rate the GPU receives them: the NVLink rate
  within a node, the NIC's across nodes (a ring across nodes runs at its slowest hop, the NIC); a
  kernel bound by memory bandwidth gets what is left, ``u / (1 - u)`` slower.

What the engine applies to a kernel that starts while collectives run on its GPU depends on the
kernel's bound, decided once per kernel shape (:func:`memory_bound`) from the analytical roofline's
two times (its FLOPs at the achievable FLOP/s, its bytes at the achievable HBM bandwidth: the
arithmetic intensity against the ridge point, with the GEMM's tile padding): a compute-bound kernel
(GEMMs, attention at training sizes) pays the op's figure (``gpu.overlap_slowdown_by_op``, the SM
share on the platforms without a measurement); a memory-bound kernel (elementwise, norms,
embeddings, the optimizer, decode-size GEMMs) pays the HBM share of where the collective runs
(``gpu.overlap_slowdown_memory``) while the collective moves bytes (every member has arrived), and
not the SM share: its time is its bytes over the bandwidth it gets, and the bandwidth a kernel
reaches is bound by the loads it keeps in flight, which the SMs left still issue (a streaming
kernel reaches the HBM bandwidth without every SM); an NCCL kernel waiting for its peers holds its
SMs but moves nothing. A platform
without ``overlap_slowdown_memory`` (A100's measured 5%) applies the op's figure to every kernel,
as the figure was measured: over every kernel beside the collective. ``python -m
simgpu.kernels.overlap [PLATFORM ...]`` prints both shares per kind, the measured figure where the
platform has one, and what applies to each bound.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..config.platform import GPUSpec, PlatformSpec
from ..graph import KernelSpec
from .analytical import Analytical

#: The collective ops of ``gpu.overlap_slowdown_by_op``.
KINDS: Final = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "reduce")
#: NCCL_NVLS_NCHANNELS' default: the channels of an all-reduce in the NVSwitch (src/transport/nvls.cc).
NVLS_CHANNELS: Final = 16
#: NCCL_NCHANNELS_PER_NET_PEER's default: the channels of one send/recv peer (src/graph/paths.cc).
P2P_PEER_CHANNELS: Final = 2
#: NCCL's MAXCHANNELS: the most channels (thread blocks) a collective's kernel runs on (src/include/device.h).
MAX_CHANNELS: Final = 32
#: HBM bytes per byte a GPU receives in a ring step: the peer's write into the receive buffer, its
#: read, and the local operand's read (reduction) or the copy out's write (gather).
HBM_BYTES_PER_WIRE_BYTE: Final = 3.0
#: The platforms of the shipped DGX nodes, in generation order (the command's default).
SHIPPED: Final = ("dgx_a100", "dgx_h100", "dgx_h200", "dgx_b200")


@dataclass(frozen=True)
class Derived:
    """One collective kind on one GPU: the CTAs NCCL runs and the slowdowns they cause."""

    kind: str
    ctas: int
    sm_slowdown: float    # a kernel that fills the GPU, on the SMs left
    hbm_slowdown: float   # a memory-bound kernel, with the HBM bandwidth left, the collective within a node
    hbm_slowdown_across: float = 0.0  # the same, the collective across nodes (at the NIC's rate)


def nccl_ctas(p: PlatformSpec, kind: str) -> int:
    """Thread blocks (one SM each) NCCL's kernel of ``kind`` runs on a GPU of platform ``p``."""
    if kind not in KINDS:
        raise ValueError(f"collective kind {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "send_recv":
        return P2P_PEER_CHANNELS
    if kind == "all_reduce" and p.node.nvlink is not None and p.node.nvlink.nvls:
        return NVLS_CHANNELS
    rings = min(p.node.gpus, p.network.nics_per_node)
    return min(MAX_CHANNELS, 2 * max(1, rings))


def _hbm(p: PlatformSpec) -> float:
    return p.gpu.hbm_gbytes_per_s * p.gpu.memory_efficiency


def hbm_share(p: PlatformSpec) -> float:
    """The fraction of the GPU's achievable HBM bandwidth a collective at the NVLink rate takes."""
    nv = p.node.nvlink
    wire = nv.gbytes_per_s * nv.efficiency if nv is not None else p.node.pcie.gbytes_per_s * p.node.pcie.efficiency
    return min(0.9, HBM_BYTES_PER_WIRE_BYTE * wire / _hbm(p))


def hbm_share_across_nodes(p: PlatformSpec) -> float:
    """The same for a collective across nodes, which a GPU receives at its NICs' achievable rate
    (``nic_gbps`` / 8 per NIC, its share of the node's NICs)."""
    n = p.network
    nics = max(n.nics_per_gpu, n.nics_per_node / p.node.gpus)
    wire = n.nic_gbps / 8.0 * n.efficiency * nics
    return min(0.9, HBM_BYTES_PER_WIRE_BYTE * wire / _hbm(p))


def derive(p: PlatformSpec) -> list[Derived]:
    """The derived slowdowns of every collective kind on platform ``p``'s GPU."""
    u, v = hbm_share(p), hbm_share_across_nodes(p)
    out = []
    for kind in KINDS:
        c = nccl_ctas(p, kind)
        out.append(Derived(kind, c, c / max(1, p.gpu.sms - c), u / (1.0 - u), v / (1.0 - v)))
    return out


def memory_slowdown(p: PlatformSpec) -> dict[str, float]:
    """``gpu.overlap_slowdown_memory`` as derived for platform ``p``: the HBM share's slowdown of a
    memory-bound kernel beside a collective within a node and across nodes."""
    u, v = hbm_share(p), hbm_share_across_nodes(p)
    return {"within_node": u / (1.0 - u), "across_nodes": v / (1.0 - v)}


def memory_bound(kernels: Sequence[KernelSpec], gpu: GPUSpec,
                 memo: dict[KernelSpec, bool] | None = None) -> list[bool]:
    """Per kernel shape, whether it is memory-bound on ``gpu``: the analytical roofline's time of its
    bytes at the achievable HBM bandwidth is at least that of its FLOPs at the achievable FLOP/s
    (an MoE layer's: every grouped GEMM's). Families the analytical model does not know (a replayed
    trace's) count as compute-bound. ``memo`` keeps the answers of one GPU across calls."""
    memo = {} if memo is None else memo
    families = Analytical(gpu)._families  # the roofline's (compute seconds, memory seconds) per family
    out = []
    for k in kernels:
        got = memo.get(k)
        if got is None:
            fn = families.get(k.family)
            if fn is None:
                got = False
            else:
                flops_s, bytes_s = fn(k)
                got = bool(bytes_s >= flops_s)
            memo[k] = got
        out.append(got)
    return out


def applied(p: PlatformSpec, kind: str) -> tuple[float, float, float]:
    """What the engine applies on platform ``p`` beside a collective of ``kind``: to a compute-bound
    kernel, and to a memory-bound one with the collective within a node and across nodes."""
    by_op = {str(k): v for k, v in p.gpu.overlap_slowdown_by_op.items()}
    mem = {str(k): v for k, v in p.gpu.overlap_slowdown_memory.items()}
    op = by_op.get(kind, p.gpu.overlap_slowdown)
    return op, mem.get("within_node", op), mem.get("across_nodes", op)


def main(argv: Sequence[str] | None = None) -> int:
    from ..cli import run_command
    from ..config.loader import load_platform

    ap = argparse.ArgumentParser(prog="python -m simgpu.kernels.overlap", description=__doc__.split("\n\n")[0])
    ap.add_argument("platforms", nargs="*", default=list(SHIPPED), help="platform names or YAML paths")
    args = ap.parse_args(argv)

    def go() -> int:
        print(f"{'':<41}{'derived':-^37} {'applied now':-^29}")
        print(f"{'platform':<10} {'gpu':<18} {'kind':<15} {'ctas':>4} {'sm share':>9} {'hbm node':>9} "
              f"{'hbm net':>8} {'compute':>9} {'mem node':>9} {'mem net':>9}")
        for ref in args.platforms:
            p, _ = load_platform(ref)
            for d in derive(p):
                comp, node, net = applied(p, d.kind)
                print(f"{p.name:<10} {p.gpu.name:<18} {d.kind:<15} {d.ctas:>4} {d.sm_slowdown:>8.1%} "
                      f"{d.hbm_slowdown:>9.1%} {d.hbm_slowdown_across:>8.1%} {comp:>9.1%} {node:>9.1%} {net:>9.1%}")
        print("applied now: a compute-bound kernel pays the op's figure (gpu.overlap_slowdown_by_op, else "
              "overlap_slowdown);\na memory-bound one gpu.overlap_slowdown_memory's figure for a collective within a "
              "node (mem node)\nor across nodes (mem net); without overlap_slowdown_memory the op's figure")
        return 0

    return run_command(go)


if __name__ == "__main__":
    from ..cli import entry
    entry(main)

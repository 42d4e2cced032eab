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
  ``simgpu.comm.algorithms.comm_channels``); an all-reduce in the NVSwitch (NVLS) on
  NCCL_NVLS_NCHANNELS, 16 by default (src/transport/nvls.cc); a send/recv pair on the two channels
  NCCL gives a peer (NCCL_NCHANNELS_PER_NET_PEER, 2, src/graph/paths.cc).
- **HBM**: the collective's bytes cross HBM about three times per byte the GPU receives (the
  peer's write into the receive buffer, the read of it, and the read of the local operand it is
  reduced with or the write of the copy out), at the NVLink rate; a kernel bound by memory
  bandwidth gets what is left, ``u / (1 - u)`` slower.

The engine applies one figure per collective kind to every kernel beside it; the figure derived
here is the SM share's, since the kernels that training overlaps with its collectives are mostly
GEMMs, bound by their SMs. The HBM share is reported as what a memory-bound kernel would lose.
``python -m simgpu.kernels.overlap [PLATFORM ...]`` prints both per kind, with the measured
figure where the platform has one.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..config.platform import PlatformSpec

#: The collective ops of ``gpu.overlap_slowdown_by_op``.
KINDS: Final = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "reduce")
#: NCCL_NVLS_NCHANNELS' default: the channels of an all-reduce in the NVSwitch (src/transport/nvls.cc).
NVLS_CHANNELS: Final = 16
#: NCCL_NCHANNELS_PER_NET_PEER's default: the channels of one send/recv peer (src/graph/paths.cc).
P2P_PEER_CHANNELS: Final = 2
#: HBM bytes per byte a GPU receives in a ring step: the peer's write into the receive buffer, its
#: read, and the local operand's read (reduction) or the copy out's write (gather).
HBM_BYTES_PER_WIRE_BYTE: Final = 3.0
#: The platforms of the shipped DGX nodes, in generation order (the command's default).
SHIPPED: Final = ("dgx_a100", "dgx_h100", "dgx_h200", "dgx_b200")


@dataclass(frozen=True)
class Derived:
    """One collective kind on one GPU: the CTAs NCCL runs and the two slowdowns they cause."""

    kind: str
    ctas: int
    sm_slowdown: float    # a kernel that fills the GPU, on the SMs left
    hbm_slowdown: float   # a memory-bound kernel, with the HBM bandwidth left


def nccl_ctas(p: PlatformSpec, kind: str) -> int:
    """Thread blocks (one SM each) NCCL's kernel of ``kind`` runs on a GPU of platform ``p``."""
    if kind not in KINDS:
        raise ValueError(f"collective kind {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "send_recv":
        return P2P_PEER_CHANNELS
    if kind == "all_reduce" and p.node.nvlink is not None and p.node.nvlink.nvls:
        return NVLS_CHANNELS
    rings = min(p.node.gpus, p.network.nics_per_node)
    return 2 * max(1, rings)


def hbm_share(p: PlatformSpec) -> float:
    """The fraction of the GPU's achievable HBM bandwidth a collective at the NVLink rate takes."""
    nv = p.node.nvlink
    wire = nv.gbytes_per_s * nv.efficiency if nv is not None else p.node.pcie.gbytes_per_s * p.node.pcie.efficiency
    return min(0.9, HBM_BYTES_PER_WIRE_BYTE * wire / (p.gpu.hbm_gbytes_per_s * p.gpu.memory_efficiency))


def derive(p: PlatformSpec) -> list[Derived]:
    """The derived slowdowns of every collective kind on platform ``p``'s GPU."""
    u = hbm_share(p)
    out = []
    for kind in KINDS:
        c = nccl_ctas(p, kind)
        out.append(Derived(kind, c, c / max(1, p.gpu.sms - c), u / (1.0 - u)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from ..cli import run_command
    from ..config.loader import load_platform

    ap = argparse.ArgumentParser(prog="python -m simgpu.kernels.overlap", description=__doc__.split("\n\n")[0])
    ap.add_argument("platforms", nargs="*", default=list(SHIPPED), help="platform names or YAML paths")
    args = ap.parse_args(argv)

    def go() -> int:
        print(f"{'platform':<10} {'gpu':<18} {'kind':<15} {'ctas':>4} {'sms':>4} {'sm share':>9} {'hbm share':>9} "
              f"{'shipped':>8}")
        for ref in args.platforms:
            p, _ = load_platform(ref)
            by_op = {str(k): v for k, v in p.gpu.overlap_slowdown_by_op.items()}
            for d in derive(p):
                shipped = by_op.get(d.kind, p.gpu.overlap_slowdown)
                print(f"{p.name:<10} {p.gpu.name:<18} {d.kind:<15} {d.ctas:>4} {p.gpu.sms:>4} "
                      f"{d.sm_slowdown:>8.1%} {d.hbm_slowdown:>9.1%} {shipped:>8.1%}")
        return 0

    return run_command(go)


if __name__ == "__main__":
    from ..cli import entry
    entry(main)

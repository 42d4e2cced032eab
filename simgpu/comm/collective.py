"""One collective on its own, as nccl-tests measures it: the GPUs it runs on, the request it
makes, the caveats of the prediction, and :func:`bus_bandwidth`, which converts a time as
nccl-tests does. Running it through the engine is :mod:`simgpu.collective_run`'s.
"""

from __future__ import annotations

from ..config.platform import PlatformSpec
from ..errors import ConfigError
from ..platform.topology import Topology
from .plan import CollectiveRequest


def layout(platform: PlatformSpec, nodes: int, gpus_per_node: int | None) -> int:
    """GPUs per node for ``nodes`` nodes of ``platform`` (all of a node's GPUs when not given);
    a :class:`ConfigError` naming the command-line option when either is out of range or the two
    make fewer than 2 GPUs."""
    if nodes < 1:
        raise ConfigError(f"expected --nodes >= 1, got {nodes}", key="--nodes")
    gpn = platform.node.gpus if gpus_per_node is None else gpus_per_node
    if not 1 <= gpn <= platform.node.gpus:
        raise ConfigError(f"expected --gpus-per-node in 1..{platform.node.gpus}, got {gpn}", key="--gpus-per-node")
    if nodes * gpn < 2:
        raise ConfigError("expected at least 2 GPUs in all (a collective of one GPU moves nothing), got "
                          f"{nodes} node(s) x {gpn}", key="--gpus-per-node")
    return gpn


def caveats(topo: Topology, op: str) -> list[str]:
    """Where the validation found this kind of prediction optimistic (docs/accuracy-collectives.md) for a reason
    the platform file can say: one line each, for the nccl-tests view to print above its columns."""
    out = []
    local = range(topo.gpus_per_node)  # node 0's GPUs: every node is wired alike
    staged = any(topo.links[i].kind == "host" for a in local for b in local if a != b for i in topo.edge(a, b).route)
    if staged and op not in ("broadcast", "reduce", "send_recv"):
        out.append("these GPUs exchange data through host memory (PCIe peer-to-peer off): where each GPU sends "
                   "and receives at once, NCCL's shared-memory transport ran well below the predicted speed on "
                   "every machine measured")
        out.append("fit the platform to your own nccl-tests output: python -m simgpu.comm.calibrate")
    return out


#: busbw = algbw * factor(n), nccl-tests' convention per collective
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def bus_bandwidth(op: str, n: int, nbytes: float, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for ``nbytes`` moved in ``seconds`` over ``n`` ranks."""
    alg = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    return alg, alg * BUS_FACTOR[op](n)


def request(op: str, nbytes: int, topo: Topology) -> CollectiveRequest:
    """The request nccl-tests makes for ``op`` of ``nbytes`` over every GPU of ``topo`` (send_recv: the
    first pair, on the world communicator, which is what bounds the ring of pairs when links are
    uniform)."""
    if op == "send_recv":
        return CollectiveRequest(op, (0, 1 % topo.world), nbytes, comm_size=topo.world)
    return CollectiveRequest(op, tuple(range(topo.world)), nbytes)

"""Collective plans: what an algorithm turns a collective into, and the registry of algorithms.

A plan is a set of transfers over the topology (each a coflow of edges moving the same bytes at one
pace, :mod:`simgpu.comm.transfers`, see :mod:`simgpu.comm.network`) plus the latency the algorithm's steps add on top of
moving the bytes. The engine executes plans; algorithms know nothing of SimPy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config.platform import CollectiveSpec, ProtocolSpec
from ..platform.topology import Topology
from .fair import isolated_rates, isolated_time
from .transfers import Transfer, TransferTable


@dataclass(frozen=True, slots=True)
class CollectivePlan:
    """Transfers that run concurrently once ``latency_s`` (launch and per-step costs) has passed."""

    algorithm: str
    transfers: Sequence[Transfer]
    latency_s: float
    protocol: str = ""

    def isolated_time(self, topo: Topology) -> float:
        """Seconds this plan takes alone on the network (no other traffic), for algorithm choice."""
        if not self.transfers or self.latency_s == float("inf"):
            return self.latency_s
        if isinstance(self.transfers, TransferTable):
            return self.latency_s + isolated_time(self.transfers, topo.capacity)
        rates = isolated_rates([(t.links, t.max_rate) for t in self.transfers], topo.capacity)
        return self.latency_s + max(t.nbytes / r for t, r in zip(self.transfers, rates.tolist(), strict=True))


@dataclass(frozen=True)
class CollectiveRequest:
    """A collective as the engine sees it once every member has arrived.

    ``send_matrix[i][j]`` (all-to-all-v) is bytes from member i to member j; ``root`` is a member
    index (broadcast, reduce); ``comm_size`` the ranks of the communicator it runs on (0: the group).
    """

    op: str
    group: tuple[int, ...]
    nbytes: int
    send_matrix: tuple[tuple[int, ...], ...] | None = None
    root: int = 0
    comm_size: int = 0

    @property
    def comm_ranks(self) -> int:
        """Ranks of the communicator the collective runs on."""
        return max(self.comm_size, len(self.group))


Algorithm = Callable[[CollectiveRequest, Topology, CollectiveSpec, ProtocolSpec], CollectivePlan]
#: name -> (function, the collective ops it implements)
ALGORITHMS: dict[str, tuple[Algorithm, frozenset[str]]] = {}


def register(name: str, ops: set[str]) -> Callable[[Algorithm], Algorithm]:
    def deco(fn: Algorithm) -> Algorithm:
        if name in ALGORITHMS:
            raise ValueError(f"collective algorithm {name!r} is registered twice")
        ALGORITHMS[name] = (fn, frozenset(ops))
        return fn
    return deco


def algorithms_for(op: str) -> list[str]:
    return [name for name, (_, ops) in ALGORITHMS.items() if op in ops]

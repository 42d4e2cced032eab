"""The platform's links: a directed channel with its capacity and latency (:class:`Link`), and what
the collective algorithms need of the route between two GPUs (:class:`EdgeInfo`)."""

from __future__ import annotations

from dataclasses import dataclass

#: kinds of link that belong to the network between nodes
NET_KINDS = frozenset({"nic", "spine", "local", "global"})


@dataclass(frozen=True, slots=True)
class Link:
    """A directed channel: ``capacity`` in bytes/s (achievable), ``latency`` in seconds."""

    id: int
    name: str
    kind: str  # "nvlink", "pcie", "nic", "spine", "local", "global" (dragonfly), "host" (staging in host memory)
    capacity: float
    latency: float


@dataclass(frozen=True, slots=True)
class EdgeInfo:
    """What the collective algorithms need of the route between two GPUs (cached per pair)."""

    route: tuple[int, ...]
    latency: float
    hardware: str
    capacity: float
    forwards_chunks: bool

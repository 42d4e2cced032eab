"""A mixed platform's links: each node's of its own kind (see :mod:`simgpu.config.mixed`).

The topology is built on the mix's first kind; then every node of another kind takes its links'
capacities and latencies from a topology of its own kind on the mix's fabric. Every kind lays a node
out alike (the config refuses kinds that do not), so a node's links sit at the same offsets of its
block of link ids in either topology. The uplinks of each leaf carry the fastest kind's NIC rate
times their ports (no oversubscription stays none); the topology's one-NIC figures (``nic_bw``,
``port_bw``, which bound a channel across the network) are the slowest kind's, which every ring
and tree across the nodes crosses.
"""

from __future__ import annotations

from typing import Any

from ..config.mixed import MixedPlatform
from .links import Link


def per_kind_links(topo: Any) -> None:
    """Give ``topo`` (a :class:`~simgpu.platform.topology.Topology` of a :class:`MixedPlatform`, built
    on its first kind) each node's links of its own kind, before its faults and arrays are made."""
    p = topo.platform
    assert isinstance(p, MixedPlatform)
    kinds, per_node = p.distinct(), p.node_kinds()
    if len(kinds) == 1 or topo.nodes != len(per_node):
        return
    lpn = topo.links_per_node
    own = [type(topo)(k, min(topo.nodes, 2), topo.gpus_per_node) for k in kinds]
    for n, kind in enumerate(per_node):
        if kind == 0:
            continue
        src = own[kind]
        for j in range(lpn):
            lid = n * lpn + j
            lk, theirs = topo.links[lid], src.links[j]
            if lk.kind != theirs.kind:  # the config refuses kinds laid out differently
                raise ValueError(f"node {n}'s link {lk.name} is {lk.kind} on {kinds[0].name} but {theirs.kind} "
                                 f"on {kinds[kind].name}")
            topo.links[lid] = Link(lid, lk.name, lk.kind, theirs.capacity, theirs.latency)
    fastest = max(t.port_bw for t in own)
    if fastest > topo.port_bw:
        for lid in topo.spine_links():
            lk = topo.links[lid]
            if lk.kind == "spine":
                topo.links[lid] = Link(lid, lk.name, lk.kind, lk.capacity * fastest / topo.port_bw, lk.latency)
    slow = min(own, key=lambda t: t.port_bw)
    topo.nic_bw, topo.port_bw = slow.nic_bw, slow.port_bw

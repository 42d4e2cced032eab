"""NVLS: all-reduce on the NVLink switches' multicast and in-switch reduction."""

from __future__ import annotations

from ...config.platform import CollectiveSpec, ProtocolSpec
from ...platform.topology import Topology
from ..plan import CollectivePlan, CollectiveRequest, register
from .common import NVLS_STEPS, _base, _by_node, _edges, _fill, _nvls_transfer, _slowest_edge


@register("nvls", {"all_reduce"})
def nvls(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    """In-switch reduction (NVLink SHARP) inside one node: each GPU sends its buffer to the switch,
    which reduces it and multicasts the result; per GPU port (n+1)/n of the message each way."""
    n = len(req.group)
    nv = topo.platform.node.nvlink
    if n == 1 or nv is None or not nv.nvls or len(_by_node(req.group, topo)) > 1 or proto.bandwidth < 1:
        return CollectivePlan("nvls", (), float("inf"))
    edge = [(req.group[0], req.group[-1])]
    _, step = _edges(edge, topo, proto)
    fill = NVLS_STEPS * _fill(req.nbytes / n, proto, _slowest_edge(edge, topo), False)
    return CollectivePlan("nvls", (_nvls_transfer(list(req.group), req.nbytes, topo, proto),),
                          _base(spec, proto) + NVLS_STEPS * step + fill)

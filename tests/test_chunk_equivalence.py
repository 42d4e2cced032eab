"""The flow representation against a chunk-level simulation of the same collectives.

The reference below is the literal model: a ring all-reduce cut into chunks, each chunk moved
step by step around the ring, store-and-forward over every link of its route, each link a SimPy
resource that one chunk holds at a time. The engine's representation (coflows sharing links
max-min fairly) must give the same bandwidth-bound time on small cases, alone and contended.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simgpu.comm.algorithms.rings import ring_orders
from simgpu.comm.network import FlowNetwork
from simgpu.comm.plan import CollectiveRequest
from simgpu.comm.planner import Planner
from simgpu.config.loader import load_platform
from simgpu.platform.topology import Topology


def chunk_level(topo: Topology, groups: list[tuple[int, ...]], nbytes: float, chunks: int) -> float:
    """Seconds until ring all-reduces of ``nbytes`` over each group, run at once, all finish."""
    env = simpy.Environment()
    links = [simpy.Resource(env, 1) for _ in topo.links]
    for group in groups:
        orders = ring_orders(group, topo, topo.platform.collectives)
        n = len(group)
        for order in orders:
            c = nbytes / len(orders) / n / chunks
            done: dict[tuple[int, int, int], simpy.Event] = {}
            for step in range(2 * (n - 1)):
                for i in range(n):
                    for k in range(chunks):
                        done[(step, i, k)] = env.event()

            def send(step: int, i: int, k: int, order=order, done=done, c=c, n=n):
                if step:
                    yield done[(step - 1, (i - 1) % n, k)]
                for lid in topo.route(order[i], order[(i + 1) % n]):
                    with links[lid].request() as req:
                        yield req
                        yield env.timeout(c / topo.capacity[lid])
                done[(step, i, k)].succeed()

            for step in range(2 * (n - 1)):
                for i in range(n):
                    for k in range(chunks):
                        env.process(send(step, i, k))
    env.run()
    return env.now


def flow_level(topo: Topology, groups: list[tuple[int, ...]], nbytes: float) -> float:
    """The same collectives as the engine moves them: their plans' transfers on the flow network,
    latency left out (the chunk-level reference has none)."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity)
    planner = Planner(topo, topo.platform.collectives, algorithm="ring", protocol="simple")
    events = []
    for group in groups:
        plan = planner.plan(CollectiveRequest("all_reduce", group, int(nbytes)))
        events += [net.transfer(t.links, t.nbytes) for t in plan.transfers]
    env.run()
    assert all(e.triggered for e in events)
    return env.now


@pytest.mark.parametrize("platform, nodes, gpn, groups", [
    ("dgx_a100", 1, 4, [(0, 1, 2, 3)]),                       # NVSwitch
    ("dgx1_v100", 1, 4, [(0, 1, 2, 3)]),                      # NVLink mesh, several rings
    ("pcie_4gpu", 1, 4, [(0, 1, 2, 3)]),                      # PCIe through the CPU
    ("dgx_a100", 2, 2, [(0, 1, 2, 3)]),                       # across nodes over NICs
    ("pcie_4gpu", 2, 2, [(0, 2), (1, 3)]),                    # two all-reduces sharing one NIC
])
def test_flow_model_matches_chunk_level_simulation(platform, nodes, gpn, groups):
    spec, _ = load_platform(platform)
    topo = Topology(spec, nodes, gpn)
    nbytes = 64 << 20
    chunked = chunk_level(topo, groups, nbytes, chunks=32)
    flow = flow_level(topo, groups, nbytes)
    # the chunk pipeline adds its fill (a few chunk times); the rates must otherwise agree
    assert flow == pytest.approx(chunked, rel=0.06)
    assert flow <= chunked * (1 + 1e-9)


def test_chunk_reference_converges_to_flow_as_chunks_shrink(dgx_a100):
    topo = Topology(dgx_a100, 1, 4)
    flow = flow_level(topo, [(0, 1, 2, 3)], 64 << 20)
    gaps = [chunk_level(topo, [(0, 1, 2, 3)], 64 << 20, k) / flow - 1 for k in (4, 16, 64)]
    assert gaps[0] > gaps[1] > gaps[2] >= -1e-9
    assert np.isclose(gaps[2], 0, atol=0.01)

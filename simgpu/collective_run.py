"""Simulating one collective on its own, as nccl-tests measures it.

:func:`simulate_collective` runs a single collective over ``nodes`` x ``gpus_per_node`` GPUs of a
platform through the engine (same plans, same link sharing as in a training iteration) and
returns its time (the ``simgpu comm`` command prints it as nccl-tests does, with
:func:`simgpu.comm.collective.bus_bandwidth`).
"""

from __future__ import annotations

import numpy as np

from .comm.planner import Planner
from .config.platform import PlatformSpec
from .engine import Engine, EngineOptions
from .graph import CollectiveCall, CollectiveOp, MemoryEstimate, Op, Program, Workload
from .platform.topology import Topology
from .result import SimResult


def simulate_collective(platform: PlatformSpec, op: CollectiveOp, nbytes: int, *, nodes: int = 1,
                        gpus_per_node: int | None = None, algorithm: str = "auto",
                        topology: Topology | None = None) -> float:
    """Seconds one ``op`` of ``nbytes`` (nccl-tests' size convention) takes on the platform."""
    return collective_result(platform, op, nbytes, nodes=nodes, gpus_per_node=gpus_per_node,
                             algorithm=algorithm, topology=topology).iteration_time_s


def collective_result(platform: PlatformSpec, op: CollectiveOp, nbytes: int, *, nodes: int = 1,
                      gpus_per_node: int | None = None, algorithm: str = "auto",
                      topology: Topology | None = None) -> SimResult:
    """The whole simulation result of one collective (records, link statistics, events)."""
    topo = topology or Topology(platform, nodes, gpus_per_node)
    n = topo.world
    programs = [Program(r) for r in range(n)]
    if op == "send_recv":
        # nccl-tests' sendrecv: every rank sends to the next and receives from the previous, at once
        if n < 2:
            raise ValueError("send_recv needs at least 2 GPUs")
        for r in range(n):
            nxt, prv = (r + 1) % n, (r - 1) % n
            send = CollectiveCall(f"p2p{r}", "send_recv", (r, nxt), int(nbytes), comm_size=n)
            recv = CollectiveCall(f"p2p{prv}", "send_recv", (prv, r), int(nbytes), comm_size=n)
            programs[r].add(Op("send", "collective", op, stream="comm", coll=send, nbytes=int(nbytes)))
            if recv.key != send.key:
                programs[r].add(Op("recv", "collective", op, stream="comm_recv", coll=recv, nbytes=int(nbytes)))
    else:
        call = CollectiveCall("bench", op, tuple(range(n)), int(nbytes))
        for r in range(n):
            programs[r].add(Op("bench", "collective", op, stream="comm", coll=call, nbytes=int(nbytes)))
    wl = Workload("collective", programs, [], [MemoryEstimate()] * n, samples=0)
    planner = Planner(topo, platform.collectives, algorithm)
    engine = Engine(topo, wl, np.zeros(0), [], planner, EngineOptions(launch_s=0.0))
    return engine.run()

"""The request-level event loop: arrivals, one process per replica, KV transfers between pools.

Each replica repeats: ask its scheduler for the next batch, advance the clock by the batch's time
(from its pool's :class:`~simgpu.workload.inference.api.IterationTimer`, each distinct step shape
timed once), then apply it: prompt chunks fill the KV cache, the iteration that completes a prompt
produces the request's first token, each decode one more token. Disaggregated, a request whose
prompt is done is sent to the decode replica with the fewest requests: once that replica has
reserved KV blocks for the request's whole output, its KV cache crosses the topology's links
(NVLink inside a node, the NICs between nodes) as one flow per GPU pair, sharing the links max-min
fairly with the other transfers in flight (:class:`~simgpu.comm.network.FlowNetwork`); the prefill
replica frees the request's blocks when the last byte has arrived.

The loop costs O(requests x iterations) cheap Python operations; each pool's :class:`Clock`
asks the timer only for step shapes it has not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ..errors import ConfigError, SimulationError
from ..workload.inference.api import IterationTimer
from .clock import Clock
from .kv import BlockManager
from .requests import Requests
from .scheduler import Batch, Replica, State, schedule
from .spec import SchedulerSpec, TimingSpec


@dataclass
class Pool:
    """Replicas of one deployment: ``role`` is "both", "prefill" or "decode"; replica ``r`` holds
    GPUs ``first_gpu + r * timer.replica_gpus`` onwards in the topology of the transfers."""

    name: str
    timer: IterationTimer
    role: str = "both"
    first_gpu: int = 0
    cache: dict[Any, float] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.timer.replica_gpus * self.timer.replicas


@dataclass
class Network:
    """Where KV transfers go: a topology's routes and its links' capacities (bytes/s)."""

    route: Callable[[int, int], tuple[int, ...]]
    route_latency: Callable[[tuple[int, ...]], float]
    capacity: np.ndarray


@dataclass
class ServeResult:
    """What a serving simulation returns (seconds from the first arrival)."""

    requests: Requests
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray                   # the replica that prefilled it (index in its pool)
    decode_replica: np.ndarray            # disaggregated: the decode replica, else -1
    transfer_s: np.ndarray                # disaggregated: seconds its KV took to cross, else 0
    iterations: list[tuple[int, int, float, float, int, int]]  # (pool, replica, start, end, prefill tokens, decodes)
    transfers: list[tuple[int, float, float, float]]           # (decode replica, start, end, bytes)
    kv_samples: list[tuple[float, int, int, int]]              # (time, pool, replica, blocks used)
    in_system: list[tuple[float, int]]                         # (time, requests arrived and not finished)
    pools: list[Pool]
    distinct_steps: int = 0
    events: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def check_fits(requests: Requests, pools: Sequence[Pool], key: str = "requests") -> None:
    """Refuse a request whose KV cache can never fit on a replica of the pool that must hold it."""
    for pool in pools:
        mem = pool.timer.memory
        need = requests.prompt if pool.role == "prefill" else requests.prompt + requests.output - 1
        cap = mem.kv_tokens
        big = np.flatnonzero(need > cap)
        if len(big):
            i = int(big[0])
            raise ConfigError(
                f"request {i} needs KV for {int(need[i]):,} tokens but a replica of the {pool.name} pool holds "
                f"{cap:,} ({mem.kv_blocks:,} blocks of {mem.block_tokens}); {len(big)} such request(s); expected "
                "shorter requests or a deployment with more KV-cache memory (more GPUs per replica)", key=key)


def simulate_serving(requests: Requests, pools: Sequence[Pool], sched: SchedulerSpec, timing: TimingSpec,
                     network: Network | None = None,
                     progress: Callable[[int, int], None] | None = None) -> ServeResult:
    """Serve ``requests`` on ``pools`` (one colocated pool, or a prefill and a decode pool)."""
    if not len(requests):
        raise ConfigError("no requests to serve; expected at least one", key="requests")
    disagg = len(pools) == 2
    if disagg and network is None:
        raise ValueError("a disaggregated deployment needs the network of its KV transfers")
    check_fits(requests, pools)
    n = len(requests)
    st = State(requests.prompt.tolist(), requests.output.tolist())
    env = simpy.Environment()
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    home = np.full(n, -1, dtype=np.int64)
    dest = np.full(n, -1, dtype=np.int64)
    xfer = np.zeros(n)
    iterations: list[tuple[int, int, float, float, int, int]] = []
    transfers: list[tuple[int, float, float, float]] = []
    kv_samples: list[tuple[float, int, int, int]] = []
    in_system: list[tuple[float, int]] = [(0.0, 0)]
    counts = {"in": 0, "done": 0}
    all_done = env.event()
    reps: list[list[Replica]] = []
    wake: dict[tuple[int, int], simpy.Event | None] = {}
    for p, pool in enumerate(pools):
        mem = pool.timer.memory
        mode = pool.role
        reps.append([Replica(i, BlockManager(mem.kv_blocks, mem.block_tokens), mode)
                     for i in range(pool.timer.replicas)])
        for i in range(pool.timer.replicas):
            wake[(p, i)] = None
    incoming: list[list[int]] = [[] for _ in reps[-1]]  # decode replicas: requests waiting for blocks
    from ..comm.network import FlowNetwork

    net = FlowNetwork(env, network.capacity) if disagg and network is not None else None
    cb, pb = timing.context_bucket_tokens, timing.prefill_bucket_tokens
    clocks = [Clock(pool, timing) for pool in pools]
    kind, max_batch, max_tokens = sched.kind, sched.max_batch, sched.max_tokens
    rr = [0]

    def poke(p: int, i: int) -> None:
        ev = wake[(p, i)]
        if ev is not None and not ev.triggered:
            ev.succeed()

    def step_time(p: int, batch: Batch) -> float:
        kv = st.kv
        pf = tuple(sorted((-(-c // pb) * pb, -(-kv[r] // cb) * cb if kv[r] else 0) for r, c in batch.prefill))
        nd = len(batch.decode)
        m = -(-sum(kv[r] for r in batch.decode) // (nd * cb)) * cb if nd else 0
        return clocks[p].time(pf, nd, m)

    def leave(r: int) -> None:
        finish[r] = env.now
        counts["in"] -= 1
        counts["done"] += 1
        in_system.append((env.now, counts["in"]))
        if progress is not None and counts["done"] % 500 == 0:
            progress(counts["done"], n)
        if counts["done"] == n:
            all_done.succeed()

    def reserve(d: int) -> None:
        rep = reps[1][d]
        q = incoming[d]
        while q:
            r = q[0]
            if not rep.kv.grow(r, st.prompt[r] + st.output[r] - 1):
                break
            q.pop(0)
            env.process(send(r, d))

    def send(r: int, d: int) -> Any:
        assert net is not None and network is not None
        pool_p, pool_d = pools[0], pools[1]
        src0 = pool_p.first_gpu + int(home[r]) * pool_p.timer.replica_gpus
        dst0 = pool_d.first_gpu + d * pool_d.timer.replica_gpus
        gp, gd = pool_p.timer.replica_gpus, pool_d.timer.replica_gpus
        total = pool_p.timer.memory.kv_bytes_per_token * gp * st.kv[r]
        pairs = max(gp, gd)
        t0 = env.now
        events = []
        for k in range(pairs):
            route = network.route(src0 + k % gp, dst0 + k % gd)
            events.append(net.transfer(route, total / pairs, network.route_latency(route)))
        yield env.all_of(events)
        xfer[r] = env.now - t0
        transfers.append((d, t0, env.now, total))
        prep = reps[0][int(home[r])]
        prep.kv.release(r)
        poke(0, prep.index)
        reps[1][d].ready.append(r)
        poke(1, d)

    def complete(p: int, rep: Replica, batch: Batch) -> None:
        gone = False
        for r, c in batch.prefill:
            st.kv[r] += c
            if st.kv[r] < st.target[r]:
                continue
            st.generated[r] += 1
            if first[r] != first[r]:
                first[r] = env.now
            if st.generated[r] >= st.output[r]:
                rep.kv.release(r)
                rep.outstanding -= 1
                leave(r)
                gone = True
            elif rep.mode == "prefill":
                rep.outstanding -= 1
                gone = True
                d = min(range(len(reps[1])), key=lambda j: (reps[1][j].outstanding, j))
                reps[1][d].outstanding += 1
                dest[r] = d
                incoming[d].append(r)
                reserve(d)
        for r in batch.decode:
            st.kv[r] += 1
            st.generated[r] += 1
            if st.generated[r] >= st.output[r]:
                rep.kv.release(r)
                rep.outstanding -= 1
                leave(r)
                gone = True
        if gone:
            kept = [r for r in rep.running if finish[r] != finish[r] and not (rep.mode == "prefill" and dest[r] >= 0)]
            rep.running[:] = kept
            if rep.mode == "decode":
                reserve(rep.index)

    def replica(p: int, rep: Replica) -> Any:
        while True:
            batch = schedule(rep, st, kind, max_batch, max_tokens)
            if not batch:
                ev = env.event()
                wake[(p, rep.index)] = ev
                yield ev
                wake[(p, rep.index)] = None
                continue
            t = step_time(p, batch)
            start = env.now
            kv_samples.append((start, p, rep.index, rep.kv.used))
            yield env.timeout(t)
            iterations.append((p, rep.index, start, env.now, sum(c for _, c in batch.prefill), len(batch.decode)))
            complete(p, rep, batch)

    def arrivals() -> Any:
        arr = requests.arrival_s
        front = reps[0]
        for r in range(n):
            if arr[r] > env.now:
                yield env.timeout(float(arr[r]) - env.now)
            if sched.routing == "round_robin":
                i = rr[0] % len(front)
                rr[0] += 1
            else:
                i = min(range(len(front)), key=lambda j: (front[j].outstanding, j))
            rep = front[i]
            home[r] = i
            rep.outstanding += 1
            rep.waiting.append(r)
            counts["in"] += 1
            in_system.append((env.now, counts["in"]))
            poke(0, i)

    for p in range(len(pools)):
        for rep in reps[p]:
            env.process(replica(p, rep))
    env.process(arrivals())
    try:
        env.run(until=all_done)
    except RuntimeError as e:  # no event left before every request finished
        raise SimulationError(f"serving stalled with {n - counts['done']} of {n} requests unfinished ({e}); "
                              "expected every request to fit the KV cache") from None
    if progress is not None:
        progress(n, n)
    return ServeResult(requests, first, finish, np.asarray(st.preemptions), home, dest, xfer, iterations,
                       transfers, kv_samples, in_system, list(pools),
                       distinct_steps=sum(len(p.cache) for p in pools), events=len(iterations) + 2 * n)

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

A replica of ``pp > 1`` pipeline stages keeps ``pp`` batches in flight, as vLLM (v0) does with
``pipeline_parallel_size`` virtual engines (``vllm/engine/llm_engine.py``: one ``Scheduler`` per
``virtual_engine``, each stepping its own requests; a new request goes to the scheduler with the
fewest unfinished ones, ``_add_processed_request``): each virtual engine is a :class:`Replica` of
the scheduler's with its own queues and ``1 / pp`` of the replica's KV blocks (vLLM's
``Scheduler.__init__`` and ``CacheEngine`` take ``num_gpu_blocks // pipeline_parallel_size``).
A virtual engine forms its next batch once its previous one has left the last stage; the batch
then passes the stages in order, each stage taking the batches in the order they reach it, one
at a time, for its share of the step (the timer's ``stage_times``: its blocks and the send of the
activations to the next stage). The stages serve in arrival order and every batch enters them in
the same order, so a batch's times through all stages are known when it enters the first.
A request's token is out when its batch leaves the last stage.

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
from ..workload.inference.api import IterationTimer, stages_of
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
    #: pipeline parallel: per stage, shape -> that stage's seconds of the step
    stage_caches: list[dict[Any, float]] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.timer.replica_gpus * self.timer.replicas

    @property
    def stages(self) -> int:
        """Pipeline stages of a replica: as many batches in flight (vLLM's virtual engines)."""
        return stages_of(self.timer)

    def stage_table(self, stage: int) -> dict[Any, float]:
        while len(self.stage_caches) <= stage:
            self.stage_caches.append({})
        return self.stage_caches[stage]


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
    #: requests at the start (in sending order) left out of the latency figures: a closed loop's warm-up
    warmup: int = 0
    #: pipeline parallel: (pool, replica, virtual engine, (start, end) of each stage in turn, prefill
    #: tokens, decodes) per batch; its ``iterations`` row runs from the first stage's start to the
    #: last stage's end
    stage_spans: list[tuple[int, int, int, tuple[float, ...], int, int]] = field(default_factory=list)


def check_fits(requests: Requests, pools: Sequence[Pool], key: str = "requests") -> None:
    """Refuse a request whose KV cache can never fit on a replica of the pool that must hold it
    (on one of its virtual engines under pipeline parallelism: a ``1 / pp`` share of its blocks)."""
    for pool in pools:
        mem = pool.timer.memory
        need = requests.prompt if pool.role == "prefill" else requests.prompt + requests.output - 1
        pp = pool.stages
        blocks = mem.kv_blocks // pp
        cap = blocks * mem.block_tokens
        big = np.flatnonzero(need > cap)
        if len(big):
            i = int(big[0])
            where = f"a replica of the {pool.name} pool holds" if pp == 1 else \
                f"each of the {pp} virtual engines of a replica of the {pool.name} pool holds"
            raise ConfigError(
                f"request {i} needs KV for {int(need[i]):,} tokens but {where} "
                f"{cap:,} ({blocks:,} blocks of {mem.block_tokens}); {len(big)} such request(s); expected "
                "shorter requests or a deployment with more KV-cache memory (more GPUs per replica)", key=key)


def simulate_serving(requests: Requests, pools: Sequence[Pool], sched: SchedulerSpec, timing: TimingSpec,
                     network: Network | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     concurrency: int | None = None, warmup: int = 0) -> ServeResult:
    """Serve ``requests`` on ``pools`` (one colocated pool, or a prefill and a decode pool).

    ``concurrency``: a closed loop of that many clients. The first ``concurrency`` requests are sent
    at time 0 and each later one the moment a request finishes (its client sends the next, as the
    serving benchmarks' clients do); ``requests.arrival_s`` is filled in with the times they were
    sent. ``warmup``: the first requests sent that the latency figures leave out."""
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
    # per pool, its replicas' virtual engines (one per pipeline stage; index i * pp + v is virtual
    # engine v of replica i, whose ``unit`` is i), and per replica when each of its stages is free
    reps: list[list[Replica]] = []
    units: list[list[list[Replica]]] = []
    stage_free: list[list[list[float]]] = []
    wake: dict[tuple[int, int], simpy.Event | None] = {}
    for p, pool in enumerate(pools):
        mem = pool.timer.memory
        mode, pp = pool.role, pool.stages
        reps.append([Replica(i * pp + v, BlockManager(mem.kv_blocks // pp, mem.block_tokens), mode, unit=i)
                     for i in range(pool.timer.replicas) for v in range(pp)])
        units.append([reps[p][i * pp:(i + 1) * pp] for i in range(pool.timer.replicas)])
        stage_free.append([[0.0] * pp for _ in range(pool.timer.replicas)])
        for rep in reps[p]:
            wake[(p, rep.index)] = None
    where = np.full(n, -1, dtype=np.int64)  # the prefilling virtual engine (index in reps[0])
    incoming: list[list[int]] = [[] for _ in reps[-1]]  # decode replicas: requests waiting for blocks
    from ..comm.network import FlowNetwork

    net = FlowNetwork(env, network.capacity) if disagg and network is not None else None
    cb, pb = timing.context_bucket_tokens, timing.prefill_bucket_tokens
    clocks = [Clock(pool, timing) for pool in pools]
    stage_clocks = [[Clock(pool, timing, k) for k in range(pool.stages)] if pool.stages > 1 else []
                    for pool in pools]
    kind, max_batch, max_tokens = sched.kind, sched.max_batch, sched.max_tokens
    rr = [0]

    def poke(p: int, i: int) -> None:
        ev = wake[(p, i)]
        if ev is not None and not ev.triggered:
            ev.succeed()

    def step_key(batch: Batch) -> tuple[tuple[tuple[int, int], ...], int, int]:
        kv = st.kv
        pf = tuple(sorted((-(-c // pb) * pb, -(-kv[r] // cb) * cb if kv[r] else 0) for r, c in batch.prefill))
        nd = len(batch.decode)
        m = -(-sum(kv[r] for r in batch.decode) // (nd * cb)) * cb if nd else 0
        return pf, nd, m

    def step_time(p: int, batch: Batch) -> float:
        return clocks[p].time(*step_key(batch))

    memo: list[dict[Any, tuple[float, ...]]] = [{} for _ in pools]

    def stage_times(p: int, batch: Batch) -> tuple[float, ...]:
        key = step_key(batch)
        t = memo[p].get(key)
        if t is None:
            t = memo[p][key] = tuple(c.time(*key) for c in stage_clocks[p])
        return t

    def leave(r: int) -> None:
        finish[r] = env.now
        counts["in"] -= 1
        counts["done"] += 1
        in_system.append((env.now, counts["in"]))
        if progress is not None and counts["done"] % 500 == 0:
            progress(counts["done"], n)
        if counts["done"] == n:
            all_done.succeed()
        elif concurrency is not None and sent[0] < n:  # its client sends the next request
            admit(sent[0])

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
        dst0 = pool_d.first_gpu + reps[1][d].unit * pool_d.timer.replica_gpus
        gp, gd = pool_p.timer.replica_gpus, pool_d.timer.replica_gpus
        total = pool_p.timer.memory.kv_bytes_per_token * gp * st.kv[r]  # per GPU x every GPU of the replica
        pairs = max(gp, gd)
        t0 = env.now
        events = []
        for k in range(pairs):
            route = network.route(src0 + k % gp, dst0 + k % gd)
            events.append(net.transfer(route, total / pairs, network.route_latency(route)))
        yield env.all_of(events)
        xfer[r] = env.now - t0
        transfers.append((reps[1][d].unit, t0, env.now, total))
        prep = reps[0][int(where[r])]
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
                d = pick(1, False).index
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

    def next_batch(p: int, rep: Replica) -> Any:
        """The replica's (or virtual engine's) next batch, waiting until there is one."""
        while True:
            batch = schedule(rep, st, kind, max_batch, max_tokens)
            if batch:
                return batch
            ev = env.event()
            wake[(p, rep.index)] = ev
            yield ev
            wake[(p, rep.index)] = None

    def replica(p: int, rep: Replica) -> Any:
        while True:
            batch = yield from next_batch(p, rep)
            t = step_time(p, batch)
            start = env.now
            kv_samples.append((start, p, rep.index, rep.kv.used))
            yield env.timeout(t)
            iterations.append((p, rep.index, start, env.now, sum(c for _, c in batch.prefill), len(batch.decode)))
            complete(p, rep, batch)

    def virtual_engine(p: int, rep: Replica) -> Any:
        """A virtual engine of a pipelined replica: its batches pass the replica's stages in turn."""
        free = stage_free[p][rep.unit]
        mine = units[p][rep.unit]
        while True:
            batch = yield from next_batch(p, rep)
            now = env.now
            kv_samples.append((now, p, rep.unit, sum(v.kv.used for v in mine)))
            end = now
            bounds: list[float] = []
            for k, d in enumerate(stage_times(p, batch)):
                s = end if end > free[k] else free[k]  # the stage takes it once free of the batch before
                end = free[k] = s + d
                bounds += (s, end)
            yield env.timeout(end - now)
            pf = sum(c for _, c in batch.prefill)
            stage_spans.append((p, rep.unit, rep.index % len(free), tuple(bounds), pf, len(batch.decode)))
            iterations.append((p, rep.unit, bounds[0], end, pf, len(batch.decode)))
            complete(p, rep, batch)

    def pick(p: int, round_robin: bool) -> Replica:
        """Where a request goes in pool ``p``: the replica by round robin or with the fewest requests
        (a replica's over its virtual engines), then its virtual engine with the fewest (vLLM's
        ``min_cost_scheduler``)."""
        us = units[p]
        if round_robin:
            i = rr[0] % len(us)
            rr[0] += 1
        elif len(us[0]) == 1:
            i = min(range(len(us)), key=lambda j: (us[j][0].outstanding, j))
        else:
            i = min(range(len(us)), key=lambda j: (sum(v.outstanding for v in us[j]), j))
        ves = us[i]
        return ves[0] if len(ves) == 1 else min(ves, key=lambda v: (v.outstanding, v.index))

    sent = [0]  # requests sent so far (the next to send, in order)

    def admit(r: int) -> None:
        rep = pick(0, sched.routing == "round_robin")
        home[r] = rep.unit
        where[r] = rep.index
        rep.outstanding += 1
        rep.waiting.append(r)
        counts["in"] += 1
        in_system.append((env.now, counts["in"]))
        sent[0] = r + 1
        if concurrency is not None:
            requests.arrival_s[r] = env.now
        poke(0, rep.index)

    def arrivals() -> Any:
        arr = requests.arrival_s
        last = n if concurrency is None else min(concurrency, n)
        for r in range(last):
            if concurrency is None and arr[r] > env.now:
                yield env.timeout(float(arr[r]) - env.now)
            admit(r)

    stage_spans: list[tuple[int, int, int, tuple[float, ...], int, int]] = []
    for p, pool in enumerate(pools):
        for rep in reps[p]:
            env.process(replica(p, rep) if pool.stages == 1 else virtual_engine(p, rep))
    env.process(arrivals())
    try:
        env.run(until=all_done)
    except RuntimeError as e:  # no event left before every request finished
        raise SimulationError(f"serving stalled with {n - counts['done']} of {n} requests unfinished ({e}); "
                              "expected every request to fit the KV cache") from None
    if progress is not None:
        progress(n, n)
    if disagg and pools[1].stages > 1:  # the decode replica, not its virtual engine
        dest = np.array([reps[1][d].unit if d >= 0 else -1 for d in dest.tolist()], dtype=np.int64)
    return ServeResult(requests, first, finish, np.asarray(st.preemptions), home, dest, xfer, iterations,
                       transfers, kv_samples, in_system, list(pools),
                       distinct_steps=sum(len(p.cache) for p in pools), events=len(iterations) + 2 * n,
                       stage_spans=stage_spans, warmup=min(warmup, n - 1))

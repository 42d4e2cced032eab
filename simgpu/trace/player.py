"""Replaying traced ranks in the engine, on the traced platform or as a what-if on another.

``replay(traces, options)`` builds each rank's program (:mod:`simgpu.trace.build`), links the
ranks' collectives and clocks (:mod:`simgpu.trace.link`), turns the programs into a
:class:`~simgpu.graph.Workload` whose kernels are ``measured`` (their traced durations,
re-scaled in a what-if by :mod:`simgpu.trace.whatif`) and runs the whole traced window in the
engine. A plain replay gives every collective its measured time once its traced members have
met; a what-if plans them on the target platform's network from their sizes, for ``world`` ranks
that each run the program of a traced rank (data parallelism).

The result reports one step: the records of the chosen ``ProfilerStep`` (by default the one of
median traced duration), clipped to it and shifted to start at 0, so that ``iteration_time_s`` is
that step's replayed time; ``steps`` lists the traced and replayed time of every step. Link
statistics of a what-if are scaled from the whole window to the step by duration.

Units: seconds in results; milliseconds in the ``steps`` table.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..comm.planner import Planner
from ..config.platform import PlatformSpec
from ..engine import Engine, EngineOptions
from ..errors import ConfigError
from ..graph import CollectiveCall, KernelTable, MemoryEstimate, Op, Program, Workload
from ..kernels.registry import make_predictor
from ..platform.topology import Topology
from ..result import SimResult
from ..sim import platform_figures, versions
from .build import Item, RankProgram, build_program
from .et import ExecutionTrace
from .kineto import RankTrace
from .link import Links, link_programs
from .whatif import Retimer, SizeInference, group_of


@dataclass(frozen=True)
class ReplayOptions:
    """``platform``: where to simulate; ``source``: the traced platform when known (for re-timing
    compute kernels in a what-if); ``what_if``: re-time collectives with the collective model (and
    compute kernels when the GPUs differ); ``world``: ranks of the what-if job (default: the traced
    world size); ``step``: the ProfilerStep number to report (default: median)."""

    platform: PlatformSpec
    source: PlatformSpec | None = None
    what_if: bool = False
    world: int | None = None
    kernel_model: str = "analytical"
    step: int | None = None
    record_links: bool = False


@dataclass
class ReplayOutcome:
    """The reported step as a :class:`SimResult`, the table of every step, the warnings, the
    replayed-minus-traced start of every GPU op (plain replays only, us) and the programs."""

    result: SimResult
    steps: pd.DataFrame
    step: int | None
    measured_step_s: float | None
    warnings: Counter[str] = field(default_factory=Counter)
    start_error_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    programs: list[RankProgram] = field(default_factory=list)


def build_programs(traces: Sequence[tuple[RankTrace, ExecutionTrace | None]]) -> list[RankProgram]:
    """One program per traced rank, ordered by rank (two traces of one rank are an error)."""
    progs = sorted((build_program(tr, et) for tr, et in traces), key=lambda p: p.rank)
    for a, b in zip(progs, progs[1:], strict=False):
        if a.rank == b.rank:
            raise ConfigError(f"two traces of rank {a.rank}: {a.file} and {b.file}", file=b.file)
    return progs


def replay(traces: Sequence[tuple[RankTrace, ExecutionTrace | None]], options: ReplayOptions) -> ReplayOutcome:
    """Replay ``traces`` (one per rank) with ``options``; see the module docstring."""
    return replay_programs(build_programs(traces), options)


def replay_programs(programs: Sequence[RankProgram], options: ReplayOptions) -> ReplayOutcome:
    """:func:`replay` from already built programs (building is the expensive part of a what-if sweep)."""
    if not programs:
        raise ConfigError("no trace to replay")
    warn: Counter[str] = Counter()
    for prog in programs:
        warn.update({f"{prog.file}: {k}": v for k, v in prog.warnings.items()})
    links = link_programs(programs)
    warn.update(links.warnings)
    wl, prog_of, model_name = _workload(programs, links, options, warn)
    p = options.platform
    world = len(wl.programs)
    gpn = min(world, p.node.gpus)
    topo = Topology(p, math.ceil(world / gpn), gpn)
    durations, models = make_predictor(("measured", options.kernel_model), p).predict(wl.kernels)
    engine_opts = EngineOptions(launch_s=0.0, cpu_threads_per_node=max(p.host.cpu_threads, gpn),
                                overlap_slowdown=0.0, record_links=options.record_links)
    full = Engine(topo, wl, durations, [model_name] * len(models), Planner(topo, p.collectives), engine_opts).run()
    steps = _step_table(full.records, programs, prog_of)
    chosen = _choose_step(steps, options.step)
    result = _window(full, steps, chosen)
    kernels = result.records[result.records["kind"] == "kernel"]
    share = kernels.assign(d=kernels["end_s"] - kernels["start_s"]).groupby("model")["d"].sum()
    row = steps[steps["step"] == chosen] if chosen is not None else steps.iloc[0:0]
    offsets = _offsets(programs, links)
    measured_s = float(row["measured_ms"].iloc[0]) * 1e-3 if len(row) else max(
        prog.end_s + off for prog, off in zip(programs, offsets, strict=True))
    errors = np.zeros(0) if options.what_if else start_errors_us(programs, full.records, offsets)
    result.meta.update(
        workload=("what-if of " if options.what_if else "replay of ") + ", ".join(_stem(x.file) for x in programs),
        platform=p.name, gpu=p.gpu.name, nodes=topo.nodes, gpus=world,
        kernel_model_share={str(k): float(v) for k, v in share.items()}, measured_step_time_ms=measured_s * 1e3,
        trace_files=[x.file for x in programs], traced_gpu=programs[0].gpu, step=chosen,
        run={"traces": [x.file for x in programs], "what_if": options.what_if, "world": world,
             "platform": platform_figures(p, topo), "versions": versions()},
    )
    return ReplayOutcome(result, steps, chosen, measured_s, warn, errors, list(programs))


def _stem(path: str) -> str:
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def _offsets(programs: Sequence[RankProgram], links: Links) -> list[float]:
    """Seconds from the common start of the replay to each program's origin (clock skew removed)."""
    origins = [p.origin_us - s for p, s in zip(programs, links.skew_us, strict=True)]
    return [(o - min(origins)) * 1e-6 for o in origins]


def start_errors_us(programs: Sequence[RankProgram], records: pd.DataFrame, offsets: Sequence[float]) -> np.ndarray:
    """Replayed minus traced start of every GPU op of a plain replay, in microseconds.

    Ops of one stream run in issue order, so the k-th record of a rank's stream is its k-th op.
    """
    out: list[np.ndarray] = []
    gpu = records[records["stream"] != "cpu"]
    for r, (p, off) in enumerate(zip(programs, offsets, strict=True)):
        traced: dict[str, list[float]] = {}
        for it in p.items:
            if it.kind in ("gpu", "collective"):
                traced.setdefault(p.stream_names[it.stream], []).append(it.start_s + off)
        mine = gpu[gpu["rank"] == r]
        for stream, starts in traced.items():
            sim = np.sort(mine.loc[mine["stream"] == stream, "start_s"].to_numpy(dtype=float), kind="stable")
            if len(sim) == len(starts):
                out.append((sim - np.asarray(starts)) * 1e6)
    return np.concatenate(out) if out else np.zeros(0)


def _workload(programs: Sequence[RankProgram], links: Links, opt: ReplayOptions,
              warn: Counter[str]) -> tuple[Workload, list[int], str]:
    n = len(programs)
    traced_world = max([p.world_size or 0 for p in programs] + [max(p.rank for p in programs) + 1])
    if not opt.what_if:
        world, prog_of = n, list(range(n))
    else:
        world = opt.world or traced_world
        if world < 1:
            raise ConfigError(f"world size must be >= 1, got {world}", key="world")
        by_rank = {p.rank: i for i, p in enumerate(programs)}
        if not links.consistent and n > 1:
            warn["traced ranks disagree on their collectives; every what-if rank runs the first trace"] += 1
            prog_of = [0] * world
        else:
            prog_of = [by_rank.get(r, r % n) for r in range(world)]
    source = opt.source or opt.platform
    retimer = Retimer(source, opt.platform, opt.kernel_model) if opt.what_if else None
    if opt.what_if and opt.source is None:
        warn["the traced GPU matches no platform: compute kernels keep their measured times"] += 1
    sizes = SizeInference(source, traced_world) if opt.what_if else None
    factors = [_factors(p, retimer) for p in programs]
    offsets = _offsets(programs, links)
    table = KernelTable()
    progs: list[Program] = []
    inferred: set[str] = set()
    for r in range(world):
        pi = prog_of[r]
        prog = Program(r, [Op("trace start", "host", "host", cpu_s=offsets[pi])])
        for i, it in enumerate(programs[pi].items):
            deps = tuple(d + 1 for d in it.deps)
            names = programs[pi].stream_names
            if it.kind in ("step_start", "step_end", "host"):
                prog.add(Op(it.name, "host", it.category, cpu_s=it.cpu_s))
            elif it.kind == "sync":
                prog.add(Op(it.name, "host_wait", "host_wait", deps=deps, cpu_s=it.cpu_s))
            elif it.kind == "gpu":
                k = table("measured", "none", us=round(it.dur_s * factors[pi][i] * 1e6, 4))
                prog.add(Op(it.name, "kernel", it.category, stream=names[it.stream], kernel=k, deps=deps,
                            cpu_s=it.cpu_s, delay_s=it.delay_s))
            else:
                call = _collective(r, pi, i, it, links, opt, world, traced_world, sizes, programs, inferred, warn)
                prog.add(Op(it.name, "collective", it.category, stream=names[it.stream], coll=call,
                            nbytes=call.nbytes, deps=deps, cpu_s=it.cpu_s, delay_s=it.delay_s))
        progs.append(prog)
    if inferred:
        warn["collective sizes not in the trace, inferred from measured times on the traced platform"] += len(inferred)
    if retimer is not None and not retimer.same:
        warn[f"compute kernels re-timed by GPU ratios ({retimer.by_model} GEMMs by the kernel model)"] += 1
    mem = [MemoryEstimate()] * world
    model_name = "measured" if retimer is None or retimer.same else "scaled"
    return Workload(_stem(programs[0].file), progs, table.specs, mem, samples=0), prog_of, model_name


def _factors(p: RankProgram, retimer: Retimer | None) -> list[float]:
    if retimer is None:
        return [1.0] * len(p.items)
    gpu = [(i, it.info) for i, it in enumerate(p.items) if it.kind == "gpu" and it.info is not None]
    out = [1.0] * len(p.items)
    for (i, _), f in zip(gpu, retimer.factors([info for _, info in gpu]), strict=True):
        out[i] = f
    return out


def _collective(r: int, pi: int, i: int, it: Item, links: Links, opt: ReplayOptions, world: int,
                traced_world: int, sizes: SizeInference | None, programs: Sequence[RankProgram],
                inferred: set[str], warn: Counter[str]) -> CollectiveCall:
    coll = it.coll
    if coll is None:
        raise ValueError(f"item {it.name!r} is a collective without collective info")
    key = links.keys[(pi, i)]
    op = coll.op
    if not opt.what_if:
        return CollectiveCall(key, op, links.members[key], max(0, links.nbytes[key]),
                              duration_s=links.duration_s[key])
    bucket, k = links.index[(pi, i)]
    nbytes = links.nbytes.get(f"{bucket}#{k}", coll.nbytes)
    if nbytes < 0 and sizes is not None:
        nbytes = sizes.nbytes(op, len(coll.group), links.duration_s.get(f"{bucket}#{k}", it.dur_s))
        inferred.add(f"{bucket}#{k}")
    group = group_of(r, coll.group, traced_world, world)
    if group is None:
        warn[f"process group {bucket}: its ranks do not tile {world} ranks; taken as the whole world"] += 1
        group = tuple(range(world))
    if op == "send_recv" and len(group) > 1:
        peer = r ^ 1 if (r ^ 1) < world else r - 1
        group = (min(r, peer), max(r, peer))
    if len(group) == 1:
        return CollectiveCall(f"r{r}/{bucket}#{k}", op, (r,), max(nbytes, 0), duration_s=it.dur_s)
    return CollectiveCall(f"{bucket}#{k}@{group[0]}", op, group, max(nbytes, 0))


def _step_table(rec: pd.DataFrame, programs: Sequence[RankProgram], prog_of: list[int]) -> pd.DataFrame:
    """One row per traced step: ``step``, ``complete``, ``measured_ms``, ``replayed_ms`` and the
    replayed window ``start_s`` / ``end_s``."""
    marks = rec[(rec["kind"] == "host") & (rec["category"] == "step")]
    numbers = sorted({n for p in programs for n in p.steps})
    rows = []
    for n in numbers:
        name = f"ProfilerStep#{n}"
        starts = marks[marks["name"] == name].set_index("rank")["end_s"]
        ends = marks[marks["name"] == name + " end"].set_index("rank")["end_s"]
        both = starts.index.intersection(ends.index)
        replayed = float((ends[both] - starts[both]).max()) if len(both) else float("nan")
        traced = [p.steps[n][1] - p.steps[n][0] for p in programs if n in p.steps]
        complete = all(n in p.complete_steps for p in programs if n in p.steps)
        rows.append((n, complete, max(traced) * 1e3, replayed * 1e3,
                     float(starts.min()) if len(starts) else float("nan"),
                     float(ends.max()) if len(ends) else float("nan")))
    return pd.DataFrame(rows, columns=["step", "complete", "measured_ms", "replayed_ms", "start_s", "end_s"])


def _choose_step(steps: pd.DataFrame, wanted: int | None) -> int | None:
    if wanted is not None:
        if wanted not in set(steps["step"]):
            known = ", ".join(str(s) for s in steps["step"]) or "none"
            raise ConfigError(f"no ProfilerStep#{wanted} in the traces; expected one of the steps: {known}",
                              key="--step")
        return wanted
    pool = steps[steps["complete"]] if steps["complete"].any() else steps
    if not len(pool):
        return None
    order = pool.sort_values(["measured_ms", "step"], kind="stable")
    return int(order["step"].iloc[(len(order) - 1) // 2])


def _window(full: SimResult, steps: pd.DataFrame, step: int | None) -> SimResult:
    """The records of one step, clipped to it and shifted to start at 0 (the whole run if no step)."""
    rec = full.records
    if step is None:
        w0, w1 = 0.0, full.iteration_time_s
    else:
        row = steps[steps["step"] == step].iloc[0]
        w0, w1 = float(row["start_s"]), float(row["end_s"])
    inside = (rec["end_s"] > w0) & (rec["start_s"] < w1) | (
        (rec["start_s"] == rec["end_s"]) & (rec["start_s"] >= w0) & (rec["start_s"] <= w1))
    out = rec[inside].copy()
    out["start_s"] = np.clip(out["start_s"].to_numpy(dtype=float), w0, w1) - w0
    out["end_s"] = np.clip(out["end_s"].to_numpy(dtype=float), w0, w1) - w0
    span = w1 - w0
    frac = span / full.iteration_time_s if full.iteration_time_s > 0 else 1.0
    stats = full.link_stats.copy()
    stats["nbytes"] = stats["nbytes"] * frac
    stats["busy_s"] = stats["busy_s"] * frac
    links = None
    if full.link_records is not None:
        lr = full.link_records
        links = lr[(lr["end_s"] > w0) & (lr["start_s"] < w1)].copy()
        links["start_s"] = np.clip(links["start_s"].to_numpy(dtype=float), w0, w1) - w0
        links["end_s"] = np.clip(links["end_s"].to_numpy(dtype=float), w0, w1) - w0
        links = links.reset_index(drop=True)
    return SimResult(out.reset_index(drop=True), stats, span, full.events, dict(full.meta), links)

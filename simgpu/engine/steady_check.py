"""Whether the shortened run's steady window is the full run's (:func:`check`), from the shortened
run alone (:mod:`simgpu.engine.steady_cut`).

The argument, for the full run F and the cut run C: the engine's timing is a composition of maxima
(an op starts at the latest of its issue, its stream's previous op's end, its dependencies' ends
and, for a collective, its members' arrivals), durations and flows, so C's ops, from the cut on,
run as F's shifted by one constant ``D`` wherever every input each takes in F is its input in C
shifted by ``D`` or is no later than that (a max ignores it) and no flow meets another flow in one
run that it does not meet in the other. The check asks:

- (CPU) F's CPU is at least as far ahead of the GPU as C's: F's CPU reaches the cut after the
  dropped ops' launches (no host wait among them), F's GPU no sooner than the dropped kernels on
  the compute stream take, less where C starts its first kernel on it (a lower bound on ``D``); the
  first must not exceed the second on any rank. Then each op is issued in F no later than in C
  shifted by ``D``, and a host wait, a max of the CPU and its dependencies, keeps it so.
- (issued ops) an op of the second iteration that starts when the CPU issues it would start
  earlier in F (in the first, such ops are the cold entry, which the last point compares): it
  must be an input copy that no host wait waits for, whose dependents (and the next op on its
  stream) start strictly after it ends, which ends before the window begins, and which shares no
  link with any other transfer from the time it could start (its stream and dependencies ready)
  to its end in C (other copies by their routes, collectives by the plans the engine carries): in
  F it starts no later, shifted, and runs alone, so where it runs there changes no op, no flow, no
  link's bytes, no link's busy time within the window and no rank's compute time there. Where F's
  copy surely ends before any kept op can start in F (F's issue times are its CPU's launches one
  after the other up to a host wait; a copy moves at least its links' capacities shared by every
  rank's host route on them) and no dropped collective crosses its links, it meets only copies in
  F, and in C it need meet no collective while it actually runs. A copy C ran with no bytes must
  be such a copy (it then changes nothing in either run, and the bytes F's moves are its
  iteration's, put back), and must end before the window and bind no dependent, as above.
- (CPU records) before the rank's first host wait that blocks (after which C's CPU and F's agree),
  the CPU issues every op before the window begins, so the window's CPU records agree too.
- (the boundary repeats) on every rank, nothing of C's first iteration still runs when its step
  starts, nor of its second iteration when that one's starts, and the ops from the step on (the
  step, the parameter all-gathers after it: all of the first iteration that the window can see)
  start and end one iteration (the window's length) apart in the two iterations, within
  :data:`TOLERANCE` of the run, the issued copies aside. In C the second iteration's last
  micro-batch follows its earlier micro-batches, as the dropped ones precede F's first
  iteration's; the cut one follows nothing. Both entries leave the same state at the boundary, so
  the state the earlier micro-batches hand to the last one is not what sets it (a maximum of
  inputs is set by the largest only), and F's first iteration hands it the same ops' state.

The last point is the premise the others stand on: that the earlier micro-batches of F's first
iteration (entered from a cold start) leave the boundary as those of C's second one do (entered
from a step), up to the shift; the repeat shows it for two entries, it is not a proof for every
entry. (The last micro-batch itself need not repeat: on ``workloads/gpt_2x_dgx_h100.yaml`` under
ZeRO-1, Megatron and ``overlap_param_gather`` at 8 micro-batches, two of its reduce-scatters end
1.1 us apart in the cut run's two iterations, and yet the cut run's window is the full run's to
1e-13.) Tests compare the shortcut with the full run
on every case they build (iteration time and per-rank breakdown to 1e-9, link bytes equal),
including cases it must refuse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, count, islice
from operator import is_not

import numpy as np

from ..comm.plan import CollectiveRequest
from ..comm.planner import Planner
from ..comm.transfers import TransferTable
from ..graph import Op, Workload
from ..platform.topology import Topology
from ..result import SimResult
from .core import EngineOptions
from .fold import FoldMap
from .steady_cut import _GPU_KINDS, TOLERANCE, Cut, _base, _base_of, _micro_batches


def check(result: SimResult, cut: Cut, full: Workload, topo: Topology, planner: Planner,
          durations: Sequence[float], options: EngineOptions) -> str:
    """Why the run of ``cut`` (``result``, with ``meta["op_times"]``, taken out) may differ from the
    run of ``full`` in its steady window, "" where it cannot (the argument: the module docstring)."""
    times: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = result.meta.pop("op_times")
    ends = [float(x) for x in result.meta["iteration_ends_s"]]
    b0, b1 = ends[-2], ends[-1]
    period = b1 - b0
    tol = TOLERANCE * max(b1, 1e-30)
    reps = cut.workload.replicas
    fold = FoldMap(topo, reps) if reps is not None else None
    share = max(1.0, topo.gpus_per_node / max(1, options.cpu_threads_per_node))
    programs = {p.rank: p.ops for p in cut.workload.programs}
    cut_templates = {p.rank: p.template for p in cut.workload.programs}
    # the CPU's lead in the full run: its CPU reaches the last micro-batch after the dropped ops' launches
    # (no host wait among them), its GPU no sooner than the dropped kernels on the compute stream take
    lead_cpu, lead_gpu = 0.0, -math.inf
    ahead: dict[int, float] = {}  # rank -> how much later its CPU reaches each kept op in the full run
    sums: dict[int, tuple[float, float]] = {}  # by template: its dropped ops' launches and compute kernels
    firsts: dict[int, int | None] = {}  # by cut template: its first kernel on the compute stream
    for prog in full.programs:
        c = cut.dropped[prog.rank]
        ops, base = prog.ops, _base(prog)
        got = sums.get(id(base))
        if got is None:
            got = sums[id(base)] = (_launches(base[:c], options.launch_s), sum(
                durations[o.kernel] for o in base[:c] if o.kind == "kernel" and o.stream == "compute"))
        launches, busy = got
        if ops is not base:  # its own ops (collectives over its groups) may take their own host time
            launches += sum(_launch(ops[i], options.launch_s) - _launch(base[i], options.launch_s)
                            for i in compress(count(), map(is_not, islice(ops, c), islice(base, c))))
        ahead[prog.rank] = launches * share
        lead_cpu = max(lead_cpu, ahead[prog.rank])
        _, start, _ = times[prog.rank]
        kept = programs[prog.rank]
        key = id(_base_of(cut_templates[prog.rank], kept))
        if key not in firsts:
            firsts[key] = next((j for j, o in enumerate(kept) if o.kind == "kernel" and o.stream == "compute"), None)
        first = firsts[key]
        if first is not None:
            lead_gpu = max(lead_gpu, busy - float(start[first]))
    if lead_cpu > lead_gpu + tol:
        return (f"the dropped micro-batches' launches ({lead_cpu * 1e3:.3f} ms) may outlast their kernels: the "
                "full run's CPU need not be ahead of the shortened one's")
    early = _early_copies(full, cut, topo, fold, options.launch_s, share)
    #: copies that start when issued: (rank, op, ready, end, (issue, ready, the CPU's extra lead in the full run),
    #: whether the full run's copy surely ends before any kept op can start there, whether it moved no bytes)
    copies: list[tuple[int, int, float, float, tuple[float, float, float], bool, bool]] = []
    layouts: dict[int, _Layout | str] = {}
    for prog in cut.workload.programs:
        rank, ops = prog.rank, prog.ops
        issue, start, end = times[rank]
        key = id(prog.template) if prog.template is not None else id(ops)
        lay = layouts.get(key)
        if lay is None:
            lay = layouts[key] = _Layout.of(ops)
        if isinstance(lay, str):
            return f"rank {rank}: {lay}"
        n, e0, c1, step, gpu, copy, dependents = lay.n, lay.e0, lay.c1, lay.step, lay.gpu, lay.copy, lay.dependents
        free = (start - issue) <= tol
        # (a) the boundary repeats: from the step on, one shift, the window's length, on every rank, with
        # nothing before the step still running when it starts
        for at in (0, c1):
            before = np.flatnonzero(gpu[at:at + step]) + at
            if len(before) and float(end[before].max()) > float(start[at + step]) + tol:
                j = int(before[int(end[before].argmax())])
                return f"rank {rank}'s {ops[j].name!r} still runs when the step {ops[at + step].name!r} starts"
        pos = np.arange(step, e0)
        pos = pos[gpu[pos] & ~(copy[pos] & (free[pos] | free[pos + c1]))]
        for col in (start, end):
            gap = np.abs(col[pos + c1] - col[pos] - period)
            if len(gap) and float(gap.max()) > tol:
                j = int(pos[int(gap.argmax())])
                return (f"rank {rank}'s op {ops[j].name!r} runs {float(col[j + c1] - col[j]) * 1e3:.6f} ms later in "
                        f"the second iteration, not one iteration ({period * 1e3:.6f} ms)")
        # (c) the CPU: where its lead differs, none of its records reaches into the window
        waits = lay.waits
        blocked = next((int(i) for i in waits if end[i] - start[i] > tol), n)
        late = np.flatnonzero(issue[:blocked] > b0 + tol)
        if len(late):
            return (f"rank {rank}'s CPU launches {ops[int(late[0])].name!r} inside the steady window, where its lead "
                    "counts")
        # (b) what starts when the CPU issues it, and the copies taken off the links
        taken = {k for k, _ in cut.off.get(rank, ())}
        for i in sorted(set(np.flatnonzero(free[:blocked] & gpu[:blocked]).tolist()) | taken):
            o = ops[i]
            if o.kind != "memcpy" and i >= e0:  # in the first iteration: the cold entry, which (a) compared
                return f"rank {rank}'s {o.kind} {o.name!r} starts when the CPU issues it: the CPU's lead counts"
            if o.kind != "memcpy":
                continue
            if any(ops[d].kind == "host_wait" for d in dependents.get(i, ())):
                return f"rank {rank}'s CPU waits for the copy {o.name!r}, which starts when issued"
            for d in dependents.get(i, ()) if i >= e0 else ():  # in the first iteration: the entry, as above
                later = end[d] if ops[d].kind == "host_wait" else start[d]
                if later <= end[i] + tol:
                    return f"rank {rank}'s {ops[d].name!r} waits for the copy {o.name!r}, which starts when issued"
            prev = [end[d] for d in o.deps] + ([end[lay.before[i]]] if lay.before[i] >= 0 else [])
            ready = max(prev, default=0.0)
            if end[i] > b0 + tol:
                return f"rank {rank}'s copy {o.name!r}, which starts when issued, runs in the steady window"
            soon = early.get(rank, {}).get(i, math.inf) <= lead_gpu - tol
            if i in taken and not soon:
                return (f"rank {rank}'s copy {o.name!r}, run with no bytes, may not end in the full run before "
                        "its kept ops start")
            copies.append((rank, i, ready, float(end[i]), (float(issue[i]), ready, ahead[rank]), soon, i in taken))
    places: dict[int, list[int]] = {}  # by template: where its dropped collectives are
    dropped: list[Op] = []
    for p in full.programs:
        base = _base(p)
        where = places.get(id(base))
        if where is None:
            where = places[id(base)] = [i for i, o in enumerate(base[:cut.dropped[p.rank]])
                                        if o.kind == "collective"]
        dropped += [p.ops[i] for i in where]
    return _alone(copies, programs, times, topo, planner, fold, tol, dropped)


@dataclass(frozen=True)
class _Layout:
    """What :func:`check` reads of a cut program's ops (alike for the ranks of one template): its
    length, where the second iteration begins (``e0``, the first iteration's ops kept) and where its
    last micro-batch does (``c1``), where the first iteration's step is, which ops run on a stream,
    which are copies and host waits, each op's dependents (its stream's next op too) and the op
    before it on its stream (-1: none)."""

    n: int
    e0: int
    c1: int
    step: int
    gpu: np.ndarray
    copy: np.ndarray
    waits: np.ndarray
    dependents: dict[int, list[int]]
    before: list[int]

    @staticmethod
    def of(ops: Sequence[Op]) -> _Layout | str:
        n = len(ops)
        e0 = next((i for i, o in enumerate(ops) if o.iteration > 0), n)
        starts = _micro_batches(ops, 1)
        c1 = starts[-1] if starts else n
        if c1 + e0 != n or any((a.name, a.kind, a.stream) != (b.name, b.kind, b.stream)
                               for a, b in zip(ops[:e0], ops[c1:], strict=True)):
            return "the second iteration does not end with the first one's last micro-batch"
        step = next((i for i in range(e0) if ops[i].phase == "opt"), e0)
        if step == e0:
            return "the first iteration has no optimizer step"
        dependents: dict[int, list[int]] = {}
        last_on: dict[str, int] = {}
        before = [-1] * n
        for i, o in enumerate(ops):
            if o.kind in _GPU_KINDS:
                if o.stream in last_on:
                    before[i] = last_on[o.stream]
                    dependents.setdefault(before[i], []).append(i)
                last_on[o.stream] = i
            for d in o.deps:
                dependents.setdefault(d, []).append(i)
        kinds = [o.kind for o in ops]
        return _Layout(n, e0, c1, step, np.asarray([k in _GPU_KINDS for k in kinds]),
                       np.asarray([k == "memcpy" for k in kinds]),
                       np.flatnonzero(np.asarray([k == "host_wait" for k in kinds])), dependents, before)


def _launch(o: Op, launch_s: float) -> float:
    """The CPU time of issuing ``o``."""
    return launch_s if o.cpu_s is None else o.cpu_s


def _launches(ops: Sequence[Op], launch_s: float) -> float:
    return sum(_launch(o, launch_s) for o in ops)


#: an input copy up to the first host wait, as :func:`_early_copies` reads it: its place, when the CPU
#: has issued it (before the share of the CPU thread), its stream and bytes, and whether an op other
#: than such a copy ran on its stream before it (its start is then not known here)
_Copy = tuple[int, float, str, int, bool]


def _copies(ops: Sequence[Op], launch_s: float) -> list[_Copy]:
    """The input copies (no deps, no delay) of ``ops`` before its first host wait (see :data:`_Copy`)."""
    out: list[_Copy] = []
    t = 0.0
    blocked: set[str] = set()
    for k, o in enumerate(ops):
        if o.kind == "host_wait":
            break
        t += _launch(o, launch_s)  # its issue (a host op's end)
        if o.kind == "host":
            continue
        if o.kind == "memcpy" and not o.deps and o.delay_s == 0:
            out.append((k, t, o.stream, o.nbytes, o.stream in blocked))
        else:
            blocked.add(o.stream)
    return out


def _early_copies(full: Workload, cut: Cut, topo: Topology, fold: FoldMap | None, launch_s: float,
                  share: float) -> dict[int, dict[int, float]]:
    """Per rank, per kept copy (by its index in the cut program), the latest the full run's copy can
    end, where that is known: the CPU's issue times in the full run are its launches one after the
    other up to the first host wait; a copy without dependencies starts when issued or when the copy
    before it on its stream ends; and, meeting only other copies on its links (each rank's stream
    runs one at a time), it moves at least its links' capacities shared among the ranks whose host
    routes cross them. The copies and their issue times are read once per template, and per rank
    where its own ops (its collectives) take another host time than the template's."""
    routes: dict[int, tuple[int, ...]] = {}
    load: dict[int, int] = {}
    for prog in full.programs:
        route = topo.host_route(prog.rank, to_device=True)
        routes[prog.rank] = tuple(fold.route(route) if fold is not None else route)
        for lid in routes[prog.rank]:
            load[lid] = load.get(lid, 0) + 1
    cap = topo.capacity
    out: dict[int, dict[int, float]] = {}
    read: dict[int, list[_Copy]] = {}
    for prog in full.programs:
        rank, c = prog.rank, cut.dropped[prog.rank]
        ops, base = prog.ops, _base(prog)
        copies = read.get(id(base))
        if copies is None:
            copies = read[id(base)] = _copies(base, launch_s)
        if ops is not base and any(ops[i].cpu_s != base[i].cpu_s or ops[i].delay_s != base[i].delay_s
                                   or ops[i].kind != base[i].kind
                                   for i in compress(count(), map(is_not, ops, base))):
            copies = _copies(ops, launch_s)
        links = routes[rank]
        rate = min((float(cap[lid]) / load[lid] for lid in links), default=math.inf)
        latency = topo.route_latency(topo.host_route(rank, to_device=True))
        mine = out[rank] = {}
        last: dict[str, float] = {}
        for k, t, stream, nbytes, blocked in copies:
            done = math.inf if blocked else (max(t * share, last.get(stream, 0.0)) + latency
                                             + (nbytes / rate if nbytes > 0 else 0.0))
            last[stream] = done
            if k >= c:
                mine[k - c] = done
    return out


def _alone(copies: list[tuple[int, int, float, float, tuple[float, float, float], bool, bool]],
           programs: dict[int, list[Op]], times: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
           topo: Topology, planner: Planner, fold: FoldMap | None, tol: float, dropped: list[Op]) -> str:
    """Why one of ``copies`` (started when issued, each ``(rank, op, ready, end, key, soon)``) may share
    a link with other traffic while it may run, "" where none does. Copies whose keys agree (issued
    alike, ready alike, their CPUs alike ahead in the full run) start together in either run,
    wherever they start: sharing links among themselves they share them alike. A copy that is
    ``soon`` (the full run's ends before any kept op can start there, :func:`_early_copies`) runs
    there among copies only, where no dropped collective crosses its links: it needs to meet no
    collective in the cut run where it ran (from its start to its end), other copies aside; else
    it may meet nothing from when it could start (``ready``) to its end."""
    if not copies:
        return ""
    together = {(rank, i): key for rank, i, _, _, key, _, _ in copies}
    routes: dict[int, set[int]] = {}

    def host_links(rank: int) -> set[int]:
        got = routes.get(rank)
        if got is None:
            route = topo.host_route(rank, to_device=True)
            got = routes[rank] = set(fold.route(route) if fold is not None else route)
        return got

    planned: dict[tuple[object, ...], set[int] | None] = {}

    def coll_links(o: Op) -> set[int] | None:
        c = o.coll
        assert c is not None
        key = (c.op, c.group, c.nbytes, c.root, c.comm_size)
        if key not in planned:
            if c.duration_s is not None:
                planned[key] = set()
            elif c.send_bytes is not None:
                planned[key] = None  # an uneven all-to-all: its flows are not worked out here
            else:
                req = CollectiveRequest(c.op, c.group, c.nbytes, None, c.root, c.comm_size)
                plan = planner.plan(req)
                items = fold.transfers(planner, req, plan) if fold is not None else plan.transfers
                if isinstance(items, TransferTable):
                    planned[key] = set(np.unique(items.flat).tolist())
                else:
                    planned[key] = {lid for links, b, _ in items if b > 0 for lid in links}
        return planned[key]

    crossed: set[int] | None = set()  # the links the dropped collectives cross (None: not known)
    for o in dropped:
        got = coll_links(o)
        if got is None or crossed is None:
            crossed = None
            break
        crossed |= got
    for rank, i, lo, hi, key, soon, taken in copies:
        mine = host_links(rank)
        soon = soon and crossed is not None and not (crossed & mine)
        if taken:  # moved no bytes in the cut run; in the full run, soon, it meets copies only
            if not soon:
                return (f"rank {rank}'s copy {programs[rank][i].name!r}, run with no bytes, shares a link with a "
                        "dropped collective")
            continue
        if soon:
            lo = float(times[rank][1][i])
        for other, ops in programs.items():
            _, start, end = times[other]
            for j in np.flatnonzero((start < hi) & (end > lo)).tolist():
                o = ops[j]
                if (other, j) == (rank, i) or (o.nbytes <= 0 and o.coll is None):
                    continue
                if o.kind == "memcpy" and soon:
                    continue
                if o.kind == "memcpy":
                    theirs = together.get((other, j))
                    if theirs is not None and max(abs(x - y) for x, y in zip(theirs, key, strict=True)) <= tol:
                        continue
                    links: set[int] | None = host_links(other)
                elif o.kind == "collective":
                    links = coll_links(o)
                else:
                    continue
                if links is None or links & mine:
                    return (f"rank {rank}'s copy {programs[rank][i].name!r}, which starts when issued, shares a link "
                            f"with rank {other}'s {o.name!r} while it may run")
    return ""

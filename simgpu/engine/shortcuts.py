"""The engine's shortcuts: when each holds, the run with it, and the fallback where it does not.

Two shortcuts. The fold (:mod:`simgpu.engine.fold`): identical ranks simulated once. Whether it
may be tried is decided before the run (``fold`` asked for, link intervals not recorded for every
link, the builder found identical ranks, :func:`fold_blocker` finds the topology fit, or else
:func:`inside_nodes_only` finds the ranks inside nodes fit: then only those fold); the run itself
may still find the fold inexact and raise :class:`FoldBroken`, and the programs are then built
again, folded by ranks inside nodes only where whole nodes were at fault, by whole nodes only where
the ranks inside them were, else every rank. The periodic
shortcut (:mod:`simgpu.engine.periodic`): a pipeline's identical middle micro-batches simulated
once. Where :func:`periodic.blocker` finds nothing against it, the programs are built and run with
two short counts of micro-batches (each with the fold as it stands), and where the two runs repeat
one period the job's iteration is extended from them; else the job's own count is simulated.
The steady shortcut (:mod:`simgpu.engine.steady_cut`): programs of two iterations run with every
rank's first iteration cut to its last micro-batch, where :func:`steady_cut.shorten` finds them fit
and :func:`steady_check.check` finds the cut run's steady window the full run's from the cut run's own
times; else the full programs. It is tried on a run of the job's own count of micro-batches (not
on the periodic shortcut's short runs) and not where link intervals are recorded; the result's
``meta["steady_cut"]`` says how it went. The caller gives the stages it owns as functions
(building the programs, timing their kernels) and gets back the result, the programs it came
from, why the fold was given up, if it was, and how the periodic shortcut went.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..comm.planner import Planner
from ..graph import PipelineShape, Workload
from ..platform.topology import Topology
from ..result import SimResult
from . import periodic, steady, steady_check, steady_cut
from .core import Engine, EngineOptions
from .fold import FoldBroken, fold_blocker, inside_nodes_only

#: how many micro-batches a pipeline's programs run, given the job's pipeline shape
Choose = Callable[[PipelineShape], int]
#: builds the programs: ``(fold, inside_nodes, micro_batches, whole_nodes)`` -> the workload (folded
#: only where ``fold``, folding ranks inside nodes too only where ``inside_nodes`` and whole nodes only
#: where ``whole_nodes``; ``micro_batches`` chooses how many micro-batches a pipeline runs, None: the job's)
Build = Callable[[bool, bool, Choose | None, bool], Workload]
#: times a workload's kernels: the duration of each kernel spec and the model that timed it
Predict = Callable[[Workload], tuple[np.ndarray, list[str]]]


@dataclass(frozen=True)
class Outcome:
    """What :func:`run` did: the result, the programs it ran, why the fold was not used (empty: it
    was) and how the periodic shortcut went (``periodic: ...`` where it was used, else why not)."""

    result: SimResult
    workload: Workload
    note: str
    periodic: str = ""


def run(topo: Topology, build: Build, predict: Predict, planner: Planner, options: EngineOptions, *,
        fold: bool = True, steady_cut: bool = True, say: Callable[[str], None] = lambda _: None) -> Outcome:
    """Simulate the programs ``build`` gives, folded where the fold holds and with the periodic
    shortcut where it holds (see the module docstring)."""
    runs = _Runs(topo, build, predict, planner, options, fold, say)
    runs.steady_cut = steady_cut
    if not options.periodic or options.links_recorded:
        out = runs.run(None)
        return replace(out, periodic="turned off" if not options.periodic else
                       periodic.blocker(None, True))
    first = runs.run(_first)
    shape = first.workload.pipeline
    why = periodic.blocker(shape, False)
    if why:
        if shape is not None and shape.simulated != shape.micro_batches:
            first = runs.run(None)  # built short to try, but it does not apply
        return replace(first, periodic=why)
    assert shape is not None
    tries = periodic.counts(shape)
    kept: dict[int, Outcome] = {shape.simulated: first}  # runs a later try uses again, of the fold's state
    for i, (m, m2) in enumerate(tries):
        before = runs.state
        short = kept.get(m) or runs.run(_count(m))
        if runs.state != before:  # the fold broke: the runs kept are of the fold as it was
            kept.clear()
        before = runs.state
        long = kept.get(m2) or runs.run(_count(m2))
        if runs.state != before:  # the fold broke on the longer run: the shorter one again, alike
            short = runs.run(_count(m))
        later = {c for pair in tries[i + 1:] for c in pair}
        kept = {c: o for c, o in ((m, short), (m2, long)) if c in later}
        got = periodic.extend(short.result, long.result, m, shape, long.workload.iterations,
                              (m2 - m) // shape.period)
        if isinstance(got, SimResult):
            return Outcome(got, long.workload, long.note, str(got.meta["periodic"]))
        why = got
    say(f"the schedule does not repeat ({why}): simulating all {shape.micro_batches} micro-batches")
    plain = runs.run(None)
    return replace(plain, periodic=f"not used: {why}; all {shape.micro_batches} micro-batches simulated")


def _first(shape: PipelineShape) -> int:
    """The first short count to try, or the job's where none is (:func:`periodic.counts`)."""
    tries = periodic.counts(shape)
    return tries[0][0] if tries else shape.micro_batches


def _count(m: int) -> Choose:
    return lambda _: m


class _Runs:
    """Runs of one job's programs, folded where the fold holds; the fold's state (what to fold, why
    not) carries over from one run to the next, as the periodic shortcut runs several counts."""

    def __init__(self, topo: Topology, build: Build, predict: Predict, planner: Planner, options: EngineOptions,
                 fold: bool, say: Callable[[str], None]) -> None:
        self.topo, self.build, self.predict, self.planner, self.options, self.say = (
            topo, build, predict, planner, options, say)
        self.note = "" if fold else "turned off"
        if fold and options.links_recorded:
            fold, self.note = False, "link intervals are recorded for every link"
        self.fold, self.inside = fold, True  # fold at all; fold ranks inside nodes too
        self.nodes = True  # fold whole nodes too (off where only ranks inside nodes fold)
        self._timed: tuple[list[object], tuple[np.ndarray, list[str]]] | None = None
        self.steady_cut = True  # try the shortened first iteration (simgpu.engine.steady_cut)

    @property
    def state(self) -> tuple[bool, bool, bool, str]:
        return self.fold, self.inside, self.nodes, self.note

    def _predict(self, workload: Workload) -> tuple[np.ndarray, list[str]]:
        """The kernels' durations, reused from the last run where its kernel table is the same."""
        if self._timed is not None and self._timed[0] == workload.kernels:
            return self._timed[1]
        self.say(f"timing {len(workload.kernels):,} kernel shapes")
        timed = self.predict(workload)
        self._timed = (list(workload.kernels), timed)
        return timed

    def run(self, choose: Choose | None) -> Outcome:
        """One run of the programs ``build`` gives for ``choose``, the first of two iterations
        shortened where that is exact and the programs run the job's own count of micro-batches."""
        topo, build = self.topo, self.build
        self.say("building the programs")
        workload = build(self.fold, self.inside, choose, self.nodes)
        if workload.replicas is not None:
            blocker = fold_blocker(topo, workload.replicas)
            if blocker is not None and self.inside and inside_nodes_only(topo, workload.replicas) is not None:
                inside = self._inside_only(choose, blocker)  # whole nodes may not fold here, ranks inside them may
                if inside is not None:
                    workload, blocker = inside, None
            if blocker is not None:
                self.note, self.fold, self.inside = blocker, False, False
                workload = build(False, False, choose, self.nodes)
        elif self.fold and not self.note:
            self.note = "no identical ranks that fill whole nodes or sit alike inside nodes"
        durations, models = self._predict(workload)
        while True:
            try:
                self.say(f"simulating {len(workload.programs):,} ranks")
                result = self._engine(workload, durations, models)
                return Outcome(result, workload, self.note)
            except FoldBroken as e:
                self.note = str(e)
                reps = workload.replicas
                if (not e.inside_nodes and self.inside and self.nodes and reps is not None
                        and inside_nodes_only(topo, reps) is not None):
                    # not exact across whole nodes (a tree across replicas, say): ranks inside nodes may still fold
                    inside = self._inside_only(choose, str(e))
                    if inside is not None:
                        workload = inside
                        durations, models = self._predict(workload)
                        continue
                # whole nodes only, if that may hold (not where only ranks inside nodes were folded)
                self.fold, self.inside = e.inside_nodes and self.inside and self.nodes, False
                workload = build(self.fold, False, choose, self.nodes)
                if workload.replicas is not None:
                    if fold_blocker(topo, workload.replicas) is None:
                        self.note = f"not folded inside nodes: {e}"
                    else:
                        self.fold = False
                        workload = build(False, False, choose, self.nodes)
                durations, models = self._predict(workload)

    def _inside_only(self, choose: Choose | None, why: str) -> Workload | None:
        """The programs folded by ranks inside nodes only, whole nodes not (``why``), where those fold
        on the topology; else None (the note then says ``why``). Either way whole nodes fold no more."""
        self.nodes, self.note = False, f"only ranks inside nodes folded, not whole nodes: {why}"
        workload = self.build(True, True, choose, False)
        if workload.replicas is not None and fold_blocker(self.topo, workload.replicas) is None:
            return workload
        self.note = why
        return None

    def _engine(self, workload: Workload, durations: np.ndarray, models: list[str]) -> SimResult:
        """The run of ``workload``; of its first iteration cut to its last micro-batch where that
        holds (see :mod:`simgpu.engine.steady_check`), else of the whole programs."""
        topo, planner, options = self.topo, self.planner, self.options
        shape = workload.pipeline
        why = ""
        if workload.iterations < 2:
            return Engine(topo, workload, durations, models, planner, options).run()
        if not self.steady_cut:
            why = "turned off"
        elif shape is not None and shape.simulated != shape.micro_batches:
            why = "a short run of the periodic shortcut"
        elif options.links_recorded:
            why = "link intervals are recorded for every link"
        if not why:
            got = steady_cut.shorten(workload)
            if isinstance(got, str):
                why = got
            else:
                self.say("simulating the first iteration from its last micro-batch")
                short = Engine(topo, got.workload, durations, models, planner, replace(options, op_times=True)).run()
                why = steady_check.check(short, got, workload, topo, planner, self._durations_list(durations), options)
                if not why:
                    steady_cut.restore(short, got, topo)
                    short.meta["steady_cut"] = (f"used ({sum(len(p.ops) for p in got.workload.programs):,} of "
                                                f"{sum(len(p.ops) for p in workload.programs):,} ops simulated)")
                    return short
                self.say(f"the shortened first iteration may differ ({why}): simulating both in full")
        # steady_state: check (not a periodic short run): how each iteration's tail repeats the one before
        check = workload.iterations > 2 and (shape is None or shape.simulated == shape.micro_batches)
        result = Engine(topo, workload, durations, models, planner, replace(options, op_times=True) if check
                        else options).run()
        result.meta["steady_cut"] = f"not used: {why}"
        if check:
            times = result.meta.pop("op_times")
            result.meta["steady_tails"] = [
                {"iteration": t.iteration, "offset_s": t.offset_s, "rank": t.rank, "op": t.op}
                for t in steady.tail_repeats(workload, times, result.meta["iteration_ends_s"])]
        return result

    @staticmethod
    def _durations_list(durations: np.ndarray) -> list[float]:
        return np.asarray(durations, dtype=float).tolist()


def slack_note(result: SimResult, note: str) -> str:
    """The fold note once the run is over: where folded replicas sit differently on the leaf switches,
    how much their latencies differ (taken out of ``result.meta``)."""
    slack = float(result.meta.pop("fold_slack_s", 0.0))
    if slack > 0:
        return (f"replicas sit differently on the leaf switches; their latencies differ by at most "
                f"{slack * 1e6:.1f} us in all ({slack / max(result.iteration_time_s, 1e-30):.3%} of the iteration)")
    return note

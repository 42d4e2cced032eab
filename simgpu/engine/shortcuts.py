"""The engine's shortcuts: when each holds, the run with it, and the fallback where it does not.

One shortcut today, the fold (:mod:`simgpu.engine.fold`): identical ranks simulated once. Whether
it may be tried is decided before the run (``fold`` asked for, link intervals not recorded for
every link, the builder found identical ranks, :func:`fold_blocker` finds the topology fit); the
run itself may still find the fold inexact and raise :class:`FoldBroken`, and the programs are then
built again, folded by whole nodes only where that may still hold, else every rank. The caller
gives the stages it owns as functions (building the programs, timing their kernels) and gets back
the result, the programs it came from and why the fold was given up, if it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..comm.planner import Planner
from ..graph import Workload
from ..platform.topology import Topology
from .core import Engine, EngineOptions
from .fold import FoldBroken, fold_blocker
from .result import SimResult

#: builds the programs: ``(fold, inside_nodes)`` -> the workload (folded only where ``fold``, folding
#: ranks inside nodes too only where ``inside_nodes``)
Build = Callable[[bool, bool], Workload]
#: times a workload's kernels: the duration of each kernel spec and the model that timed it
Predict = Callable[[Workload], tuple[np.ndarray, list[str]]]


@dataclass(frozen=True)
class Outcome:
    """What :func:`run` did: the result, the programs it ran and why the fold was not used (empty: it was)."""

    result: SimResult
    workload: Workload
    note: str


def run(topo: Topology, build: Build, predict: Predict, planner: Planner, options: EngineOptions, *,
        fold: bool = True, say: Callable[[str], None] = lambda _: None) -> Outcome:
    """Simulate the programs ``build`` gives, folded where the fold holds (see the module docstring)."""
    note = "" if fold else "turned off"
    if fold and options.record_links:
        fold, note = False, "link intervals are recorded for every link"
    say("building the programs")
    workload = build(fold, True)
    if workload.replicas is not None:
        blocker = fold_blocker(topo, workload.replicas)
        if blocker is not None:
            note = blocker
            workload = build(False, False)
    elif fold:
        note = "no identical ranks that fill whole nodes or sit alike inside nodes"
    say(f"timing {len(workload.kernels):,} kernel shapes")
    durations, models = predict(workload)
    inside = True  # fold ranks inside nodes too
    while True:
        try:
            say(f"simulating {len(workload.programs):,} ranks")
            result = Engine(topo, workload, durations, models, planner, options).run()
            return Outcome(result, workload, note)
        except FoldBroken as e:
            note = str(e)
            workload = build(e.inside_nodes and inside, False)  # whole nodes folded only, if that may hold
            inside = False
            if workload.replicas is not None:
                if fold_blocker(topo, workload.replicas) is None:
                    note = f"not folded inside nodes: {e}"
                else:
                    workload = build(False, False)
            durations, models = predict(workload)


def slack_note(result: SimResult, note: str) -> str:
    """The fold note once the run is over: where folded replicas sit differently on the leaf switches,
    how much their latencies differ (taken out of ``result.meta``)."""
    slack = float(result.meta.pop("fold_slack_s", 0.0))
    if slack > 0:
        return (f"replicas sit differently on the leaf switches; their latencies differ by at most "
                f"{slack * 1e6:.1f} us in all ({slack / max(result.iteration_time_s, 1e-30):.3%} of the iteration)")
    return note

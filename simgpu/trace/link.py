"""Linking the replay programs of several ranks: which collectives meet, and how the clocks differ.

The i-th collective of a process group on one rank is the i-th of that group on every other member
(NCCL runs a communicator's collectives in order). A process group is known by its name when the
trace records it, else by its NCCL stream, together with its member ranks. Where the traced members
of a group disagree on its collectives (different counts or kinds, as in sampled traces), that group
is replayed without rendezvous and a warning says so.

Every member of a collective leaves it at (nearly) the same moment, so the median difference of
their end times is the offset between two ranks' clocks; it is removed before replay when the
differences agree (otherwise the clocks are taken as synchronised, with a warning). A measured
collective lasts, once its last member arrives, as long as the shortest of its members' kernels
(the member that arrived last did not wait for the others).

Units: seconds, except ``skew_us`` (microseconds, the traces' clock unit).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .build import Item, RankProgram
from .classify import CollInfo

#: Clock offsets above this are reported (microseconds).
SKEW_REPORT_US = 50.0
#: Offsets are trusted when the collectives' end differences agree within this (median deviation, us).
SKEW_SPREAD_US = 20.0


@dataclass
class Links:
    """``keys[(p, i)]``: rendezvous key of item ``i`` of program ``p``; ``members[key]``: the
    programs that meet there; ``duration_s[key]``: the measured time once all have arrived;
    ``index[(p, i)]``: (process group bucket, position within it), the same on every member."""

    keys: dict[tuple[int, int], str] = field(default_factory=dict)
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)
    duration_s: dict[str, float] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)
    index: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    skew_us: list[float] = field(default_factory=list)
    consistent: bool = True
    warnings: Counter[str] = field(default_factory=Counter)


def _coll(it: Item) -> CollInfo:
    if it.coll is None:
        raise ValueError(f"item {it.name!r} has no collective")
    return it.coll


def _buckets(prog: RankProgram) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, it in enumerate(prog.items):
        if it.kind == "collective" and it.coll is not None:
            group = it.coll.group
            out[f"{it.coll.pg}[{group[0]}..{group[-1]}/{len(group)}]"].append(i)
    return out


def link_programs(programs: Sequence[RankProgram]) -> Links:
    """Match the collectives of ``programs`` across ranks and estimate their clock offsets."""
    links = Links(skew_us=[0.0] * len(programs))
    per_prog = [_buckets(p) for p in programs]
    names = sorted({b for pb in per_prog for b in pb})
    diffs: dict[int, list[float]] = defaultdict(list)
    for b in names:
        members = [p for p, pb in enumerate(per_prog) if b in pb]
        seqs = [per_prog[p][b] for p in members]
        ops = [[_coll(programs[p].items[i]).op for i in seq] for p, seq in zip(members, seqs, strict=True)]
        agree = all(len(s) == len(seqs[0]) for s in seqs) and all(o == ops[0] for o in ops)
        if len(members) > 1 and not agree:
            links.consistent = False
            links.warnings[f"process group {b}: traced ranks disagree on its collectives "
                           f"(counts {[len(s) for s in seqs]}); replayed without rendezvous"] += 1
        for p, seq in zip(members, seqs, strict=True):
            for k, i in enumerate(seq):
                links.index[(p, i)] = (b, k)
        if len(members) > 1 and agree:
            ref = members[0]
            for k in range(len(seqs[0])):
                key = f"{b}#{k}"
                its = [programs[p].items[seq[k]] for p, seq in zip(members, seqs, strict=True)]
                links.members[key] = tuple(members)
                links.duration_s[key] = min(it.dur_s for it in its)
                links.nbytes[key] = max(_coll(it).nbytes for it in its)
                for p, seq in zip(members, seqs, strict=True):
                    links.keys[(p, seq[k])] = key
                end_ref = programs[ref].origin_us + its[0].end_s * 1e6
                for p, it in zip(members[1:], its[1:], strict=True):
                    diffs[p].append(programs[p].origin_us + it.end_s * 1e6 - end_ref if ref == 0 else float("nan"))
        else:
            for p, seq in zip(members, seqs, strict=True):
                for k, i in enumerate(seq):
                    key = f"r{programs[p].rank}/{b}#{k}"
                    it = programs[p].items[i]
                    links.keys[(p, i)] = key
                    links.members[key] = (p,)
                    links.duration_s[key] = it.dur_s
                    links.nbytes[key] = _coll(it).nbytes
    if any(set(pb) != set(per_prog[0]) for pb in per_prog):
        links.consistent = False
    for p, ds in diffs.items():
        finite = [d for d in ds if d == d]
        if not finite:
            continue
        mid = statistics.median(finite)
        spread = statistics.median(abs(d - mid) for d in finite)
        if spread <= SKEW_SPREAD_US:
            links.skew_us[p] = mid
        else:
            links.warnings[f"rank {programs[p].rank}: its collectives end {spread:.0f} us apart from rank "
                           f"{programs[0].rank}'s (median deviation); clocks taken as synchronised"] += 1
    worst = max((abs(s) for s in links.skew_us), default=0.0)
    if worst > SKEW_REPORT_US:
        links.warnings[f"clock skew between ranks up to {worst:.0f} us, removed by aligning collective ends"] += 1
    return links

"""The printed summary table: a compact plain-text view of :func:`simgpu.report.summary.summarize`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .kinds import kinds_lines
from .summary import MAX_TABLE_RANKS


def _f(x: Any, fmt: str = ".3f", none: str = "n/a") -> str:
    return none if x is None else format(float(x), fmt)


def _pct(part: Any, whole: Any) -> str:
    if part is None or not whole:
        return "  n/a"
    return f"{100.0 * float(part) / float(whole):5.1f}%"


def variability_lines(var: Mapping[str, Any], t: Any) -> list[str]:
    """The summary's ``variability`` block as lines: the stretch, what caused it, the waits."""
    stretch = var.get("stretch")
    lines = [f"variability  {'; '.join(var.get('entries') or [])}",
             f"  without it  {_f(var.get('without_variability_ms'))} ms (a second simulation of the same job with "
             f"the variability section removed); stretched {_f(var.get('stretch_ms'))} ms"
             + ("" if stretch is None else f", x {float(stretch):.3f}")]
    waits = var.get("rendezvous_wait_ms") or {}
    if waits.get("longest"):
        least = waits.get("shortest") or {}
        lines.append(f"  waited at rendezvous (ms, arrival to the last member's, over {waits.get('collectives')} "
                     "collectives)  " + ", ".join(f"rank {w['rank']} {_f(w['wait_ms'])}" for w in waits["longest"])
                     + f"; mean {_f(waits.get('mean'))}"
                     + (f"; least rank {least['rank']} {_f(least.get('wait_ms'))}" if least else ""))
    slow = var.get("slowest_to_gather") or []
    if slow:
        lines.append("  slowest to gather (ms from first to last arrival, the last rank)  "
                     + ", ".join(f"{c['name']} {_f(c['gather_ms'])} rank {c['last_rank']}" for c in slow))
    return lines


def format_summary(summary: Mapping[str, Any]) -> str:
    """A compact plain-text table of a summary made by :func:`summarize` (or read back from JSON)."""
    t = summary.get("iteration_time_ms")
    lines: list[str] = []
    lines.append(f"workload  {summary.get('workload')}   platform  {summary.get('platform')}")
    lines.append(f"nodes  {summary.get('nodes')}   GPUs  {summary.get('gpus')} (total)")
    tp = summary.get("throughput") or {}
    thr = f"{_f(tp.get('samples_per_s'), ',.1f')} samples/s"
    if "tokens_per_s" in tp:
        thr += f", {_f(tp.get('tokens_per_s'), ',.0f')} tokens/s"
    mfu = summary.get("mfu")
    mfu_s = "n/a" if mfu is None else f"{100 * mfu:.1f}%"
    lines.append(f"iteration  {_f(t)} ms   throughput  {thr}   MFU  {mfu_s}")
    measured = summary.get("measured_step_time_ms")
    if measured is not None:
        lines.append(f"traced step  {_f(measured)} ms   simulated / traced  {_pct(t, measured).strip()}")
    steady = summary.get("steady_state")
    if steady and str(steady).startswith("steady"):
        lines.append(f"iteration found  {steady}")
    periodic = str(summary.get("periodic") or "")
    if periodic.startswith("periodic"):
        lines.append(f"repeated  {periodic.removeprefix('periodic: ')}")
    if summary.get("pipeline"):
        lines.append(f"pipeline  {summary['pipeline']}")
    fold = summary.get("fold") or {}
    if fold.get("replicas", 1) > 1:
        lines.append(f"folded  each simulated rank stands for {fold['replicas']} identical ranks; the timeline "
                     f"shows the representatives" + (f" ({fold['note']})" if fold.get("note") else ""))

    var = summary.get("variability")
    if var:
        lines += variability_lines(var, t)
    if summary.get("uncertainty"):
        lines += uncertainty_lines(summary["uncertainty"], t)

    run = summary.get("run") or {}
    if run.get("overrides"):
        lines.append("overrides  " + "  ".join(str(o) for o in run["overrides"]))

    b = summary.get("breakdown_ms") or {}
    lines.append("")
    lines.append("breakdown (mean over ranks; % of the iteration time: compute + exposed comm + idle = 100%, "
                 "communication overlaps compute)")
    for key, label in (
        ("compute", "compute"),
        ("communication", "communication"),
        ("exposed_communication", "exposed comm"),
        ("idle", "idle"),
    ):
        lines.append(f"  {label:<15}{_f(b.get(key)):>12} ms  {_pct(b.get(key), t)}")
    kinds = summary.get("exposed_communication_by_kind_ms") or {}
    if kinds:
        lines.append("  exposed by kind  " + ", ".join(f"{k} {_f(v)} ms" for k, v in kinds.items()))
    if summary.get("by_kind"):  # a mixed platform's kinds of node
        lines += kinds_lines(summary["by_kind"])

    rows = summary.get("per_rank") or []
    cols = ("compute_ms", "communication_ms", "exposed_communication_ms", "idle_ms", "cpu_busy_ms")
    heads = ("compute", "comm", "exposed", "idle", "cpu busy")
    if rows:
        lines.append("")
        lines.append("per rank (ms)")
        lines.append("  " + f"{'rank':<6}" + "".join(f"{h:>12}" for h in heads))
        if len(rows) <= MAX_TABLE_RANKS:
            for r in rows:
                lines.append("  " + f"{r['rank']:<6}" + "".join(f"{_f(r.get(c)):>12}" for c in cols))
        else:
            values = {c: [float(r[c]) for r in rows if r.get(c) is not None] for c in cols}
            for label, fn in (("min", min), ("mean", lambda v: sum(v) / len(v)), ("max", max)):
                cells = "".join(f"{_f(fn(values[c]) if values[c] else None):>12}" for c in cols)
                lines.append("  " + f"{label:<6}" + cells)
            lines.append(f"  ({len(rows)} ranks)")

    cats = list((summary.get("categories_ms") or {}).items())
    if cats:
        lines.append("")
        lines.append("top categories (ms, mean over ranks; % of the iteration time, categories overlap)")
        for name, ms in cats[:5]:
            lines.append(f"  {name:<20}{_f(ms):>12}  {_pct(ms, t)}")

    links = summary.get("busiest_links") or []
    if links:
        lines.append("")
        lines.append("busiest links (util: mean share of the link's bandwidth over the iteration)")
        lines.append(f"  {'link':<32}{'kind':<12}{'util':>8}{'GB':>10}{'busy ms':>12}")
        for lk in links[:5]:
            util = lk.get("utilisation")
            util_s = "n/a" if util is None else f"{100 * util:.1f}%"
            lines.append(
                f"  {lk.get('link')!s:<32}{lk.get('kind')!s:<12}{util_s:>8}"
                f"{_f(lk.get('gbytes')):>10}{_f(lk.get('busy_ms')):>12}"
            )

    mem = summary.get("memory_gib")
    if mem:
        lines.append("")
        cap = mem.get("capacity")
        head = f"memory per GPU (max rank {mem.get('rank')})  {_f(mem.get('total'), '.2f')} GiB"
        if cap:
            head += f" of {_f(cap, '.1f')} GiB ({_pct(mem.get('total'), cap).strip()} of the GPU's memory)"
        lines.append(head)
        usage = mem.get("usage") or {}
        if usage:
            lines.append("  " + ", ".join(f"{k} {_f(v, '.2f')}" for k, v in usage.items()))

    models = summary.get("kernel_models") or {}
    if models:
        lines.append("")
        lines.append("kernel models (share of kernel time)  "
                     + ", ".join(f"{k} {100 * float(v):.1f}%" for k, v in models.items()))

    notes = summary.get("model_notes") or []
    if notes:
        lines.append("")
        lines.append("model read but approximated")
        lines += [f"  {n}" for n in notes]

    lines.append("")
    versions = run.get("versions") or {}
    tail = f"   simgpu {versions['simgpu']}" if "simgpu" in versions else ""
    lines.append(f"seed {summary.get('seed')}   events {summary.get('events')}{tail}")
    return "\n".join(lines) + "\n"


#: How many sources the printed uncertainty block names.
TOP_SOURCES = 4


def uncertainty_lines(u: Mapping[str, Any], point_ms: float | None) -> list[str]:
    """The printed block of a summary's ``uncertainty`` section (``--uncertainty N``)."""
    t = u["iteration_time_ms"]
    out = [f"uncertainty  {u['draws']} correlated draws (seed {u['seed']}), 80% interval: iteration P10 "
           f"{_f(t['p10'])}  P50 {_f(t['p50'])}  P90 {_f(t['p90'])} ms (point {_f(point_ms)}, P90/P10 "
           f"{t['p90'] / t['p10']:.3f})"]
    for name, q in (u.get("throughput") or {}).items():
        out.append(f"  {name.replace('_', ' '):<14}P10 {_f(q['p10'], ',.1f')}  P50 {_f(q['p50'], ',.1f')}  "
                   f"P90 {_f(q['p90'], ',.1f')}")
    top = list((u.get("variance_share") or {}).items())[:TOP_SOURCES]
    if top:
        out.append("  spread from  " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in top)
                   + " (share of the variance of ln iteration time)")
    return out

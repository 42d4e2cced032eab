"""The goodput of a resolved goodput file: the best intervals, the curve, the cluster-size sweep.

:func:`compute` returns the JSON-ready summary ``simgpu goodput`` writes to ``summary.json``;
:func:`table` is the text it prints.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..report.summary import round_sig
from .model import analytic, daly, exact, interval_grid, monte_carlo_best, timelines, young
from .spec import DAY, HOUR, Goodput


def _r(x: float | None) -> float | None:
    return None if x is None else round_sig(float(x))


def _at(g: Goodput, tau: float, mc: tuple[float, float] | None = None) -> dict[str, Any]:
    c, r, m = g.checkpoint_s, g.restart_s, g.mtbf_s
    out: dict[str, Any] = {"interval_s": _r(tau), "iterations": max(1, round(tau / g.iteration_s)),
                           "goodput": _r(float(analytic(tau, c, r, m)))}
    if mc is not None:
        out["monte_carlo"], out["monte_carlo_stderr"] = _r(mc[0]), _r(mc[1])
    return out


def _scale_sizes(g: Goodput) -> list[int]:
    if g.spec.scale_gpus:
        return sorted(set(g.spec.scale_gpus))
    top = 2 ** math.ceil(math.log2(g.gpus))
    sizes = {top // 2**k for k in range(0, 10) if top // 2**k >= 8} | {top * 2, top * 4, g.gpus}
    return sorted(sizes)


def compute(g: Goodput) -> dict[str, Any]:
    """The summary: job, failure rate, checkpoint costs, best intervals (Young, Daly, exact, Monte
    Carlo) with their goodput and differences, the goodput at the given interval, the curve and the
    cluster-size sweep."""
    s, mc = g.spec, g.spec.monte_carlo
    c, r, m = g.checkpoint_s, g.restart_s, g.mtbf_s
    tl = timelines(m, r, mc.replicas, mc.horizon_mtbf, s.seed)
    t_young, t_daly, t_exact = young(c, m), daly(c, m), exact(c, m)
    g_young_mc, e_young_mc = tl.goodput(t_young, c)
    g_daly_mc, e_daly_mc = tl.goodput(t_daly, c)
    t_mc, g_mc, e_mc = monte_carlo_best(tl, t_exact, c)
    best: dict[str, Any] = {
        "young": _at(g, t_young, (float(g_young_mc[0]), float(e_young_mc[0]))),
        "daly": _at(g, t_daly, (float(g_daly_mc[0]), float(e_daly_mc[0]))),
        "exact": _at(g, t_exact),
        "monte_carlo": {"interval_s": _r(t_mc), "iterations": max(1, round(t_mc / g.iteration_s)),
                        "goodput": _r(g_mc), "stderr": _r(e_mc)},
    }
    g_daly = float(analytic(t_daly, c, r, m))
    difference = {
        "interval_s": _r(t_mc - t_daly), "interval_share": _r(t_mc / t_daly - 1),
        "goodput": _r(g_mc - g_daly), "goodput_at_daly": _r(float(g_daly_mc[0]) - g_daly),
    }
    given = None
    if s.checkpoint.interval_s is not None:
        gm, ge = tl.goodput(s.checkpoint.interval_s, c)
        given = _at(g, s.checkpoint.interval_s, (float(gm[0]), float(ge[0])))
    grid = interval_grid(t_exact, c, m, mc.points)
    curve_mc, curve_err = tl.goodput(grid, c)
    curve = [{"interval_s": _r(t), "goodput": _r(float(analytic(t, c, r, m))), "monte_carlo": _r(float(gm)),
              "stderr": _r(float(ge))} for t, gm, ge in zip(grid, curve_mc, curve_err, strict=True)]
    scale = []
    for n in _scale_sizes(g):
        mn = m * g.gpus / n
        tn = daly(c, mn)
        tln = timelines(mn, r, mc.replicas, mc.horizon_mtbf, s.seed)
        gm, ge = tln.goodput(tn, c)
        scale.append({"gpus": n, "mtbf_hours": _r(mn / HOUR), "interval_s": _r(tn),
                      "goodput": _r(float(analytic(tn, c, r, mn))), "monte_carlo": _r(float(gm[0])),
                      "stderr": _r(float(ge[0]))})
    job: dict[str, Any] = {"source": g.workload_file or "given", "iteration_s": _r(g.iteration_s), "gpus": g.gpus,
                           "state_gib": _r(g.state_gib), "state": g.state_note if g.state_gib is not None else None}
    return {
        "name": s.name,
        "job": job,
        "failures": {"mtbf_hours": _r(m / HOUR), "interruptions_per_day": _r(g.rate_per_s * DAY),
                     "components": [{k: (_r(v) if isinstance(v, float) else v) for k, v in p.items()}
                                    for p in g.components]},
        "checkpoint": {"checkpoint_s": _r(c), "restart_s": _r(r), "interval_s": _r(s.checkpoint.interval_s)},
        "goodput": given["goodput"] if given else best["daly"]["goodput"],
        "at_interval": given,
        "best": best,
        "difference": difference,
        "curve": curve,
        "scale": scale,
        "monte_carlo": {"replicas": mc.replicas, "horizon_mtbf": _r(mc.horizon_mtbf), "seed": s.seed,
                        "failures": tl.failures},
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    if abs(s) >= 2 * HOUR:
        return f"{s / HOUR:.2f} h"
    if abs(s) >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def table(summary: dict[str, Any]) -> str:
    """The printed report."""
    j, f, ck, b = summary["job"], summary["failures"], summary["checkpoint"], summary["best"]
    lines = [
        f"{summary['name']}: {j['gpus']} GPUs, {_dur(j['iteration_s'])} per iteration"
        + (f", checkpoint state {j['state_gib']:.4g} GiB" if j["state_gib"] else ""),
        f"  failures: job MTBF {_dur(f['mtbf_hours'] * HOUR)} ({f['interruptions_per_day']:.3g} interruptions a day); "
        f"checkpoint {_dur(ck['checkpoint_s'])}, restart {_dur(ck['restart_s'])}",
        "",
        f"  {'interval':<22}{'seconds':>12}{'iterations':>12}{'goodput':>11}{'Monte Carlo':>14}",
    ]
    rows = []
    if summary["at_interval"]:
        rows.append(("given", summary["at_interval"]))
    rows += [("Young sqrt(2CM)", b["young"]), ("Daly (higher order)", b["daly"]), ("exact optimum", b["exact"])]
    for label, row in rows:
        lines.append(f"  {label:<22}{row['interval_s']:>12.5g}{row['iterations']:>12}{_pct(row['goodput']):>11}"
                     f"{_pct(row.get('monte_carlo')):>14}")
    mcb = b["monte_carlo"]
    lines.append(f"  {'Monte Carlo best':<22}{mcb['interval_s']:>12.5g}{mcb['iterations']:>12}{'':>11}"
                 f"{_pct(mcb['goodput']):>14}")
    d = summary["difference"]
    lines += ["", f"  Monte Carlo - Daly: interval {d['interval_s']:+.3g} s ({100 * d['interval_share']:+.1f} %), "
                  f"best goodput {100 * d['goodput']:+.3f} points (+/- {100 * mcb['stderr']:.3f}); "
                  f"{summary['monte_carlo']['failures']} simulated failures"]
    lines += ["", f"  {'GPUs':>8}{'MTBF':>12}{'best interval':>16}{'goodput':>11}{'Monte Carlo':>14}"]
    for row in summary["scale"]:
        lines.append(f"  {row['gpus']:>8}{_dur(row['mtbf_hours'] * HOUR):>12}{_dur(row['interval_s']):>16}"
                     f"{_pct(row['goodput']):>11}{_pct(row['monte_carlo']):>14}")
    return "\n".join(lines)


def curve_arrays(summary: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(interval, analytic, Monte Carlo, standard error) of the curve."""
    c = summary["curve"]
    return (np.array([p["interval_s"] for p in c]), np.array([p["goodput"] for p in c]),
            np.array([p["monte_carlo"] for p in c]), np.array([p["stderr"] for p in c]))

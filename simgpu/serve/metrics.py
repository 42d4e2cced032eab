"""Serving figures from a :class:`~simgpu.serve.loop.ServeResult`: latency percentiles, throughput,
goodput under the SLOs, KV-cache occupancy, and the per-request table.

TTFT is arrival to first token; TPOT (time per output token) is the time between tokens after the
first, ``(E2E - TTFT) / (output - 1)`` (requests of one output token have none); E2E is arrival to
last token. A request counts in goodput when it meets both the TTFT and the TPOT objective.
Throughput is measured from the first arrival to the last completion. A closed loop's warm-up
requests (the first ``warmup`` sent) are in the request table (``warmup`` column) but left out of
the latency figures and goodput, as the serving benchmarks leave out theirs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .loop import ServeResult
from .spec import SloSpec

PERCENTILES = (50, 90, 99)


def request_table(res: ServeResult) -> pd.DataFrame:
    """One row per request (times in ms)."""
    rq = res.requests
    ttft = res.first_token_s - rq.arrival_s
    e2e = res.finish_s - rq.arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(rq.output > 1, (e2e - ttft) / (rq.output - 1), np.nan)
    return pd.DataFrame({
        "request": np.arange(len(rq)), "arrival_ms": rq.arrival_s * 1e3, "prompt_tokens": rq.prompt,
        "output_tokens": rq.output, "ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3, "e2e_ms": e2e * 1e3,
        "finish_ms": res.finish_s * 1e3, "replica": res.replica, "decode_replica": res.decode_replica,
        "kv_transfer_ms": res.transfer_s * 1e3, "preemptions": res.preemptions,
        "warmup": np.arange(len(rq)) < res.warmup,
    })


def _stats(x: np.ndarray) -> dict[str, float | None]:
    x = x[np.isfinite(x)]
    if not len(x):
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": float(x.mean()), **{f"p{q}": float(np.percentile(x, q)) for q in PERCENTILES}}


def time_average(points: list[tuple[float, int]], t0: float, t1: float) -> float:
    """The time average over [t0, t1] of a step function given as (time, value) changes."""
    if t1 <= t0 or not points:
        return 0.0
    t = np.array([p[0] for p in points])
    v = np.array([p[1] for p in points], dtype=float)
    edges = np.clip(np.append(t, t1), t0, t1)
    return float(np.sum(v * np.diff(edges)) / (t1 - t0))


def kv_occupancy(res: ServeResult) -> pd.DataFrame:
    """KV blocks in use per replica at the start of each iteration, and the share of the cache."""
    df = pd.DataFrame(res.kv_samples, columns=["time_s", "pool", "replica", "blocks_used"])
    totals = np.array([p.timer.memory.kv_blocks for p in res.pools], dtype=float)
    df["pool"] = df["pool"].astype(int)
    df["share"] = df["blocks_used"] / totals[df["pool"].to_numpy()] if len(df) else []
    df["pool"] = [res.pools[p].name for p in df["pool"]]
    return df


def summarize(res: ServeResult, slo: SloSpec) -> dict[str, Any]:
    """The figures of ``summary.json``."""
    table = request_table(res)
    rq = res.requests
    measured = table[~table["warmup"]]
    span = float(np.nanmax(res.finish_s) - rq.arrival_s[0])
    gpus = sum(p.gpus for p in res.pools)
    out_tokens = int(rq.output.sum())
    ok = (measured["ttft_ms"] <= slo.ttft_ms) & (measured["tpot_ms"].fillna(0) <= slo.tpot_ms)
    occ = kv_occupancy(res)
    iters = pd.DataFrame(res.iterations, columns=["pool", "replica", "start_s", "end_s", "prefill_tokens",
                                                  "decodes"])
    batch = iters["decodes"] + (iters["prefill_tokens"] > 0)
    p99 = {k: _stats(measured[f"{k}_ms"].to_numpy())["p99"] for k in ("ttft", "tpot")}
    return {
        "requests": len(rq),
        "gpus": gpus,
        "duration_s": span,
        "ttft_ms": _stats(measured["ttft_ms"].to_numpy()),
        "tpot_ms": _stats(measured["tpot_ms"].to_numpy()),
        "e2e_ms": _stats(measured["e2e_ms"].to_numpy()),
        "throughput": {
            "requests_per_s": len(rq) / span if span > 0 else None,
            "output_tokens_per_s": out_tokens / span if span > 0 else None,
            "output_tokens_per_s_per_gpu": out_tokens / span / gpus if span > 0 else None,
            "tokens_per_s": (out_tokens + int(rq.prompt.sum())) / span if span > 0 else None,
        },
        "goodput": {
            "slo_ttft_ms": slo.ttft_ms, "slo_tpot_ms": slo.tpot_ms,
            "requests_per_s": float(ok.sum()) / span if span > 0 else None,
            "warmup_requests": int(res.warmup),
            "attained": float(ok.mean()),
            "p99_meets_slo": bool(p99["ttft"] is not None and p99["ttft"] <= slo.ttft_ms
                                  and (p99["tpot"] is None or p99["tpot"] <= slo.tpot_ms)),
        },
        "kv_cache": {
            "mean_share": float(occ["share"].mean()) if len(occ) else 0.0,
            "peak_share": float(occ["share"].max()) if len(occ) else 0.0,
            "preemptions": int(res.preemptions.sum()),
        },
        "iterations": len(res.iterations),
        "mean_batch": float(batch.mean()) if len(batch) else 0.0,
        "distinct_steps_timed": res.distinct_steps,
        "kv_transfer_ms": _stats(res.transfer_s[res.decode_replica >= 0] * 1e3) if len(res.pools) == 2 else None,
        "mean_in_system": time_average(res.in_system, float(rq.arrival_s[0]), float(np.nanmax(res.finish_s))),
        **res.meta,
    }


def format_summary(s: dict[str, Any]) -> str:
    """The printed summary."""
    def ms(d: dict[str, Any]) -> str:
        if d.get("mean") is None:
            return "-"
        return f"mean {d['mean']:9.1f}  P50 {d['p50']:9.1f}  P90 {d['p90']:9.1f}  P99 {d['p99']:9.1f}"

    th, g = s["throughput"], s["goodput"]
    lines = [f"{s.get('name', 'serving')}: {s['requests']:,} requests on {s['gpus']} GPUs"
             + (f" ({s['deployment']})" if s.get("deployment") else ""),
             f"  TTFT ms   {ms(s['ttft_ms'])}",
             f"  TPOT ms   {ms(s['tpot_ms'])}",
             f"  E2E ms    {ms(s['e2e_ms'])}",
             f"  throughput {th['requests_per_s']:.2f} req/s, {th['output_tokens_per_s']:,.0f} output tokens/s "
             f"({th['output_tokens_per_s_per_gpu']:,.0f} per GPU) over {s['duration_s']:.1f} s",
             f"  goodput    {g['requests_per_s']:.2f} req/s ({g['attained']:.1%} of requests meet TTFT <= "
             f"{g['slo_ttft_ms']:g} ms and TPOT <= {g['slo_tpot_ms']:g} ms; P99 "
             f"{'meets' if g['p99_meets_slo'] else 'misses'} the SLO)",
             f"  KV cache   mean {s['kv_cache']['mean_share']:.1%}, peak {s['kv_cache']['peak_share']:.1%} of "
             f"blocks; {s['kv_cache']['preemptions']:,} preemptions; {s['iterations']:,} iterations, mean batch "
             f"{s['mean_batch']:.1f}"]
    if s.get("kv_transfer_ms"):
        lines.append(f"  KV transfer ms {ms(s['kv_transfer_ms'])}")
    return "\n".join(lines)

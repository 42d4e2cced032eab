"""Whole-iteration predictions against measured Megatron training iterations (vTrain, one A100 node).

``../shared/data/iterations/vtrain-single-node/`` holds 1,440 iteration times of GPT models (hidden
1024 or 2048, 16 heads, 12-24 layers, sequence 1,024) trained with Megatron-DeepSpeed on 2, 4 or 8
GPUs of one 8x A100 NVSwitch node over many tensor / data / pipeline parallel degrees, micro- and
global batches. Each row becomes a workload (:func:`workload`) as that code base runs it: fp16,
Megatron's core (unfused) attention with dropout 0.1, full activation recomputation with the
host synchronising at each checkpointed block (Megatron-DeepSpeed's ``--synchronize-each-layer``;
the measured times add up layer by layer, output layer included, as only then they do), 1F1B,
gradients all-reduced after the backward (vTrain's ``use_gradient_bucket: false``), GPT-2's
vocabulary split unpadded over tp (``50257 // tp`` rows per rank, as the measured code does); it is
simulated on ``dgx_a100`` as is. The one figure not taken from a datasheet is the host time
Megatron-DeepSpeed spends per launched op (:data:`HOST_OVERHEAD_US`), calibrated by a fixed rule
on host-bound rows of the 12-layer models only (:func:`calibrate_host_overhead`).

Scores: the geometric-mean absolute error of iteration time, ``exp(mean |ln(pred / meas)|) - 1``
(the project's convention), and, within each model and global batch, the Spearman rank
correlation of predicted and measured time over the parallel configurations; and, as a search would
use the predictions, how often the predicted fastest configuration of a model, batch and GPU count
is the measured fastest (:func:`hit_rates`). ``python -m
simgpu.validate.iterations`` runs every row (or ``--sample N``) and prints both.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..config.hf import expand as expand_config
from ..config.loader import Job, load_platform
from ..config.workload import WorkloadSpec

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "iterations" / "vtrain-single-node"
CSV = "ground_truth_single.csv"
COLUMNS = ("gpus", "global_batch", "micro_batch", "hidden", "heads", "layers", "seq_len", "tp", "dp", "pp",
           "measured_ms")
#: The keys that name a model; a group for the rank correlation is a model and a global batch.
MODEL_KEYS = ("hidden", "heads", "layers", "seq_len")
GROUP_KEYS = (*MODEL_KEYS, "global_batch")
#: Host time per launched op (kernel, collective, synchronisation) of Megatron-DeepSpeed as these
#: iterations were measured, in us: Python module code, the autograd engine, activation
#: checkpointing's re-entry and the launch itself. The one calibrated figure, not chosen per case:
#: :func:`calibrate_host_overhead` on the host-bound rows of the 12-layer models gives 55.6.
HOST_OVERHEAD_US = 55.6
#: The host times per op the calibration simulates its rows at (it interpolates between them).
HOST_PROBES_US = (48.0, 64.0)
#: What the test enforces on the whole set and on its stratified sample.
MAX_GEOMEAN_ERROR = 0.15
MIN_SPEARMAN = 0.8
PLATFORM = "dgx_a100"
GPT2_VOCAB = 50257


def load_cases(folder: Path = DATA) -> pd.DataFrame:
    """The measured rows, with the columns of :data:`COLUMNS` (the file starts with a BOM)."""
    df = pd.read_csv(folder / CSV, encoding="utf-8-sig")
    if len(df.columns) != len(COLUMNS):
        raise ValueError(f"{folder / CSV}: expected {len(COLUMNS)} columns, got {len(df.columns)}")
    df.columns = list(COLUMNS)
    df.index.name = "case"
    return df


def _vocab(tp: int) -> int:
    """GPT-2's vocabulary as the measured code splits it: ``50257 // tp`` rows per rank, unpadded
    (so the output layer's GEMMs are 16-byte aligned only at tp=2)."""
    return GPT2_VOCAB // tp * tp


def workload(row: Any, host_overhead_us: float | None = HOST_OVERHEAD_US, layer_sync: bool = True) -> dict[str, Any]:
    """The workload (as a YAML-like dict) of one measured row."""
    return {
        "name": "vtrain", "platform": PLATFORM, "nodes": 1, "gpus_per_node": int(row.gpus),
        "model": {"kind": "transformer", "arch": "gpt", "layers": int(row.layers), "hidden": int(row.hidden),
                  "heads": int(row.heads), "seq_len": int(row.seq_len), "vocab": _vocab(int(row.tp)),
                  "attention": "unfused",
                  "dropout": 0.1},
        "training": {"micro_batch": int(row.micro_batch), "global_batch": int(row.global_batch),
                     "precision": "fp16", "optimizer": "adam", "recompute": "full", "framework": "megatron",
                     "sync_each_layer": layer_sync, "host_overhead_us": host_overhead_us},
        "parallelism": {"tp": int(row.tp), "pp": int(row.pp), "dp": int(row.dp), "pp_schedule": "1f1b",
                        "dp_overlap": False},
    }


def calibration_rows(cases: pd.DataFrame) -> pd.DataFrame:
    """The rows :func:`calibrate_host_overhead` uses: the 12-layer models (so the 16- to 24-layer ones
    stay unseen) with micro-batch 1, hidden 1024 and tp <= 4, where host time dominates."""
    return cases[(cases["layers"] == 12) & (cases["micro_batch"] == 1) & (cases["hidden"] == 1024)
                 & (cases["tp"] <= 4)]


def calibrate_host_overhead(cases: pd.DataFrame, layer_sync: bool = True, workers: int | None = None) -> float:
    """Host time per op in us at which the simulated :func:`calibration_rows` are, at the median,
    as long as measured. The rows are simulated at the two :data:`HOST_PROBES_US`; each row's time is
    taken as linear in the host time between them (they are host-bound), and the median ratio of
    predicted to measured time is brought to 1 by bisection. Rounded to 0.1 us."""
    rows = calibration_rows(cases)
    lo_us, hi_us = HOST_PROBES_US
    lo = predict(rows, host_overhead_us=lo_us, layer_sync=layer_sync, workers=workers)["predicted_ms"].to_numpy()
    hi = predict(rows, host_overhead_us=hi_us, layer_sync=layer_sync, workers=workers)["predicted_ms"].to_numpy()
    measured = rows["measured_ms"].to_numpy()
    slope = (hi - lo) / (hi_us - lo_us)

    def median_ratio(us: float) -> float:
        return float(np.median((lo + slope * (us - lo_us)) / measured))

    a, b = 1.0, 4 * hi_us
    for _ in range(60):
        mid = (a + b) / 2
        a, b = (mid, b) if median_ratio(mid) < 1 else (a, mid)
    return round((a + b) / 2, 1)


def _job(data: dict[str, Any], platform: str) -> Job:
    """The checked job of workload ``data`` on the named platform."""
    from ..config.checks import check_job

    plat, pfile = load_platform(platform)
    job = Job(WorkloadSpec.model_validate(expand_config(data, data.get("name", "validation"))), plat, "vtrain", pfile)
    check_job(job)
    return job


def _simulate(args: tuple[dict[str, Any], str]) -> float:
    from ..sim import simulate

    return simulate(_job(*args)).iteration_time_s * 1e3


_T = TypeVar("_T")


def _steady_check(args: tuple[dict[str, Any], str]) -> tuple[float, float, float, float]:
    """The second and third iterations' lengths, ms, of the job ``args`` names run with
    ``steady_state: check``, and how far the second's and the third's tails (from the optimizer step
    on) are from the one before, one window later, ms (the third's runs under no next iteration)."""
    from ..sim import simulate

    data, platform = args
    data = {**data, "training": {**data["training"], "steady_state": "check"}}
    meta = simulate(_job(data, platform)).meta
    ends = [float(x) for x in meta["iteration_ends_s"]]
    tails = [float(t["offset_s"]) * 1e3 for t in meta.get("steady_tails", ())] or [math.nan, math.nan]
    return (ends[1] - ends[0]) * 1e3, (ends[2] - ends[1]) * 1e3, tails[0], tails[1]


def simulate_all(fn: Callable[[Any], _T], jobs: Sequence[Any], workers: int | None = None) -> list[_T]:
    """``fn`` of every job, in order, on a process pool of ``workers`` (default: one per core)."""
    n = workers or min(len(jobs), os.cpu_count() or 1)
    if n <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(n) as pool:
        return list(pool.map(fn, jobs, chunksize=1))


def predict(cases: pd.DataFrame, *, host_overhead_us: float | None = HOST_OVERHEAD_US, platform: str = PLATFORM,
            layer_sync: bool = True, workers: int | None = None) -> pd.DataFrame:
    """``cases`` with ``predicted_ms`` and ``error`` (predicted / measured - 1), simulated in parallel."""
    jobs = [(workload(r, host_overhead_us, layer_sync), platform) for r in cases.itertuples()]
    times = simulate_all(_simulate, jobs, workers)
    out = cases.copy()
    out["predicted_ms"] = times
    out["error"] = out["predicted_ms"] / out["measured_ms"] - 1
    return out


def geomean_error(df: pd.DataFrame) -> float:
    """``exp(mean |ln(predicted / measured)|) - 1``."""
    return float(np.expm1(np.mean(np.abs(np.log(df["predicted_ms"] / df["measured_ms"])))))


def spearman(df: pd.DataFrame, min_size: int = 3) -> pd.DataFrame:
    """Per model and global batch with at least ``min_size`` configurations: ``n`` and ``rho``."""
    rows = []
    for key, g in df.groupby(list(GROUP_KEYS)):
        if len(g) < min_size:
            continue
        pred, meas = g["predicted_ms"].rank(), g["measured_ms"].rank()
        rho = float(np.corrcoef(pred, meas)[0, 1]) if pred.std() > 0 and meas.std() > 0 else float("nan")
        rows.append((*key, len(g), rho))
    return pd.DataFrame(rows, columns=[*GROUP_KEYS, "n", "rho"])


#: A choice among parallel configurations: one model, global batch and number of GPUs.
CHOICE_KEYS = (*GROUP_KEYS, "gpus")


def hit_rates(df: pd.DataFrame, tops: Sequence[int] = (1, 3), min_size: int = 2) -> dict[str, float]:
    """How often ranking a choice's configurations by predicted time finds the measured fastest.

    A choice is a model, global batch and GPU count with at least ``min_size`` measured
    configurations (tp, dp, pp, micro-batch); ``top{k}`` is the fraction of choices whose measured
    fastest configuration is among the ``k`` predicted fastest. ``regret`` is the geometric mean
    of measured time of the predicted fastest over the measured fastest, minus one (what picking by
    prediction costs).
    """
    hits = dict.fromkeys(tops, 0)
    n, regrets = 0, []
    for _, g in df.groupby(list(CHOICE_KEYS)):
        if len(g) < min_size:
            continue
        n += 1
        order = g.sort_values(["predicted_ms", "measured_ms"], kind="stable")
        best = g["measured_ms"].idxmin()
        for k in tops:
            hits[k] += int(best in order.index[:k])
        regrets.append(float(order["measured_ms"].iloc[0] / g["measured_ms"].min()))
    out = {f"top{k}": hits[k] / n if n else float("nan") for k in tops}
    out["choices"] = float(n)
    out["regret"] = float(np.expm1(np.mean(np.log(regrets)))) if regrets else float("nan")
    return out


def stratified_sample(cases: pd.DataFrame, per_stratum: int, seed: int = 0) -> pd.DataFrame:
    """Up to ``per_stratum`` rows of each (GPUs, tp, pp, micro-batch) stratum, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    picks = []
    for _, g in cases.groupby(["gpus", "tp", "pp", "micro_batch"]):
        picks += list(rng.choice(g.index.to_numpy(), size=min(per_stratum, len(g)), replace=False))
    return cases.loc[sorted(picks)]


def summary(df: pd.DataFrame) -> dict[str, float]:
    rho = spearman(df)["rho"].dropna()
    return {"cases": float(len(df)), "geomean_error": geomean_error(df),
            "median_abs_error": float(df["error"].abs().median()),
            "max_abs_error": float(df["error"].abs().max()), "groups": float(len(rho)),
            "spearman_min": float(rho.min()) if len(rho) else float("nan"),
            "spearman_median": float(rho.median()) if len(rho) else float("nan")}


#: NeMo 24.07's published models (public configs): layers, hidden, heads, kv heads, MLP width, vocab, arch.
NEMO_MODELS: dict[str, tuple[int, int, int, int, int, int, str]] = {
    "GPT3-5B": (24, 4096, 32, 32, 16384, 50304, "gpt"),
    "GPT3-20B": (44, 6144, 48, 48, 24576, 50304, "gpt"),
    "LLAMA2-7B": (32, 4096, 32, 32, 11008, 32000, "llama"),
    "LLAMA2-13B": (40, 5120, 40, 40, 13824, 32000, "llama"),
    "LLAMA2-70B": (80, 8192, 64, 8, 28672, 32000, "llama"),
    "Nemotron-8B": (32, 4096, 32, 32, 16384, 256000, "gpt"),
    "Nemotron-22B": (40, 6144, 48, 48, 24576, 256000, "gpt"),
    "LLAMA3-8B": (32, 4096, 32, 8, 14336, 128256, "llama"),
}
PUBLISHED = DATA.parent / "published-llm-throughput" / "table.csv"


def published_cases(path: Path = PUBLISHED, max_ops_rows: int = 300_000) -> pd.DataFrame:
    """NeMo 24.07 pre-training rows on DGX H100 whose model is in :data:`NEMO_MODELS` and whose
    iteration is small enough to simulate here (micro-batches x layers per stage below a bound)."""
    df = pd.read_csv(path)
    df = df[(df["source_id"] == "nemo24.07") & df["model"].isin(list(NEMO_MODELS))].copy()
    for c in ("tp", "pp", "cp", "vp"):
        df[c] = df[c].fillna(1).astype(int)
    df["dp"] = df["num_gpus"] // (df["tp"] * df["pp"] * df["cp"])
    m = df["gbs"] // (df["mbs"] * df["dp"])
    work = m * df["model"].map(lambda k: NEMO_MODELS[k][0]) // df["pp"] * df["num_gpus"]
    return df[work * 50 <= max_ops_rows * 64].reset_index(drop=True)


#: NeMo's overlaps, on in its pre-training recipes (NeMo 24.07: the distributed optimizer's
#: ``overlap_param_sync`` / Megatron-core ``overlap_param_gather`` and ``overlap_grad_sync``; userbuffers
#: ``tp_comm_overlap`` where tp > 1 with sequence parallelism).
NEMO_OVERLAPS = ("overlap_param_gather", "tp_comm_overlap")


def published_workload(row: Any, overlaps: Sequence[str] = NEMO_OVERLAPS) -> dict[str, Any]:
    """A NeMo row as Megatron-core runs it: FP8 (Transformer Engine), flash attention, the distributed
    optimizer, sequence parallelism with tp > 1, interleaved pipeline when vp > 1, and the
    ``overlaps`` named (of :data:`NEMO_OVERLAPS`; the steady iteration is then reported)."""
    unknown = set(overlaps) - set(NEMO_OVERLAPS)
    if unknown:
        raise ValueError(f"unknown overlaps {sorted(unknown)}; expected some of {', '.join(NEMO_OVERLAPS)}")
    layers, hidden, heads, kv, ffn, vocab, arch = NEMO_MODELS[row.model]
    nodes = int(row.num_gpus) // 8 or 1
    return {
        "name": str(row.model), "platform": "dgx_h100", "nodes": nodes, "gpus_per_node": min(8, int(row.num_gpus)),
        "model": {"kind": "transformer", "arch": arch, "layers": layers, "hidden": hidden, "heads": heads,
                  "kv_heads": kv, "ffn_hidden": ffn, "seq_len": int(row.seq_len), "vocab": vocab},
        "training": {"micro_batch": int(row.mbs), "global_batch": int(row.gbs), "precision": "fp8",
                     "optimizer": "adam", "framework": "megatron"},
        "parallelism": {"tp": int(row.tp), "pp": int(row.pp), "cp": int(row.cp), "sp": int(row.tp) > 1, "zero": 1,
                        "pp_schedule": "interleaved" if int(row.vp) > 1 else "1f1b",
                        "virtual_stages": int(row.vp), "overlap_param_gather": "overlap_param_gather" in overlaps,
                        "tp_comm_overlap": "tp_comm_overlap" in overlaps and int(row.tp) > 1},
    }


def predict_published(rows: pd.DataFrame, workers: int | None = None,
                      overlaps: Sequence[str] = NEMO_OVERLAPS) -> pd.DataFrame:
    """``rows`` with ``predicted_s`` and ``error`` against the published iteration time."""
    times = simulate_all(_simulate, [(published_workload(r, overlaps), "dgx_h100") for r in rows.itertuples()],
                         workers)
    out = rows[["model", "num_gpus", "gbs", "mbs", "seq_len", "tp", "pp", "cp", "vp", "dp",
                "derived_iteration_time_s"]].copy()
    out["predicted_s"] = np.asarray(times) / 1e3
    out["error"] = out["predicted_s"] / out["derived_iteration_time_s"] - 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.iterations", description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the vtrain-single-node folder")
    ap.add_argument("--sample", type=int, help="rows per (GPUs, tp, pp, micro-batch) stratum (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host-overhead-us", type=float, default=HOST_OVERHEAD_US)
    ap.add_argument("--no-layer-sync", action="store_true", help="without the host sync at each block")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--csv", type=Path, help="write the per-case table here")
    ap.add_argument("--published", action="store_true",
                    help="instead, compare with the NeMo DGX-H100 rows of published-llm-throughput (no threshold)")
    ap.add_argument("--overlaps", default=",".join(NEMO_OVERLAPS),
                    help=f"with --published: the NeMo overlaps on, comma-separated (default {','.join(NEMO_OVERLAPS)}; "
                         "'none' for none)")
    ap.add_argument("--steady-check", action="store_true",
                    help="with --published: run each row for three iterations (steady_state: check) and print the "
                         "second's and third's lengths, and how far each one's ops from its optimizer step on are from "
                         "the one before")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    if args.published:
        overlaps = [] if args.overlaps in ("", "none") else args.overlaps.split(",")
        if args.steady_check:
            rows = published_cases()
            got = simulate_all(_steady_check, [(published_workload(r, overlaps), "dgx_h100")
                                                 for r in rows.itertuples()], args.workers)
            table = rows[["model", "num_gpus", "tp", "pp", "cp", "vp"]].copy()
            table["second_ms"] = [g[0] for g in got]
            table["third_ms"] = [g[1] for g in got]
            table["third_vs_second"] = [f"{(g[1] - g[0]) / g[0]:+.1e}" for g in got]
            # from the optimizer step on: the second's tail (under the third's head) against the first's
            # (under the second's), and the third's (under nothing) against the second's
            table["tail_2_vs_1_ms"] = [f"{g[2]:.6f}" for g in got]
            table["tail_3_vs_2_ms"] = [f"{g[3]:.6f}" for g in got]
            print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
            worst = max(abs(g[1] - g[0]) / g[0] for g in got)
            print(f"largest |third - second| / second: {worst:.1e} over {len(got)} rows")
            return 0
        pub = predict_published(published_cases(), workers=args.workers, overlaps=overlaps)
        print(pub.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        scored = pub.rename(columns={"predicted_s": "predicted_ms", "derived_iteration_time_s": "measured_ms"})
        print(f"geomean |error| {geomean_error(scored):.1%} over {len(pub)} rows")
        return 0
    if not (args.data / CSV).is_file():
        print(f"error: {args.data / CSV} not found", file=sys.stderr)
        return 2
    cases = load_cases(args.data)
    if args.sample:
        cases = stratified_sample(cases, args.sample, args.seed)
    df = predict(cases, host_overhead_us=args.host_overhead_us, layer_sync=not args.no_layer_sync,
                 workers=args.workers)
    if args.csv:
        df.to_csv(args.csv)
    s = summary(df)
    groups = spearman(df)
    print(f"cases {len(df)}  geomean |error| {s['geomean_error']:.1%}  median {s['median_abs_error']:.1%}  "
          f"max {s['max_abs_error']:.1%}")
    print(f"Spearman over {len(groups)} model x batch groups: min {s['spearman_min']:.3f}  "
          f"median {s['spearman_median']:.3f}")
    h = hit_rates(df)
    print(f"choosing the parallel configuration of {h['choices']:.0f} model x batch x GPUs choices by prediction: "
          f"top-1 {h['top1']:.1%}  top-3 {h['top3']:.1%}  (geomean cost of the pick vs the measured best "
          f"{h['regret']:.1%})")
    by = df.assign(abs_err=df["error"].abs()).groupby(["tp", "pp"])["abs_err"].median()
    print("median |error| by (tp, pp):", ", ".join(f"{k}: {v:.1%}" for k, v in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Inference iterations against measurements in ``../shared/data/inference/``.

**Splitwise** (:mod:`simgpu.validate.splitwise`): the prefill and decode iterations of Llama-2-70B
and BLOOM-176B on DGX-A100 and DGX-H100, the serving stack's figures fitted leaving each (model, TP)
group out. **MLPerf Inference Llama-2-70B Offline** (:mod:`simgpu.validate.mlperf_inference`):
every published system's tokens/s from its steady-state iteration. Here: the batch-1 decode against
its memory floor, and a DLRM batch against its back-of-envelope.

``python -m simgpu.validate.inference`` prints the tables and the geomean errors (held out, and
in sample with ``--in-sample``; ``--fit`` refits both); the exit status
is 1 above the thresholds (Splitwise <= 12% on each of A100 and H100, MLPerf <= 20% and Spearman
>= 0.8). Errors are ``predicted / measured - 1``; the geomean is ``exp(mean |ln ratio|) - 1``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..kernels.importers import data_root
from ..serve.timer import EngineTimer
from ..workload.inference import Step
from .inference_jobs import LLAMA2_70B, geomean_error, make_job
from .mlperf_inference import (
    MLPERF,
    MLPERF_MAX,
    MLPERF_SPEARMAN,
    configurations,
    mlperf_breakdown,
    spearman,
    spearman_bound,
    validate_mlperf,
)
from .splitwise import (
    SCORED_HARDWARE,
    SPLITWISE,
    SPLITWISE_MAX,
    fit_folds,
    fit_stack,
    splitwise_summary,
    validate_splitwise,
)


def decode_floor(platform: str = "dgx_h100", tp: int = 4, precision: str = "bf16") -> dict[str, float]:
    """A batch-1 decode iteration against its memory floor: the weights a GPU holds read once at the
    GPU's achievable HBM bandwidth (``hbm_gbytes_per_s x memory_efficiency``)."""
    job = make_job(LLAMA2_70B, platform, tp, precision,
                   inference={"host_overhead_us": 0.0, "cuda_graphs": True})
    timer = EngineTimer(job)
    t = float(timer.time([Step(decode=(128,))])[0])
    g = job.platform.gpu
    floor = timer.memory.weights_bytes / (g.hbm_gbytes_per_s * 1e9 * g.memory_efficiency)
    return {"iteration_ms": t * 1e3, "floor_ms": floor * 1e3, "ratio": t / floor}


DLRM_WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml"


def dlrm_envelope(path: Path = DLRM_WORKLOAD) -> dict[str, float]:
    """A batch of a ``dlrm_inference`` workload against a back-of-envelope per GPU: its share of the
    pooled rows (every id's row read once, fp32, at ``hbm_gbytes_per_s x memory_efficiency``) and
    of the forward's FLOPs (at the dense peak of the precision x ``matmul_efficiency``); the
    simulated batch beside them, and the samples/s each gives."""
    from ..config.checks import world_size
    from ..config.loader import load_job
    from ..sim import simulate
    from ..workload.dlrm.embedding import EMB_BYTES, expand_tables

    job = load_job(path)
    w, g = job.workload, job.platform.gpu
    model, inf = w.model, w.serve
    assert inf.batch_per_gpu is not None
    gpus = world_size(job)
    batch = inf.batch_per_gpu * gpus
    tables = expand_tables(model, np.random.default_rng(w.seed))  # type: ignore[arg-type]
    row_bytes = sum(t.ids(batch) * t.dim * EMB_BYTES for t in tables) / gpus
    r = simulate(job)
    flops = float(r.meta["model_flops"]) / gpus
    lookups = row_bytes / (g.hbm_gbytes_per_s * 1e9 * g.memory_efficiency)
    dense = flops / (cast(Any, g.peak_tflops)[inf.precision] * 1e12 * g.matmul_efficiency)
    t = float(r.iteration_time_s)
    return {"samples": batch, "gpus": gpus, "lookup_mb_per_gpu": row_bytes / 1e6, "gflop_per_gpu": flops / 1e9,
            "lookups_ms": lookups * 1e3, "dense_ms": dense * 1e3, "batch_ms": t * 1e3,
            "envelope_samples_per_s": batch / (lookups + dense), "samples_per_s": batch / t}


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.inference",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=None,
                    help="the shared data folder (default $SIMGPU_DATA or ../shared/data)")
    ap.add_argument("--csv", help="write the Splitwise table here")
    ap.add_argument("--untuned", action="store_true", help="Splitwise with the defaults, not the stack's figures")
    ap.add_argument("--in-sample", action="store_true", help="Splitwise with the figures fitted to every group "
                    "(SPLITWISE_STACK), not each group's held-out ones")
    ap.add_argument("--breakdown", action="store_true", help="print each MLPerf configuration's iteration "
                    "by kernel (ms on one GPU) and stop")
    ap.add_argument("--fit", nargs="+", choices=SCORED_HARDWARE, help="fit these machines' stack figures from "
                    "FIT_START, to all groups and leaving each group out, and print them")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    data = args.data or data_root()
    if not (data / SPLITWISE).is_file():
        print(f"error: no measurements at {data / SPLITWISE}", file=sys.stderr)
        return 2
    if args.breakdown:
        b = mlperf_breakdown(data)
        with pd.option_context("display.width", 200, "display.max_rows", 200):
            print(b.to_string(index=False, float_format="{:.3f}".format))
        return 0
    if args.fit:
        for hw in args.fit:
            fig, e = fit_stack(data, hw)
            print(f"{hw}: all groups {fig}  in-sample geomean |error| {e:.1%}", flush=True)
            for g, (f, e) in fit_folds(data, hw).items():
                print(f"{hw}: without {g} {f}  in-sample geomean |error| {e:.1%}", flush=True)
        return 0
    t = validate_splitwise(data, stack={} if args.untuned else None, held_out=not args.in_sample)
    status = 0
    with pd.option_context("display.width", 200, "display.max_rows", 2000):
        print(t.assign(error=t["error"].map("{:+.1%}".format)).to_string(index=False, float_format="{:.1f}".format))
        s = splitwise_summary(t)
        print(s.to_string(index=False, float_format="{:.1%}".format))
    inside = None if args.untuned or args.in_sample else validate_splitwise(data, held_out=False)
    for hw in SCORED_HARDWARE:
        e = geomean_error(*t[t["scored"] & (t["hardware"] == hw)][["predicted_ms", "measured_ms"]].T.to_numpy())
        how = "defaults" if args.untuned else "in sample" if args.in_sample else "held out"
        also = "" if inside is None else (" (in sample {:.1%})".format(geomean_error(
            *inside[inside["scored"] & (inside["hardware"] == hw)][["predicted_ms", "measured_ms"]].T.to_numpy())))
        print(f"splitwise {hw}: geomean |error| {e:.1%} {how}{also} (threshold {SPLITWISE_MAX:.0%})")
        status |= int(e > SPLITWISE_MAX)
    if args.csv:
        t.to_csv(args.csv, index=False)
    if (data / MLPERF).is_file():
        m, skipped = validate_mlperf(data)
        with pd.option_context("display.width", 250):
            print(m.assign(error=m["error"].map("{:+.1%}".format)).to_string(index=False, float_format="{:.0f}".format))
        for s_ in skipped:
            print("skipped", s_)
        c = configurations(m)
        print(c.to_string(index=False, float_format="{:.0f}".format))
        e, rho = geomean_error(m.predicted, m.measured), spearman(c.per_gpu_predicted, c.per_gpu_measured)
        rho_sys = spearman(m.per_gpu_predicted, m.per_gpu_measured)
        print(f"mlperf offline: {len(m)} systems, geomean |error| {e:.1%} (threshold {MLPERF_MAX:.0%}); Spearman of "
              f"tokens/s per GPU over {len(c)} configurations {rho:.2f} (threshold {MLPERF_SPEARMAN}), over the "
              f"systems {rho_sys:.2f}, of at most {spearman_bound(m):.2f} for any model that predicts the systems "
              "of one configuration alike")
        status |= int(e > MLPERF_MAX or rho < MLPERF_SPEARMAN)
    f = decode_floor()
    print(f"batch-1 decode, Llama-2-70B TP4 H100 bf16: {f['iteration_ms']:.2f} ms, weights / HBM "
          f"{f['floor_ms']:.2f} ms "
          f"(x{f['ratio']:.2f})")
    d = dlrm_envelope()
    print(f"DLRM-DCNv2 inference, {d['samples']:,.0f} samples on {d['gpus']:.0f} A100s: batch {d['batch_ms']:.3f} ms "
          f"({d['samples_per_s'] / 1e6:.1f} M samples/s); per GPU {d['lookup_mb_per_gpu']:.0f} MB of rows / HBM "
          f"{d['lookups_ms']:.3f} ms + {d['gflop_per_gpu']:.1f} GFLOP / GEMM peak {d['dense_ms']:.3f} ms = "
          f"{d['envelope_samples_per_s'] / 1e6:.1f} M samples/s")
    return status


if __name__ == "__main__":
    sys.exit(main())

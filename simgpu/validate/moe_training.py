"""MoE pre-training iterations against Megatron-Bridge's published DGX-H100 figures.

``../shared/data/iterations/published-llm-throughput/table.csv`` holds Megatron-Bridge's performance
summary rows (read its provenance.md) of Qwen3-30B-A3B, Qwen3-235B-A22B, GPT-OSS-120B and
DeepSeek-V3 on DGX H100: GPUs, precision, global and micro batch, sequence, tp / pp / vp / ep, and
the tokens per second per GPU they measured, from which the iteration time is derived. Each row
becomes a workload of the model read from its ``config.json`` (the ones shipped in
``workloads/models``) as Megatron-core runs it: the distributed optimizer (ZeRO-1) with its gradient
and parameter overlaps, sequence parallelism where tp > 1, the interleaved schedule where vp > 1,
experts spread over ``ep`` of the data-parallel ranks, routing balanced (the rows' "force-balanced"),
the embedding and the loss counted as blocks in the pipeline split where the blocks alone do not
divide (Qwen3-235B-A22B: 94 + 2 over PP8 x VP4),
FP8 (Transformer Engine's; the FP8-CS rows' current scaling is the same kernels) or BF16.

``python -m simgpu.validate.moe_training`` prints each row's predicted and published iteration
time and the error; the token-drop rows (another dispatcher) and rows too large to simulate here
(:data:`MAX_GPUS`) are listed as skipped, with the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, run_command
from .iterations import PUBLISHED, simulate_all

MODELS = Path(__file__).resolve().parents[2] / "workloads" / "models"
#: Megatron-Bridge's model names -> the shipped config.json.
CONFIGS = {"Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b", "GPT-OSS-120B": "gpt-oss-120b",
           "DeepSeekV3-dropless": "deepseek-r1"}
#: Rows above this many GPUs are not simulated here (a 2-core machine's minutes).
MAX_GPUS = 256
#: The error a row may have.
MAX_ERROR = 0.10


def cases(path: Path = PUBLISHED) -> pd.DataFrame:
    """The Megatron-Bridge DGX-H100 rows of the MoE models, with ``skip`` saying why a row is not run."""
    df = pd.read_csv(path)
    df = df[df["source_id"].str.startswith("mbridge") & (df["model"].isin(list(CONFIGS))
                                                         | df["model"].str.endswith("-tokendrop"))].copy()
    for c in ("tp", "pp", "cp", "vp", "ep"):
        df[c] = df[c].fillna(1).astype(int)
    df["skip"] = ""
    df.loc[~df["model"].isin(list(CONFIGS)), "skip"] = "token-drop dispatcher, not modelled"
    big = (df["skip"] == "") & (df["num_gpus"] > MAX_GPUS)
    df.loc[big, "skip"] = f"over {MAX_GPUS} GPUs: too long to simulate here"
    dp = df["num_gpus"] // (df["tp"] * df["pp"] * df["cp"])
    folded = (df["skip"] == "") & (dp % df["ep"] != 0)
    df.loc[folded, "skip"] = ("ep beyond the data-parallel ranks (Megatron's MoE parallel folding over tp x dp): "
                              "not modelled")
    layers = df["model"].map(lambda m: _layers(m) if m in CONFIGS else 0)
    uneven = (df["skip"] == "") & ((layers + 2) % (df["pp"] * df["vp"]) != 0) & (layers % (df["pp"] * df["vp"]) != 0)
    df.loc[uneven, "skip"] = "layers do not split over pp x vp, with or without the embedding and loss counted"
    return df.reset_index(drop=True)


def _layers(model: str) -> int:
    import json

    return int(json.loads((MODELS / CONFIGS[model] / "config.json").read_text())["num_hidden_layers"])


def workload(row: Any) -> dict[str, Any]:
    """One row as Megatron-core runs it (see the module docstring)."""
    nodes = int(row.num_gpus) // 8 or 1
    tp, vp = int(row.tp), int(row.vp)
    return {
        "name": str(row.model), "platform": "dgx_h100", "nodes": nodes, "gpus_per_node": min(8, int(row.num_gpus)),
        "model": {"config": str(MODELS / CONFIGS[str(row.model)] / "config.json"), "seq_len": int(row.seq_len)},
        "training": {"micro_batch": int(row.mbs), "global_batch": int(row.gbs),
                     "precision": "bf16" if str(row.precision).upper() == "BF16" else "fp8",
                     "optimizer": "adam", "framework": "megatron"},
        "parallelism": {"tp": tp, "pp": int(row.pp), "cp": int(row.cp), "ep": int(row.ep), "sp": tp > 1, "zero": 1,
                        "pp_schedule": "interleaved" if vp > 1 else "1f1b", "virtual_stages": vp,
                        # Qwen3-235B's 94 blocks over PP8 x VP4: Megatron-Bridge counts the embedding and
                        # the loss as a block each (96 = 32 chunks of 3)
                        "account_for_embedding_and_loss": _layers(str(row.model)) % (int(row.pp) * vp) != 0,
                        "overlap_param_gather": True},
    }


#: The GPU memory the rows are simulated with (GiB). Each row ran, so it fit; simgpu's activation
#: estimate of a fine-grained MoE block (every token's top-k expert activations kept) is above what
#: Megatron keeps (its permutation and activation recomputation are not modelled), so memory is not
#: what these rows check, and the estimate is not allowed to refuse them.
UNCHECKED_MEMORY_GIB = 10_000


def _simulate(data: dict[str, Any]) -> float:
    from ..config.checks import check_job
    from ..config.hf import expand
    from ..config.loader import Job, load_platform
    from ..config.workload import WorkloadSpec
    from ..sim import simulate

    plat, pfile = load_platform("dgx_h100", [("gpu.memory_gib", UNCHECKED_MEMORY_GIB)])
    job = Job(WorkloadSpec.model_validate(expand(data, str(data["name"]))), plat, str(data["name"]), pfile)
    check_job(job)
    return float(simulate(job).iteration_time_s) * 1e3


def predict(rows: pd.DataFrame, workers: int | None = None) -> pd.DataFrame:
    """``rows`` (those not skipped) with ``predicted_s`` and ``error`` against the published time."""
    run = rows[rows["skip"] == ""]
    times = simulate_all(_simulate, [workload(r) for r in run.itertuples()], workers)
    out = run[["source_id", "model", "num_gpus", "precision", "gbs", "mbs", "tp", "pp", "vp", "ep",
               "derived_iteration_time_s"]].copy()
    out["predicted_s"] = np.asarray(times) / 1e3
    out["error"] = out["predicted_s"] / out["derived_iteration_time_s"] - 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.moe_training",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--model", action="append", help="only these models")
    args = ap.parse_args(argv)
    if not PUBLISHED.is_file():
        print(f"error: no published rows at {PUBLISHED}", file=sys.stderr)
        return 2
    rows = cases()
    if args.model:
        rows = rows[rows["model"].isin(args.model)]
    got = predict(rows, workers=args.workers)
    with pd.option_context("display.width", 200):
        print(got.assign(error=got["error"].map("{:+.1%}".format)).to_string(index=False))
        skipped = rows[rows["skip"] != ""]
        if len(skipped):
            print("\nskipped:")
            print(skipped[["source_id", "model", "num_gpus", "skip"]].to_string(index=False))
    worst = float(got["error"].abs().max()) if len(got) else 0.0
    print(f"\nworst |error| {worst:.1%} (threshold {MAX_ERROR:.0%})")
    return 0 if worst <= MAX_ERROR else 1


if __name__ == "__main__":
    sys.exit(main())

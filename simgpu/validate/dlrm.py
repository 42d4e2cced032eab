"""DLRM training iterations against real PyTorch runs in ``../shared/data/iterations/dlrm-pytorch/``.

Two tables (read their provenance.md): NVIDIA DeepLearningExamples' PyTorch DLRM README results
(DGX A100 40 GB and 80 GB, DGX-1 and DGX-2 with V100 32 GB; 1, 8 and 16 GPUs; FP32 or TF32 and AMP;
six versions of the code, 2020-04 to 2022-01) and the MLPerf Training v0.7 PyTorch DLRM logs on
8x A100 40 GB. Every row becomes a workload of the Criteo 1TB DLRM (26 one-hot tables of dim 128,
bottom MLP 13-512-256-128, dot interaction, top MLP 1024-1024-512-256-1, SGD) trained as NVIDIA's
code trains it (``training.framework: nvidia_dlrm``, :mod:`simgpu.workload.dlrm.nvidia`):

- **Tables.** ``small``: the 26 cardinalities of frequency threshold 15 (DeepLearningExamples'
  ``tests/feature_specs/criteo_f15.yaml``, 32,709,138 rows). ``large`` (threshold 3, ~82 GB) and
  ``xlarge`` (threshold 2, ~142 GB): the README gives their total size only, so the tables with more
  than :data:`GROWS` rows at threshold 15 are scaled by one factor until the fp32 tables take the
  stated size (a lower threshold keeps rarer ids, which only the large vocabularies have many of);
  this is an assumption, and it matters only through the tables' placement and the bytes their
  distinct rows take. MLPerf v0.7: its own 26 cardinalities, capped at 40M rows.
- **Ids** uniform over each table's rows (no distribution was published with the rows).
- **Platforms.** DGX A100 80 GB: ``dgx_a100``; 40 GB: ``dgx_a100`` with the 40 GB part's memory and
  bandwidth (A100 40 GB datasheet: 1,555 GB/s); DGX-1: ``dgx1_v100``; DGX-2: ``dgx2_v100``. A row on
  8 of a DGX-2's 16 GPUs runs on 8 GPUs of ``dgx2_v100``.
- **Precision.** FP32 on V100; TF32 (PyTorch's default then) on A100; AMP: fp16 matmuls.
- **Execution.** The 2022 version runs with CUDA graphs (``--cuda_graphs`` in its commands); the
  others launch every op from Python. Each step, the host reads the next batch at
  :data:`INPUT_MBYTES_PER_S` per process (``training.input_mbytes_per_s``): the one figure fitted on
  these rows (``--fit-input-rate``: the rate of a 250 MB/s grid with the smallest geometric-mean
  error over all rows), since nothing published measures the code's input reading. Under AMP the
  loss scaler's inf check waits for the backward before the weight update, so the reading of the
  next batch no longer hides behind the GPU (:mod:`simgpu.workload.dlrm.nvidia`).

``python -m simgpu.validate.dlrm`` prints every row (measured, predicted, error) and the summary:
the geometric-mean absolute error ``exp(mean |ln(predicted / measured)|) - 1`` and the largest;
the thresholds the suite is held to are :data:`MAX_GEOMEAN` and :data:`MAX_ERROR`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..config.checks import check_job
from ..config.loader import Job, load_platform, validate
from ..config.workload import WorkloadSpec
from ..sim import simulate

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "iterations" / "dlrm-pytorch"
README = "dle_pytorch_dlrm_readme.csv"
MLPERF = "mlperf_v07_dlrm_pytorch_runs.csv"
#: Criteo 1TB at frequency threshold 15: DeepLearningExamples ``tests/feature_specs/criteo_f15.yaml``
#: (cat_0 .. cat_25), the ``small`` model of the README.
CRITEO_F15 = (7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209, 10667,
              104, 4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35)
#: MLPerf v0.7 DLRM: Criteo 1TB with ids hashed into at most 40M rows (``mlperf_40m.limit.json``).
CRITEO_40M = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938,
              155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
#: Total fp32 table bytes the README states for the larger models.
MODEL_BYTES = {"large": 82e9, "xlarge": 142e9}
#: Tables with more rows than this at threshold 15 grow at a lower threshold.
GROWS = 100_000
DIM = 128
#: MB/s at which one process reads and stages its input batch (see the module docstring).
INPUT_MBYTES_PER_S = 1750.0
#: Thresholds the tests hold the suite to.
MAX_GEOMEAN = 0.05
MAX_ERROR = 0.12
#: System name in the tables -> (platform, overrides).
PLATFORMS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "DGX A100 (8x A100 80GB)": ("dgx_a100", ()),
    "DGX A100 (8x A100 40GB)": ("dgx_a100", (("gpu.name", "A100-SXM4-40GB"), ("gpu.memory_gib", 40),
                                             ("gpu.hbm_gbytes_per_s", 1555))),
    "DGX-1 (8x V100 32GB)": ("dgx1_v100", ()),
    "DGX-2 (16x V100 32GB)": ("dgx2_v100", ()),
}


def tables_of(variant: str) -> tuple[int, ...]:
    """Rows of the 26 tables of a model variant (see the module docstring for large and xlarge)."""
    if variant == "small":
        return CRITEO_F15
    if variant == "mlperf_40m.limit":
        return CRITEO_40M
    target = MODEL_BYTES[variant] / (DIM * 4)
    fixed = sum(r for r in CRITEO_F15 if r <= GROWS)
    scale = (target - fixed) / sum(r for r in CRITEO_F15 if r > GROWS)
    return tuple(round(r * scale) if r > GROWS else r for r in CRITEO_F15)


@dataclass(frozen=True)
class Row:
    """One measured configuration."""

    row_id: str
    system: str
    date: str
    gpus: int
    precision: str
    global_batch: int
    variant: str
    measured_ms: float
    cuda_graphs: bool

    @property
    def dtype(self) -> str:
        if self.precision.upper().startswith(("AMP", "FP16")):
            return "fp16"
        return "tf32" if "A100" in self.system else "fp32"


def rows(root: Path = DATA) -> list[Row]:
    """Every row of both tables, in file order."""
    out = []
    for r in pd.read_csv(root / README).itertuples():
        out.append(Row(str(r.row_id), str(r.system), str(r.source_commit_date), int(r.gpu_count), str(r.precision),
                       int(r.global_batch), str(r.model_variant), float(r.iteration_time_ms),
                       str(r.source_commit_date).startswith("2022")))
    for r in pd.read_csv(root / MLPERF).itertuples():
        out.append(Row(str(r.row_id), "DGX A100 (8x A100 40GB)", "2020-07 (MLPerf v0.7)", int(r.gpu_count),
                       "FP16", int(r.global_batch), str(r.model_variant), float(r.iteration_time_ms), False))
    return out


def job(row: Row, input_mbytes_per_s: float | None = INPUT_MBYTES_PER_S) -> Job:
    """The row as a workload on its platform, validated and checked like a workload file."""
    platform, overrides = PLATFORMS[row.system]
    data: dict[str, Any] = {
        "name": f"dlrm_{row.row_id}", "platform": platform, "nodes": 1, "gpus_per_node": row.gpus, "seed": 0,
        "model": {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [512, 256, DIM],
                  "top_mlp": [1024, 1024, 512, 256, 1], "embedding_dim": DIM, "interaction": "dot",
                  "tables": [{"rows": r, "pooling_factor": 1} for r in tables_of(row.variant)]},
        "training": {"batch_per_gpu": row.global_batch // row.gpus, "precision": row.dtype, "optimizer": "sgd",
                     "embedding_optimizer": "sgd", "framework": "nvidia_dlrm", "cuda_graphs": row.cuda_graphs,
                     "input_mbytes_per_s": input_mbytes_per_s},
    }
    source = f"dlrm-pytorch:{row.row_id}"
    spec = validate(WorkloadSpec, data, source)
    p, pfile = load_platform(platform, overrides)
    j = Job(spec, p, source, pfile)
    check_job(j)
    return j


def validate_all(root: Path = DATA, input_mbytes_per_s: float | None = INPUT_MBYTES_PER_S) -> pd.DataFrame:
    """One line per row: the configuration, measured and predicted milliseconds and the error.
    Rows of one configuration simulate once."""
    seen: dict[tuple[Any, ...], float] = {}
    out = []
    for r in rows(root):
        key = (r.system, r.gpus, r.dtype, r.global_batch, r.variant, r.cuda_graphs)
        if key not in seen:
            seen[key] = simulate(job(r, input_mbytes_per_s)).iteration_time_s * 1e3
        out.append({"row": r.row_id, "date": r.date, "system": r.system, "gpus": r.gpus, "precision": r.dtype,
                    "batch": r.global_batch, "model": r.variant, "graphs": r.cuda_graphs,
                    "measured_ms": r.measured_ms, "predicted_ms": seen[key],
                    "error": seen[key] / r.measured_ms - 1})
    return pd.DataFrame(out)


def geomean_error(table: pd.DataFrame) -> float:
    """``exp(mean |ln(predicted / measured)|) - 1`` over the rows of ``table``."""
    return float(np.exp(np.mean(np.abs(np.log(table["predicted_ms"] / table["measured_ms"]))))) - 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.dlrm", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--csv", help="write the table here")
    ap.add_argument("--input-rate", type=float, default=INPUT_MBYTES_PER_S,
                    help="MB/s at which a process reads its input (0: input reading not modelled)")
    ap.add_argument("--fit-input-rate", action="store_true",
                    help="print the geometric-mean error of input rates from 500 to 4,000 MB/s and stop")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    if not args.data.is_dir():
        print(f"error: no measurements at {args.data}", file=sys.stderr)
        return 2
    if args.fit_input_rate:
        scores = {rate: geomean_error(validate_all(args.data, rate)) for rate in np.arange(500.0, 4001.0, 250.0)}
        for rate, geo in scores.items():
            print(f"{rate:7.0f} MB/s  geomean |error| {geo:.2%}")
        print(f"best: {min(scores, key=lambda r: scores[r]):.0f} MB/s")
        return 0
    t0 = time.perf_counter()
    table = validate_all(args.data, args.input_rate or None)
    with pd.option_context("display.width", 250, "display.max_rows", 500):
        print(table.assign(error=table["error"].map("{:+.1%}".format)).to_string(
            index=False, float_format="{:.2f}".format))
    for name, g in [("all", table), *table.groupby(["system", "precision"])]:
        label = name if isinstance(name, str) else " ".join(map(str, name))
        worst_row = g["error"].abs().max()
        print(f"{label:36} rows {len(g):3d}  geomean |error| {geomean_error(g):6.1%}  max {worst_row:6.1%}")
    worst = float(table["error"].abs().max())
    geo = geomean_error(table)
    print(f"\n{len(table)} rows in {time.perf_counter() - t0:.1f} s: geomean |error| {geo:.1%} (threshold "
          f"{MAX_GEOMEAN:.0%}), max {worst:.1%} (threshold {MAX_ERROR:.0%})")
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0 if geo <= MAX_GEOMEAN and worst <= MAX_ERROR else 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m simgpu.serve.mlperf``: MLPerf Llama-2-70B Server-scenario latencies, measured beside
simulated.

For each Server row of ``../shared/data/inference/mlperf-llama2-70b/mlperf_llama2_70b.csv`` whose
configuration is published, the shipped serving file of its machine (:data:`SERVING`) is simulated
at the row's scheduled queries/s with the row's mean output length (completed tokens/s over
samples/s), and TTFT / TPOT P99 are printed beside the measured ones: NVIDIA's DGX-H100 of v4.1
(four TP2 engines, fp8), the v5.1 systems of 8 x B200 and of 4 x GB200 (TP1 engines, fp4, 2,048
requests an engine, 3,584 tokens an iteration). ``--all`` adds the other 8 x H100-SXM systems of
the same rounds, whose TP is not published (assumed NVIDIA's, which partners reuse).
Simulated throughput is the output tokens completed in the second half of the arrivals (past the
ramp-up, before the drain), as LoadGen counts completed tokens over its run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, entry, int_at_least, run_command
from ..errors import ConfigError

_FILES = Path(__file__).resolve().parents[2] / "workloads" / "serving"
#: (accelerator, GPUs) -> the serving file of that machine as the submissions configured it
SERVING: dict[tuple[str, int], Path] = {
    ("NVIDIA H100-SXM-80GB", 8): _FILES / "mlperf_llama2_70b_server_dgx_h100.yaml",
    ("NVIDIA B200-SXM-180GB", 8): _FILES / "mlperf_llama2_70b_server_dgx_b200.yaml",
    ("NVIDIA GB200", 4): _FILES / "mlperf_llama2_70b_server_gb200.yaml",
}
CSV = "inference/mlperf-llama2-70b/mlperf_llama2_70b.csv"


def server_rows(data: Path, every: bool = False) -> pd.DataFrame:
    """The Server rows of the machines of :data:`SERVING` whose TP is published (one per system and
    round: the 99% accuracy target); ``every``: the 8 x H100-SXM systems whose TP is not, too."""
    path = data / CSV
    if not path.is_file():
        raise ConfigError("MLPerf Llama-2-70B results not found; expected the shared data folder "
                          "(../shared/data beside the checkout, or SIMGPU_DATA)", file=str(path))
    df = pd.read_csv(path)
    df = df[(df["scenario"] == "Server") & (df["benchmark"] == "llama2-70b-99")]
    known = df.apply(lambda r: (str(r["accelerator"]), int(r["total_accelerators"])) in SERVING, axis=1)
    h100 = (df["total_accelerators"] == 8) & df["accelerator"].str.contains("H100-SXM")
    df = df[known & (df["tp"].notna() | (h100 & every))]
    return df.drop_duplicates(["round", "submitter", "system"]).reset_index(drop=True)


#: Seconds of arrivals each row is simulated for, where no request count is given: long against a
#: request's latency (seconds), so that the second half of the arrivals sees the server's steady state
#: (6,000 requests at the DGX-H100's 75 queries/s, 29,120 at the B200s' 364)
ARRIVAL_S = 80.0


def compare(rows: pd.DataFrame, count: int | None = None, progress: Any = None) -> pd.DataFrame:
    """Simulate each row's load (``count`` requests, else :data:`ARRIVAL_S` of its arrivals); a table
    of measured and simulated P99s and tokens/s."""
    from .deploy import build, serve
    from .metrics import request_table
    from .spec import load_serving

    out = []
    deployments: dict[Path, Any] = {}  # by serving file: built once, its iteration shapes timed once
    for r in rows.itertuples():
        mean_out = float(r.tokens_per_s) / float(r.samples_per_s)
        file = SERVING[(str(r.accelerator), int(r.total_accelerators))]
        n = count if count is not None else round(float(r.target_qps) * ARRIVAL_S)
        serving = load_serving(file, [f"requests.rate_per_s={r.target_qps}", f"requests.count={n}",
                                      f"requests.output_tokens.mean={mean_out:.1f}"])
        if file not in deployments:
            deployments[file] = build(serving)
        res, s = serve(serving, deployments[file], progress=progress)
        t = request_table(res)
        span = float(res.requests.arrival_s[-1])  # tokens completed in the second half of the arrivals
        done = t[(t.finish_ms / 1e3 > span / 2) & (t.finish_ms / 1e3 <= span)]
        out.append({"round": r.round, "submitter": r.submitter, "system": r.system, "qps": r.target_qps,
                    "ttft_p99_ms": r.ttft_p99_ms, "sim_ttft_p99_ms": s["ttft_ms"]["p99"],
                    "tpot_p99_ms": r.tpot_p99_ms, "sim_tpot_p99_ms": s["tpot_ms"]["p99"],
                    "tokens_per_s": r.tokens_per_s,
                    "sim_tokens_per_s": float(done.output_tokens.sum()) / (span / 2) if span > 0 else np.nan,
                    "sim_meets_slo": s["goodput"]["p99_meets_slo"]})
    return pd.DataFrame(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    from ..kernels.importers import data_root

    ap = ArgParser(prog="simgpu serve.mlperf", description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int_at_least(100), default=None,
                    help=f"requests per simulated run (default: {ARRIVAL_S:.0f} s of the row's arrivals)")
    ap.add_argument("--all", action="store_true", help="also the 8 x H100-SXM systems whose TP is not published")
    args = ap.parse_args(argv)
    table = compare(server_rows(data_root(), args.all), args.count)
    print(table.to_string(index=False, float_format=lambda x: f"{x:,.1f}"))
    return 0


if __name__ == "__main__":
    entry(main)

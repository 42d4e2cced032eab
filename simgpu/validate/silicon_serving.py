"""TTFT and TPOT of the measured serving sample's aggregated rows, predicted under their closed-loop load.

Each aggregated row of ``../shared/data/inference/aiconfigurator-silicon/silicon_sample.csv`` that
:mod:`simgpu.validate.silicon` can express becomes a serving run:

- engines of the row's parallelism (its inference workload from
  :func:`simgpu.validate.silicon.workload`): one, or as many as the clients fill at ``batch_size``
  each (:func:`replicas`; the sample gives no worker count for aggregated rows);
- each engine's ``batch_size`` (per attention-DP rank) as the scheduler's largest batch, and the
  framework's own batching (``scheduler.kind: framework``, the budget from :func:`token_budget`):
  TensorRT-LLM and vLLM mix prompt chunks and decodes in one batch of 8,192 tokens (their default
  ``max_num_tokens`` / ``max_num_batched_tokens``);
  SGLang runs prefill batches apart from decode ones and first (``prefill_first``), of its default
  ``chunked_prefill_size`` (16,384 tokens on GPUs of 160 GB or more, 8,192 below);
- the benchmark's load: a closed loop of ``concurrency`` clients with the row's fixed ISL and OSL,
  :data:`ROUNDS` requests a client, the first wave left out as warm-up.

TTFT is the mean time from sending to the first token; TPOT the mean of ``(E2E - TTFT) / (OSL -
1)``, the definition of vLLM's ``benchmark_serving.py``. The disaggregated rows are not scored here
yet.

``python -m simgpu.validate.silicon_serving [--model SUBSTRING] [--limit N] [--per-model N [--seed S]]
[--csv PATH] [--figure PNG]`` prints the geometric-mean |error|, the median signed error and the
MAPE of TTFT and TPOT per model, system, framework and concurrency band, and the rows it could not
score counted by reason; ``--figure`` draws predicted against measured; ``--rows CSV`` scores the
aggregated rows of another CSV in the sample's columns (:data:`COLUMNS`; a file missing one is
refused in one line naming it).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ..cli import ArgParser, check_out_file, run_command
from ..errors import ConfigError, SimgpuError
from .silicon import pools, sample_folder, sample_int, workload

#: Requests each client sends (the first wave of them is the warm-up).
ROUNDS = 4
#: Chunked-prefill token budget of the three frameworks' defaults.
TOKEN_BUDGET = 8192
#: SGLang's default ``chunked_prefill_size`` on GPUs of 160 GB or more (B200, GB200).
SGLANG_LARGE_BUDGET = 16384
#: The sample's systems whose GPUs hold 160 GB or more.
LARGE_GPU_SYSTEMS = ("b200_sxm", "gb200")


def token_budget(row: pd.Series) -> int:
    """The token budget of the row's framework as deployed with its defaults (its batching is
    ``scheduler.kind: framework``: the workload's ``inference.framework``'s own)."""
    large = row["backend"] == "sglang" and row["system"] in LARGE_GPU_SYSTEMS
    return SGLANG_LARGE_BUDGET if large else TOKEN_BUDGET


def concurrency_of(row: pd.Series) -> int:
    """The row's clients (``batch_size`` where the sample leaves concurrency empty)."""
    return sample_int(row.get("concurrency"), sample_int(row.get("batch_size")))


def batch_of(row: pd.Series) -> int:
    """The engine's largest batch per attention-DP rank (the clients where the sample gives none)."""
    return sample_int(row.get("batch_size"), concurrency_of(row))


def replicas(row: pd.Series, attention_dp: int = 1) -> int:
    """Engines serving the row's clients: one, unless the clients outnumber the engine's batch
    (``batch_size x attention_dp``), in which case as many engines as it takes to hold them (the
    sample gives no worker count for aggregated rows; its concurrency over the batch is one)."""
    return max(1, round(concurrency_of(row) / (batch_of(row) * attention_dp)))


def serving_data(row: pd.Series, workload_file: Path, attention_dp: int = 1) -> dict[str, Any]:
    """The serving file of an aggregated row (as a YAML mapping): ``batch_size`` is each attention
    data-parallel rank's, so the engine's largest batch is ``batch_size x attention_dp``."""
    c = concurrency_of(row)
    batch = batch_of(row) * attention_dp
    return {"name": "row", "seed": 0, "deployment": {"workload": str(workload_file)},
            "requests": {"kind": "closed_loop", "concurrency": c, "count": ROUNDS * c, "warmup": c,
                         "prompt_tokens": int(row["isl"]), "output_tokens": int(row["osl"])},
            "scheduler": {"kind": "framework", "max_batch": batch, "max_tokens": token_budget(row)}}


def predict(row: pd.Series, folder: Path, tmp: Path) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) predicted for an aggregated row."""
    from ..serve.deploy import build, serve
    from ..serve.spec import load_serving

    (pool,) = pools(row)
    w = workload(row, pool, folder)
    n = replicas(row, pool["attention_dp"])
    if n > 1:  # the deployment's engines side by side, the NVLink domain filled first
        gpn = 72 if row["system"] == "gb200" else 8
        gpus = pool["tp"] * pool["attention_dp"] * pool["pp"] * n
        w["nodes"], w["gpus_per_node"] = max(1, -(-gpus // gpn)), min(gpus, gpn)
    wfile = tmp / f"{w['name']}.yaml"
    wfile.write_text(yaml.safe_dump(w))
    sfile = tmp / f"{w['name']}.serving.yaml"
    sfile.write_text(yaml.safe_dump(serving_data(row, wfile, pool["attention_dp"])))
    serving = load_serving(sfile)
    _, summary = serve(serving, build(serving))
    return float(summary["ttft_ms"]["mean"]), float(summary["tpot_ms"]["mean"])


def setup(row: pd.Series) -> str:
    """The row's precision and parallelism in a few characters, e.g. ``fp8 tp8 ep8 dp8 b64``
    (parallelism of 1 left out, the experts' TP where it is not the TP; ``b``: the engine's batch
    per attention-DP rank)."""
    (pool,) = pools(row)
    shown = {"tp": pool["tp"], "pp": pool["pp"], "ep": pool["moe_ep"],
             "etp": pool["moe_tp"] if pool["moe_tp"] != pool["tp"] else 1, "dp": pool["attention_dp"]}
    par = [f"{k}{v}" for k, v in shown.items() if v > 1]
    prec = row.get("precision")
    return " ".join([str(prec) if isinstance(prec, str) else "bf16", *par, f"b{batch_of(row)}"])


#: The columns a CSV of rows needs (those of the sample an aggregated row is read from).
COLUMNS = ("id", "concurrency", "backend", "model_path", "system", "precision", "mode", "isl", "osl",
           "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
           "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms")


def read_rows(path: Path, key: str = "--rows") -> pd.DataFrame:
    """A CSV of rows in the sample's columns (:data:`COLUMNS`); one line naming the file and the first
    column missing where it lacks one, or where it is not a CSV."""
    try:
        rows = pd.read_csv(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; expected a CSV of rows in the serving sample's columns",
                          key=key) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a CSV ({' '.join(str(e).split())}); expected rows in the serving "
                          "sample's columns", key=key) from None
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise ConfigError(f"{path}: no column {missing[0]!r} ({len(missing)} missing); expected the serving "
                          f"sample's columns: {', '.join(COLUMNS)}", key=key)
    return rows


#: What makes two rows the same deployment under the same load (the sample repeats some).
SAME = ("model_path", "backend", "system", "precision", "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size",
        "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size", "concurrency", "isl", "osl")


def draw(rows: pd.DataFrame, per_model: int, seed: int = 0) -> pd.DataFrame:
    """``per_model`` distinct aggregated rows of each model drawn at random with ``seed`` (all of a
    model's where it has fewer), in the sample's order."""
    rows = rows.drop_duplicates(subset=[c for c in SAME if c in rows.columns])
    picked = [g.sample(min(len(g), per_model), random_state=seed) for _, g in rows.groupby("model_path", sort=True)]
    return pd.concat(picked).sort_index() if picked else rows


def score(folder: Path, model: str | None = None, limit: int | None = None,
          rows_file: Path | None = None, per_model: int | None = None, seed: int = 0) -> pd.DataFrame:
    """One line per aggregated row (of ``model``'s; the first ``limit``; or ``per_model`` of each
    model drawn at random with ``seed``) of the sample in ``folder``, or of ``rows_file`` (the
    sample's columns; the models' config.json from ``folder``): measured and predicted TTFT and
    TPOT, or why the row was not scored."""
    rows = read_rows(rows_file) if rows_file is not None else pd.read_csv(folder / "silicon_sample.csv")
    rows = rows[rows["mode"] == "agg"]
    if model:
        rows = rows[rows["model_path"].str.contains(model, case=False, regex=False)]
    if per_model:
        rows = draw(rows, per_model, seed)
    if limit:
        rows = rows.head(limit)
    out = []
    with tempfile.TemporaryDirectory() as d:
        for i, (_, row) in enumerate(rows.iterrows()):
            if i % 50 == 0:
                print(f"row {i} of {len(rows)}", file=sys.stderr, flush=True)
            rec: dict[str, Any] = {"id": row["id"], "model": row["model_path"], "backend": row["backend"],
                                   "system": row["system"], "concurrency": concurrency_of(row),
                                   "isl": int(row["isl"]), "osl": int(row["osl"]), "setup": setup(row),
                                   "ttft_ms": row["silicon_ttft_ms"], "tpot_ms": row["silicon_tpot_ms"]}
            t0 = time.perf_counter()
            try:
                rec["pred_ttft_ms"], rec["pred_tpot_ms"] = predict(row, folder, Path(d))
                rec["reason"] = ""
            except (SimgpuError, ValueError) as e:
                rec["pred_ttft_ms"] = rec["pred_tpot_ms"] = np.nan
                rec["reason"] = " ".join(str(e).split())[:160]
            rec["seconds"] = time.perf_counter() - t0
            out.append(rec)
    t = pd.DataFrame(out)
    t["ttft_error"] = t["pred_ttft_ms"] / t["ttft_ms"] - 1
    t["tpot_error"] = t["pred_tpot_ms"] / t["tpot_ms"] - 1
    return t


def geomean_error(err: pd.Series) -> float:
    """``exp(mean |ln(1 + error)|) - 1`` over the finite errors."""
    e = err[np.isfinite(err)]
    return float(np.exp(np.mean(np.abs(np.log1p(e))))) - 1 if len(e) else float("nan")


#: The concurrency bands rows are reported by.
BANDS = ("1-8", "9-64", "65-256", ">256")


def band(c: int) -> str:
    return "1-8" if c <= 8 else "9-64" if c <= 64 else "65-256" if c <= 256 else ">256"


def mape(err: pd.Series) -> float:
    """Mean |error| over the finite errors."""
    e = err[np.isfinite(err)]
    return float(np.mean(np.abs(e))) if len(e) else float("nan")


def cells(ok: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per value of ``key``: rows, and of TTFT and TPOT the geometric-mean |error|, the median signed
    error and the MAPE."""
    return ok.groupby(key, observed=True).agg(rows=("id", "size"), ttft=("ttft_error", geomean_error),
                               ttft_median=("ttft_error", "median"), ttft_mape=("ttft_error", mape),
                               tpot=("tpot_error", geomean_error), tpot_median=("tpot_error", "median"),
                               tpot_mape=("tpot_error", mape))


def unscored(t: pd.DataFrame) -> pd.Series:
    """Rows that were not scored, counted by reason (most first)."""
    return t.loc[t["reason"] != "", "reason"].value_counts()


def figure(ok: pd.DataFrame, path: str | Path) -> None:
    """Predicted against measured TTFT and TPOT, log axes, a colour per framework, the 10% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, what in zip(axes, ("ttft", "tpot"), strict=True):
        for backend, g in ok.groupby("backend"):
            ax.scatter(g[f"{what}_ms"], g[f"pred_{what}_ms"], s=10, alpha=0.7, label=str(backend))
        lo = float(np.nanmin(ok[[f"{what}_ms", f"pred_{what}_ms"]].to_numpy())) if len(ok) else 1.0
        hi = float(np.nanmax(ok[[f"{what}_ms", f"pred_{what}_ms"]].to_numpy())) if len(ok) else 10.0
        x = np.geomspace(max(lo, 1e-3), max(hi, 1e-2), 50)
        ax.plot(x, x, color="black", lw=0.8)
        ax.fill_between(x, 0.9 * x, 1.1 * x, color="grey", alpha=0.2, label="within 10%")
        ax.set(xscale="log", yscale="log", xlabel=f"measured {what.upper()} (ms)",
               ylabel=f"predicted {what.upper()} (ms)",
               title=f"{what.upper()}: geomean |error| {geomean_error(ok[f'{what}_error']):.0%} ({len(ok)} rows)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.silicon_serving", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--model", help="only rows whose model id contains this")
    ap.add_argument("--limit", type=int, help="only the first N rows")
    ap.add_argument("--per-model", type=int, help="N distinct rows of each model drawn at random (--seed)")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    ap.add_argument("--csv", help="write every row here")
    ap.add_argument("--figure", help="draw predicted against measured TTFT and TPOT here (PNG)")
    ap.add_argument("--rows", type=Path, help="score the aggregated rows of this CSV (the sample's columns) "
                                              "instead of the sample's own")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    if args.figure:
        check_out_file(args.figure, "--figure")
    if args.rows is not None:
        read_rows(args.rows)  # refused before anything runs
    folder = sample_folder(args.data)
    if folder is None:
        return 2
    t0 = time.perf_counter()
    t = score(folder, args.model, args.limit, args.rows, args.per_model, args.seed)
    if args.csv:
        t.to_csv(args.csv, index=False)
    ok = t[t["reason"] == ""].assign(band=lambda d: pd.Categorical(d["concurrency"].map(band), BANDS, ordered=True))
    with pd.option_context("display.width", 200, "display.max_rows", 100, "display.max_colwidth", 120):
        for key in ("model", "system", "backend", "band"):
            print(cells(ok, key).to_string(float_format="{:+.1%}".format), "\n")
        why = unscored(t)
        if len(why):
            print(f"not scored ({int(why.sum())} rows), by reason:\n{why.to_string()}\n")
    if args.figure:
        figure(ok, args.figure)
    print(f"{len(ok)} of {len(t)} aggregated rows scored in {time.perf_counter() - t0:.0f} s "
          f"(median {ok['seconds'].median() if len(ok) else float('nan'):.2f} s a row): TTFT geomean |error| "
          f"{geomean_error(ok['ttft_error']):.1%}, TPOT {geomean_error(ok['tpot_error']):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

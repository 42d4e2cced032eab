"""``simgpu validate --report DIR``: every accuracy table and plot of the documentation, regenerated.

Each validation set (:data:`SETS`) is reduced to one frame of points, ``case``, ``group``,
``measured`` and ``predicted`` (and ``size`` where error by size means something), from the same
functions its own command runs. For each set the report writes ``DIR/<set>.md`` (the command, what
is measured, the summary figures, the error by group, the worst points), ``DIR/<set>.csv`` (every
point) and ``DIR/<set>.png`` (predicted against measured on log axes with the ±10% band, the CDF of
|error|, and for collectives the error by message size); ``DIR/index.md`` holds one row per set.
A set whose measurements are not in ``../shared/data`` is listed as skipped, with the reason.

Errors are ``predicted / measured - 1``; a set's headline is the geometric mean of
``|ln(predicted / measured)|`` expressed as a percentage, the same figure each suite prints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

#: the band drawn around the diagonal, and the share of points inside it reported
BAND = 0.10
#: rows of the worst points listed on a set's page
WORST = 15


@dataclass(frozen=True)
class Set:
    """One validation set: how to get its points and how to describe them."""

    name: str
    title: str
    command: str
    unit: str
    what: str
    points: Callable[[bool], pd.DataFrame]


def _frame(case: Iterable[str], group: Iterable[str], measured: ArrayLike, predicted: ArrayLike,
           size: ArrayLike | None = None) -> pd.DataFrame:
    out = pd.DataFrame({"case": list(case), "group": list(group), "measured": np.asarray(measured, float),
                        "predicted": np.asarray(predicted, float)})
    if size is not None:
        out["size"] = np.asarray(size, float)
    return out


def _collectives(quick: bool) -> pd.DataFrame:
    from . import collectives as c

    parts = []
    for s in c.sweeps(c.DATA, vtrain_stride_mb=64 if quick else 16):
        pred = c.predict(s)
        n = len(s.sizes)
        parts.append(_frame([s.name] * n, [s.category] * n, s.measured_us, pred, s.sizes))
    return pd.concat(parts, ignore_index=True)


def _iterations(quick: bool) -> pd.DataFrame:
    from . import iterations as it

    if not (it.DATA / it.CSV).is_file():
        raise FileNotFoundError(f"no vTrain measurements at {it.DATA}")
    cases = it.load_cases(it.DATA)
    if quick:
        cases = it.stratified_sample(cases, 2, 0)
    df = it.predict(cases, workers=1)
    case = [f"h{r.hidden} L{r.layers} s{r.seq_len} b{r.global_batch} tp{r.tp} pp{r.pp} dp{r.dp} mb{r.micro_batch}"
            for r in df.itertuples()]
    return _frame(case, [f"tp{r.tp} pp{r.pp}" for r in df.itertuples()], df["measured_ms"], df["predicted_ms"])


def _published(quick: bool) -> pd.DataFrame:
    from . import iterations as it

    if not it.PUBLISHED.is_file():
        raise FileNotFoundError(f"no published rows at {it.PUBLISHED}")
    df = it.predict_published(it.published_cases(), workers=1)
    case = [f"{r.model} {r.num_gpus} GPUs tp{r.tp} pp{r.pp} cp{r.cp} vp{r.vp}" for r in df.itertuples()]
    return _frame(case, df["model"].astype(str), df["derived_iteration_time_s"], df["predicted_s"])


def _moe_training(quick: bool) -> pd.DataFrame:
    from . import moe_training as mt

    if not mt.PUBLISHED.is_file():
        raise FileNotFoundError(f"no published rows at {mt.PUBLISHED}")
    df = mt.predict(mt.cases(), workers=1)
    case = [f"{r.source_id} {r.model} {r.num_gpus} GPUs {r.precision} pp{r.pp} vp{r.vp} ep{r.ep} mbs{r.mbs}"
            for r in df.itertuples()]
    return _frame(case, df["model"].astype(str), df["derived_iteration_time_s"], df["predicted_s"])


def _mlperf_dlrm(quick: bool) -> pd.DataFrame:
    from . import mlperf as m

    df, _ = m.validate_all(m.DATA)
    return _frame(df["system"].astype(str), df["accelerator"].astype(str), df["measured_ms"], df["predicted_ms"])


def _dlrm(quick: bool) -> pd.DataFrame:
    from . import dlrm as d

    df = d.validate_all(d.DATA)
    case = [f"row {r.row} {r.system} {r.gpus} GPUs {r.precision} b{r.batch} {r.model}" for r in df.itertuples()]
    return _frame(case, [f"{r.system} {r.precision}" for r in df.itertuples()], df["measured_ms"], df["predicted_ms"])


def _traces(quick: bool) -> pd.DataFrame:
    from . import traces as t

    df = t.validate()
    return _frame(df["job"].astype(str), df["gpu"].astype(str), df["traced_ms"], df["replayed_ms"])


def _serving_steps(quick: bool) -> pd.DataFrame:
    from ..kernels.importers import data_root
    from . import splitwise as sw

    data = data_root()
    if not (data / sw.SPLITWISE).is_file():
        raise FileNotFoundError(f"no Splitwise measurements at {data / sw.SPLITWISE}")
    df = sw.validate_splitwise(data)
    df = df[df["scored"]]
    case = [f"{r.model} {r.hardware} tp{r.tp} prompt {r.prompt} batch {r.batch} {r.what}" for r in df.itertuples()]
    return _frame(case, [f"{r.hardware} {r.what}" for r in df.itertuples()], df["measured_ms"], df["predicted_ms"])


def _mlperf_inference(quick: bool) -> pd.DataFrame:
    from ..kernels.importers import data_root
    from . import mlperf_inference as mi

    data = data_root()
    if not (data / mi.MLPERF).is_file():
        raise FileNotFoundError(f"no MLPerf Inference results at {data / mi.MLPERF}")
    df, _ = mi.validate_mlperf(data)
    case = [f"{r.round} {r.submitter} {r.system}" for r in df.itertuples()]
    return _frame(case, df["accelerator"].astype(str), df["measured"], df["predicted"])


def _silicon_serving(quick: bool) -> pd.DataFrame:
    from . import silicon_serving as ss
    from .silicon import sample_folder

    folder = sample_folder(None)
    if folder is None:
        raise FileNotFoundError("no measured serving sample (inference/aiconfigurator-silicon)")
    df = ss.score(folder, per_model=3 if quick else 20)
    df = df[np.isfinite(df["pred_ttft_ms"])]
    base = [f"{r.model} {r.backend} {r.system} {r.setup} c{r.concurrency} {r.isl}/{r.osl}" for r in df.itertuples()]
    short = df["model"].astype(str).str.split("/").str[-1]
    return pd.concat([_frame([b + " TTFT" for b in base], short + " TTFT", df["ttft_ms"], df["pred_ttft_ms"]),
                      _frame([b + " TPOT" for b in base], short + " TPOT", df["tpot_ms"], df["pred_tpot_ms"])],
                     ignore_index=True)


SETS: tuple[Set, ...] = (
    Set("collectives", "Collectives against nccl-tests", "python -m simgpu.validate.collectives", "us",
        "NCCL collectives (all-reduce, all-gather, reduce-scatter, all-to-all, ...) by message size, on the "
        "machines of the published and measured nccl-tests sweeps; the group is the sweep's category.",
        _collectives),
    Set("iterations-vtrain", "Megatron GPT iterations on one A100 node", "python -m simgpu.validate.iterations",
        "ms", "One training iteration of GPT models under every (tp, pp, micro-batch) vTrain measured on 8 A100s.",
        _iterations),
    Set("iterations-nemo", "NeMo LLM pre-training on DGX H100", "python -m simgpu.validate.iterations --published",
        "s", "NeMo 24.07's published iteration times of Llama and GPT models on DGX H100 clusters.", _published),
    Set("moe-training", "MoE pre-training (Megatron-Bridge, DGX H100)", "python -m simgpu.validate.moe_training",
        "s", "Megatron-Bridge's published iteration times of fine-grained MoE models on DGX H100.", _moe_training),
    Set("dlrm-mlperf", "DLRM on MLPerf Training v2.0 (HugeCTR)", "python -m simgpu.validate.mlperf", "ms",
        "MLPerf Training v2.0 DLRM submissions, one iteration, with HugeCTR's hybrid embedding.", _mlperf_dlrm),
    Set("dlrm-pytorch", "DLRM with PyTorch on DGX A100 / DGX-1 / DGX-2", "python -m simgpu.validate.dlrm", "ms",
        "NVIDIA DeepLearningExamples' DLRM and MLPerf v0.7 PyTorch runs: one training iteration.", _dlrm),
    Set("traces", "Profiler traces replayed", "python -m simgpu.validate.traces", "ms",
        "PyTorch profiler traces of real training steps replayed with their measured kernel durations on the "
        "platform of their GPU: a check that the engine's streams, dependencies and host launches reproduce the "
        "traced step, not a prediction of the kernels.", _traces),
    Set("serving-steps", "LLM serving steps (Splitwise)", "python -m simgpu.validate --only inference", "ms",
        "Prefill and decode iterations of Llama-2-70B and BLOOM-176B on A100 and H100 (each model/TP group "
        "held out of the serving stack's fitted figures).", _serving_steps),
    Set("mlperf-inference", "MLPerf Inference Llama-2-70B Offline", "python -m simgpu.validate --only inference",
        "tokens/s", "Offline throughput of MLPerf Inference v4.1-v5.1 systems.", _mlperf_inference),
    Set("serving-deployments", "Serving deployments under closed-loop load",
        "python -m simgpu.validate.silicon_serving --per-model 20", "ms",
        "TTFT and TPOT of the measured serving sample's aggregated rows (20 distinct rows of each model drawn at "
        "random, seed 0), each run as a closed loop of its concurrency.", _silicon_serving),
)


def summary(points: pd.DataFrame) -> dict[str, float]:
    """The figures of one set or group: points, geometric-mean |error|, median signed and absolute
    error, 90th percentile and largest |error|, share within :data:`BAND`."""
    ok = points[(points["measured"] > 0) & (points["predicted"] > 0)]
    err = ok["predicted"] / ok["measured"] - 1
    if err.empty:
        return {"n": 0.0}
    a = err.abs()
    return {"n": float(len(err)), "geomean": float(np.expm1(np.mean(np.abs(np.log1p(err))))),
            "median": float(err.median()), "median_abs": float(a.median()), "p90": float(a.quantile(0.9)),
            "max": float(a.max()), "within": float((a <= BAND).mean())}


def _pct(x: float, signed: bool = False) -> str:
    return "n/a" if x is None or not math.isfinite(x) else (f"{x:+.1%}" if signed else f"{x:.1%}")


def _num(x: float) -> str:
    return f"{x:.4g}"


def plot(s: Set, points: pd.DataFrame, path: Path) -> None:
    """Predicted against measured (log-log, the ±10% band), the |error| CDF, and for sets with a
    ``size`` the error by size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = points[(points["measured"] > 0) & (points["predicted"] > 0)]
    panels = 3 if "size" in ok else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4))
    ax = axes[0]
    groups = sorted(ok["group"].unique())
    cmap = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    for i, g in enumerate(groups):
        q = ok[ok["group"] == g]
        ax.scatter(q["measured"], q["predicted"], s=10, alpha=0.7, color=cmap(i % cmap.N),
                   label=g if len(groups) <= 12 else None)
    lo, hi = float(ok[["measured", "predicted"]].min().min()), float(ok[["measured", "predicted"]].max().max())
    xs = np.geomspace(lo / 1.2, hi * 1.2, 50)
    ax.plot(xs, xs, color="black", lw=0.8)
    ax.fill_between(xs, xs * (1 - BAND), xs * (1 + BAND), color="grey", alpha=0.2, label=f"±{BAND:.0%}")
    ax.set(xscale="log", yscale="log", xlabel=f"measured ({s.unit})", ylabel=f"predicted ({s.unit})",
           title=s.title)
    ax.legend(fontsize=6, loc="upper left")
    err = (ok["predicted"] / ok["measured"] - 1).abs().sort_values().to_numpy()
    axes[1].plot(err * 100, np.arange(1, len(err) + 1) / len(err), drawstyle="steps-post")
    axes[1].axvline(BAND * 100, color="grey", ls="--", lw=0.8)
    axes[1].set(xlabel="|error| (%)", ylabel="share of points", title="CDF of |error|", ylim=(0, 1.02))
    if panels == 3:
        for i, g in enumerate(groups):
            q = ok[ok["group"] == g]
            axes[2].scatter(q["size"], (q["predicted"] / q["measured"] - 1) * 100, s=8, alpha=0.6,
                            color=cmap(i % cmap.N))
        axes[2].axhspan(-BAND * 100, BAND * 100, color="grey", alpha=0.2)
        axes[2].set(xscale="log", xlabel="message size (bytes)", ylabel="error (%)", title="error by size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(s: Set, points: pd.DataFrame) -> str:
    """The markdown page of one set."""
    head = summary(points)
    lines = [f"# {s.title}", "", s.what, "", f"Regenerate: `{s.command}` prints the suite's own table; "
             "`python -m simgpu.validate --report docs/accuracy` rewrites this page.", "",
             f"![predicted against measured]({s.name}.png)", "",
             "| points | geomean abs. error | median error | median abs. | p90 abs. | largest | within "
             f"{BAND:.0%} |", "|---|---|---|---|---|---|---|",
             f"| {head['n']:.0f} | {_pct(head['geomean'])} | {_pct(head['median'], True)} | "
             f"{_pct(head['median_abs'])} | {_pct(head['p90'])} | {_pct(head['max'])} | {_pct(head['within'])} |", "",
             "## By group", "", "| group | points | geomean abs. error | median error | largest |",
             "|---|---|---|---|---|"]
    for g, q in points.groupby("group", sort=True):
        f = summary(q)
        if f["n"]:
            lines.append(f"| {g} | {f['n']:.0f} | {_pct(f['geomean'])} | {_pct(f['median'], True)} | "
                         f"{_pct(f['max'])} |")
    worst = points.assign(error=points["predicted"] / points["measured"] - 1)
    worst = worst.reindex(worst["error"].abs().sort_values(ascending=False).index).head(WORST)
    lines += ["", f"## The {len(worst)} largest errors", "", f"| case | measured ({s.unit}) | predicted | error |",
              "|---|---|---|---|"]
    lines += [f"| {r.case} | {_num(r.measured)} | {_num(r.predicted)} | {_pct(r.error, True)} |"
              for r in worst.itertuples()]
    lines += ["", f"Every point: [{s.name}.csv]({s.name}.csv).", ""]
    return "\n".join(lines)


def write_report(out: Path, only: Sequence[str] = (), quick: bool = False,
                 log: Callable[[str], None] = print) -> int:
    """Write the page, table and plot of every set (of ``only``'s) into ``out``, and the index of
    every set found there; ``quick``: fewer points of the slow sets. Returns the exit status (0)."""
    out.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    for s in SETS:
        if only and s.name not in only:
            continue
        t0 = time.perf_counter()
        log(f"{s.name} ...")
        try:
            points = s.points(quick)
        except FileNotFoundError as e:
            skipped[s.name] = str(e)
            log(f"{s.name}: skipped ({e})")
            continue
        if points.empty:
            skipped[s.name] = "no points"
            continue
        seconds = time.perf_counter() - t0
        points.to_csv(out / f"{s.name}.csv", index=False)
        plot(s, points, out / f"{s.name}.png")
        (out / f"{s.name}.md").write_text(page(s, points))
        f = summary(points)
        log(f"{s.name}: {f['n']:.0f} points, geomean |error| {_pct(f['geomean'])} ({seconds:.0f} s)")
    (out / "index.md").write_text(index(out, skipped))
    return 0


def index(out: Path, skipped: dict[str, str]) -> str:
    """The index page: one row per set whose points are in ``out``, and the sets skipped."""
    lines = ["# Accuracy tables", "",
             "Every figure here is regenerated by `python -m simgpu.validate --report docs/accuracy` from the "
             "measurements in `../shared/data` (each suite's own command prints its full table). Errors are "
             "predicted / measured - 1; the headline is the geometric mean of |ln(predicted / measured)|.", "",
             f"| set | points | geomean abs. error | median error | within {BAND:.0%} | command |",
             "|---|---|---|---|---|---|"]
    missing = []
    for s in SETS:
        path = out / f"{s.name}.csv"
        if not path.is_file():
            missing.append(f"- {s.title}: {skipped.get(s.name, 'not generated')}")
            continue
        f = summary(pd.read_csv(path))
        lines.append(f"| [{s.title}]({s.name}.md) | {f['n']:.0f} | {_pct(f['geomean'])} | "
                     f"{_pct(f['median'], True)} | {_pct(f['within'])} | `{s.command}` |")
    if missing:
        lines += ["", "Not in this report:", "", *missing]
    return "\n".join(lines) + "\n"


def set_names() -> list[str]:
    return [s.name for s in SETS]

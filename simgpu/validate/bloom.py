"""Whole-iteration predictions against BigScience's search for BLOOM's fastest 3D topology (report only).

``../shared/data/iterations/bigscience/train/tr11-176B-ml/chronicles-prequel.md`` records, in its
sections "Choosing the fastest 3D Topology" and "48 node contenders", the seconds per iteration
(the second iteration of each run) of 181B-205B GPT models trained with Megatron-DeepSpeed on
40-48 nodes of IDRIS Jean Zay (8x A100-80GB each, :data:`PLATFORM`): tp 8 inside a node, pp 4-12,
dp 4-12, micro-batch 1-8, global batch about 2,048 sequences of 2,048 tokens, vocabulary 250,880.

Which rows (:func:`load_rows`): every markdown table of those two sections whose columns are
exactly :data:`COLUMNS`, without its empty rows and rows with no Sec/it, each run once (the first
section repeats rows of its first table in the tables after it). Left out: the section's
"Max possible TFLOPs check" table (1-node 18B models of 6-10 layers, GBS 512; its columns have
Layers instead of DP) and the "Trying with ZeRO_STAGE=0/1" table (an extra ZS column; its ZS=1 row
repeats the micro-batch 2 run of the first 72-layer table with Sec/it and TFLOPs swapped, its ZS=0
row measures ZeRO stage 0, not the 1 these runs use). A row must also be of the 176B-200B family
(its Size within :data:`FAMILY_B`). That gives 20 rows from the first section (its
first table, :func:`sweep`, is the topology sweep: the nine pp / dp splits at micro-batch 1) and
12 from the second.

The model of each row: the second section states ``NHIDDEN=... / NLAYERS=...`` above each table.
The first section fixes NHIDDEN at :data:`SWEEP_HIDDEN` = 14,400 ("the number of layers had to be
tweaked to fit PP and NHIDDEN was fixed", line 471; the 200B model of 80 layers is "NHIDDEN=14400"
in "Best TFLOPs", line 372, and the 40-node pp 10 row of the sweep reappears with NHIDDEN 14400 in
"tile and wave quantization", line 582) and gives the model size instead of the layers: its layers
are the multiple of pp whose ``12 L h^2 + V h`` parameters (``V`` = 250,880) is closest to the Size
column (:func:`infer_layers`). The TFLOPs column agrees: Megatron's count with recomputation,
``96 B s L h^2 (1 + s / 6h + V / 16Lh)`` over seconds and GPUs, gives the same layers in every row
to within 1% once raised by the 3% by which, the chronicle says (line 596), those early figures
under-reported; the second section's rows satisfy the formula exactly with their stated layers.

Each row as Megatron-DeepSpeed ran it (:func:`workload`): GPT blocks with :data:`HEADS` = 64
attention heads ("all NHEADS=64 (above too)", line 680, the heading of the round after these
tables; the 02-17 runs of "Best TFLOPs" at hidden 14,400 had 96, line 372, and 14,400 has no head
size of 128; ``--heads`` tries another), Megatron's unfused core attention (the fused
scale-mask-softmax the chronicle tunes heads for, line 743) with Megatron's default dropout 0.1
(tr11 README, "The default Megatron-LM dropout settings are inherited"), fp16 ("from now on the
testing is happening with BF16 optimizer ... compared to fp16", line 899, a later section: these
earlier runs were fp16; the two cost the same here), full activation recomputation (the tr11 README
uses DeepSpeed's activation checkpointing, "--deepspeed-activation-checkpointing"; its TFLOPs use
the ``4*2`` coefficient "since we use activation check-pointing", and the TFLOPs column above fits
only with it), ZeRO-1 (line 489, "thanks to ZeRO which shards all fp32 optim+grad+params"; the
ZeRO-stage table gives ZS 1 for the micro-batch 2 run of these models, line 669), 1F1B
with the gradients reduced after the backward (DeepSpeed's pipeline engine), no sequence
parallelism, the host time per op of Megatron-DeepSpeed that :mod:`simgpu.validate.iterations`
calibrated on vTrain's measurements. The global batch is used as given (2,040, 2,043, 2,045 and
2,046 are multiples of dp at micro-batch 1); one that is not a multiple of micro-batch x dp is
rounded down to the nearest that is (whole micro-batches per replica), which no row here needs.
Not modelled: BLOOM's ALiBi and embedding LayerNorm (learned positions instead: a lookup), the
iteration-to-iteration spread of single-iteration snapshots (line 471: "the data isn't exact and can
fluctuate a bit").

Scores (:func:`summary`): the geometric-mean absolute error of seconds per iteration, the Spearman
rank correlation of predicted and measured times, and whether the predicted fastest row is the
measured fastest, over the topology sweep and over all rows (where the models differ in size).
No threshold: ``python -m simgpu.validate.bloom`` reports. A row's simulation time and memory grow
with its micro-batches x layers (identical ranks are folded: two of each stage's eight
tensor-parallel ranks, one data-parallel replica); the 32 rows take about 14 minutes on two cores
(``--rows N`` takes the N cheapest rows, :func:`cost`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..config.loader import Job, load_platform
from ..config.workload import WorkloadSpec
from .iterations import HOST_OVERHEAD_US, simulate_all

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "iterations" / "bigscience"
CHRONICLE = Path("train") / "tr11-176B-ml" / "chronicles-prequel.md"
#: The two sections read, by heading; the first holds the topology sweep.
SECTIONS = ("Choosing the fastest 3D Topology", "48 node contenders")
#: The columns of the tables read; tables with other columns are skipped.
COLUMNS = ("Nodes", "Size", "DP", "TP", "PP", "MBS", "GBS", "Mem", "Sec/it", "TFLOPs", "Notes")
#: Model sizes (billions of parameters, the Size column) of the family compared here.
FAMILY_B = (170.0, 210.0)
#: NHIDDEN of every run of the first section (see the module docstring).
SWEEP_HIDDEN = 14400
VOCAB = 250880
SEQ_LEN = 2048
HEADS = 64
GPUS_PER_NODE = 8
PLATFORM = "jean_zay_a100"

_STATED = re.compile(r"^\s*NHIDDEN\s*=\s*(\d+)\s*/\s*NLAYERS\s*=\s*(\d+)\s*$")


def layer_params(layers: int, hidden: int, vocab: int = VOCAB) -> float:
    """Parameters of the model by the chronicle's leading terms: ``12 L h^2 + V h``."""
    return 12.0 * layers * hidden**2 + vocab * hidden


def infer_layers(size_b: float, pp: int, hidden: int = SWEEP_HIDDEN, vocab: int = VOCAB) -> int:
    """The multiple of ``pp`` whose :func:`layer_params` is closest to ``size_b`` billion."""
    raw = (size_b * 1e9 - vocab * hidden) / (12.0 * hidden**2)
    lo = max(pp, int(raw // pp) * pp)
    return min((lo, lo + pp), key=lambda n: (abs(layer_params(n, hidden, vocab) - size_b * 1e9), n))


def implied_layers(row: Any, correction: float = 1.0) -> float:
    """The layers for which Megatron's FLOP count with recomputation, ``96 B s L h^2 (1 + s / 6h +
    V / 16Lh)``, gives the row's TFLOPs (times ``correction``) at its seconds per iteration."""
    gpus = row.nodes * GPUS_PER_NODE
    x = correction * row.tflops * 1e12 * row.sec_per_it * gpus / (96.0 * row.gbs * SEQ_LEN * row.nhidden**2)
    return float((x - VOCAB / (16.0 * row.nhidden)) / (1.0 + SEQ_LEN / (6.0 * row.nhidden)))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(text: str, suffix: str = "") -> float:
    text = text.strip()
    if suffix and text.upper().endswith(suffix):
        text = text[: -len(suffix)]
    try:
        return float(text)
    except ValueError:
        return float("nan")


def load_rows(folder: Path = DATA) -> pd.DataFrame:
    """The measured rows of the two sections (see the module docstring), in file order.

    Columns: ``section`` (0: the topology sweep's section, 1: the 48-node contenders), ``table``
    (its index among the section's tables read, from 0), ``line`` (1-based), nodes, size_b, dp, tp,
    pp, mbs, gbs, mem_gb (NaN where not given), sec_per_it, tflops, nhidden, nlayers, notes, and
    ``fixed``: what was corrected. Where dp x tp x pp is not the GPUs of the row's nodes, dp is taken
    from the nodes (the one such row, line 648, prints DP 8 on 40 nodes at pp 10; the text above it
    leaves 64 of the 384 GPUs out, i.e. 320 = dp 4 x 8 x 10, and its TFLOPs fit 320 GPUs exactly).
    """
    lines = (folder / CHRONICLE).read_text(encoding="utf-8").splitlines()
    rows: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    section: int | None = None
    stated: tuple[int, int] | None = None
    tables = -1
    in_table = fenced = False
    for i, line in enumerate(lines, start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if re.match(r"#+ ", line):
            title = line.lstrip("#").strip()
            section = SECTIONS.index(title) if line.startswith("## ") and title in SECTIONS else None
            stated, tables, in_table = None, -1, False
            continue
        if section is None:
            continue
        m = _STATED.match(line)
        if m:
            stated = (int(m.group(1)), int(m.group(2)))
            continue
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if tuple(cells) == COLUMNS:
            in_table = True
            tables += 1
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != len(COLUMNS) or not any(cells):
            continue
        c = dict(zip(COLUMNS, cells))
        sec = _number(c["Sec/it"])
        if np.isnan(sec):
            continue
        size = _number(c["Size"], "B")
        if not FAMILY_B[0] <= size <= FAMILY_B[1]:
            continue
        nodes, dp, tp, pp, mbs, gbs = (int(c[k]) for k in ("Nodes", "DP", "TP", "PP", "MBS", "GBS"))
        fixed = ""
        if dp * tp * pp != nodes * GPUS_PER_NODE:
            if nodes * GPUS_PER_NODE % (tp * pp):
                raise ValueError(f"{CHRONICLE}:{i}: {nodes} nodes x {GPUS_PER_NODE} GPUs do not split into tp={tp} "
                                 f"x pp={pp}")
            fixed, dp = f"DP {dp} -> {nodes * GPUS_PER_NODE // (tp * pp)}", nodes * GPUS_PER_NODE // (tp * pp)
        if section == 0:
            hidden, layers = SWEEP_HIDDEN, infer_layers(size, pp)
        elif stated is None:
            raise ValueError(f"{CHRONICLE}:{i}: no NHIDDEN=... / NLAYERS=... stated above this table")
        else:
            hidden, layers = stated
        if layers % pp:
            raise ValueError(f"{CHRONICLE}:{i}: {layers} layers do not split over pp={pp}")
        row = {"section": section, "table": tables, "line": i, "nodes": nodes, "size_b": size, "dp": dp, "tp": tp,
               "pp": pp, "mbs": mbs, "gbs": gbs, "mem_gb": _number(c["Mem"], "GB"), "sec_per_it": sec,
               "tflops": _number(c["TFLOPs"]), "nhidden": hidden, "nlayers": layers, "notes": c["Notes"],
               "fixed": fixed}
        key = tuple(v for k, v in row.items() if k not in ("table", "line", "notes", "mem_gb", "fixed"))
        if key in seen:
            continue
        seen.add(key)
        rows.append(row)
    out = pd.DataFrame(rows)
    out.index.name = "row"
    return out


def sweep(rows: pd.DataFrame) -> pd.DataFrame:
    """The topology sweep: the first table of "Choosing the fastest 3D Topology" (micro-batch 1)."""
    return rows[(rows["section"] == 0) & (rows["table"] == 0)]


def micro_batches(row: Any) -> int:
    """Micro-batches per data-parallel replica: the global batch rounded down to whole micro-batches."""
    return int(row.gbs) // (int(row.mbs) * int(row.dp))


def label(row: Any) -> str:
    return (f"{int(row.nodes)}n h{int(row.nhidden)} L{int(row.nlayers)} dp{int(row.dp)} tp{int(row.tp)} "
            f"pp{int(row.pp)} mbs{int(row.mbs)} gbs{int(row.gbs)}")


def workload(row: Any, heads: int = HEADS) -> dict[str, Any]:
    """The workload (as a YAML-like dict) of one row (see the module docstring for each choice)."""
    m = micro_batches(row)
    if m < 1:
        raise ValueError(f"global batch {row.gbs} is below one micro-batch per replica ({row.mbs} x dp {row.dp})")
    return {
        "name": f"bloom {label(row)}", "platform": PLATFORM, "nodes": int(row.nodes), "gpus_per_node": GPUS_PER_NODE,
        "model": {"kind": "transformer", "arch": "gpt", "layers": int(row.nlayers), "hidden": int(row.nhidden),
                  "heads": heads, "seq_len": SEQ_LEN, "vocab": VOCAB, "attention": "unfused", "dropout": 0.1},
        "training": {"micro_batch": int(row.mbs), "global_batch": m * int(row.mbs) * int(row.dp),
                     "precision": "fp16", "optimizer": "adam", "recompute": "full", "framework": "megatron",
                     "host_overhead_us": HOST_OVERHEAD_US},
        "parallelism": {"tp": int(row.tp), "pp": int(row.pp), "dp": int(row.dp), "zero": 1, "pp_schedule": "1f1b",
                        "dp_overlap": False},
    }


def job(data: dict[str, Any]) -> Job:
    """The validated job of a :func:`workload` dict."""
    from ..config.checks import check_job

    plat, pfile = load_platform(str(data["platform"]))
    j = Job(WorkloadSpec.model_validate(data), plat, str(data["name"]), pfile)
    check_job(j)
    return j


def memory_gib(data: dict[str, Any]) -> float:
    """GiB the busiest GPU of a :func:`workload` needs by simgpu's memory model (what
    :func:`simgpu.sim.build` checks against the GPU), without building the op graph."""
    from ..config.checks import gpus_per_node
    from ..workload import World
    from ..workload.transformer.memory import stage_memory
    from ..workload.transformer.shapes import make_setup

    j = job(data)
    s = make_setup(j.workload, World(j.workload.nodes, gpus_per_node(j), j.platform.gpu.memory_gib))
    return max(stage_memory(s, stage).total for stage in range(s.layout.pp)) / 2**30


def _simulate(data: dict[str, Any]) -> float:
    from ..sim import simulate

    return simulate(job(data)).iteration_time_s


def predict(rows: pd.DataFrame, workers: int | None = None, heads: int = HEADS) -> pd.DataFrame:
    """``rows`` with ``predicted_s``, ``measured_s`` and ``error`` (predicted / measured - 1)."""
    times = simulate_all(_simulate, [workload(r, heads) for r in rows.itertuples()], workers)
    out = rows.copy()
    out["predicted_s"] = times
    out["measured_s"] = out["sec_per_it"]
    out["error"] = out["predicted_s"] / out["measured_s"] - 1
    return out


def geomean_error(df: pd.DataFrame) -> float:
    """``exp(mean |ln(predicted / measured)|) - 1``."""
    return float(np.expm1(np.mean(np.abs(np.log(df["predicted_s"] / df["measured_s"])))))


def spearman(df: pd.DataFrame) -> float:
    """Rank correlation of predicted and measured seconds (ties share their mean rank); NaN below
    three rows or where either side is constant."""
    if len(df) < 3:
        return float("nan")
    pred, meas = df["predicted_s"].rank(), df["measured_s"].rank()
    if pred.std() == 0 or meas.std() == 0:
        return float("nan")
    return float(np.corrcoef(pred, meas)[0, 1])


def fastest_agrees(df: pd.DataFrame) -> bool:
    """Whether the predicted fastest row is the measured fastest."""
    return bool(df["predicted_s"].idxmin() == df["measured_s"].idxmin())


def summary(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Scores over the topology sweep rows present in ``df`` and over all its rows."""
    out: dict[str, dict[str, Any]] = {}
    for name, part in (("sweep", sweep(df)), ("all", df)):
        if part.empty:
            out[name] = {"rows": 0}
            continue
        out[name] = {"rows": len(part), "geomean_error": geomean_error(part),
                     "median_error": float(part["error"].median()), "spearman": spearman(part),
                     "fastest_agrees": fastest_agrees(part),
                     "measured_fastest": label(part.loc[part["measured_s"].idxmin()]),
                     "predicted_fastest": label(part.loc[part["predicted_s"].idxmin()])}
    return out


def cost(rows: pd.DataFrame) -> pd.Series:
    """A proxy for a row's simulation time: micro-batches x blocks per stage x stages x tp."""
    m = rows["gbs"] // (rows["mbs"] * rows["dp"])
    return m * rows["nlayers"] * rows["tp"]


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.bloom", description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the bigscience folder")
    ap.add_argument("--rows", type=int, help="simulate only the N rows cheapest to simulate (default: all)")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--heads", type=int, default=HEADS, help=f"attention heads (default {HEADS})")
    ap.add_argument("--csv", type=Path, help="write the per-row table here")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    if not (args.data / CHRONICLE).is_file():
        print(f"error: {args.data / CHRONICLE} not found (the BigScience logs belong in ../shared/data beside "
              f"the checkout)", file=sys.stderr)
        return 2
    rows = load_rows(args.data)
    if args.rows:
        rows = rows.loc[cost(rows).sort_values(kind="stable").index[: args.rows]].sort_index()
    df = predict(rows, workers=args.workers, heads=args.heads)
    if args.csv:
        df.to_csv(args.csv)
    for r in df.itertuples():
        tag = "sweep" if r.section == 0 and r.table == 0 else f"s{r.section}t{r.table}"
        print(f"{tag:6s} {label(r):48s} measured {r.measured_s:7.2f} s/it  predicted {r.predicted_s:7.2f}  "
              f"error {r.error:+.1%}")
    for name, s in summary(df).items():
        if not s["rows"]:
            print(f"{name}: no rows")
            continue
        print(f"{name}: {s['rows']} rows  geomean |error| {s['geomean_error']:.1%}  median error "
              f"{s['median_error']:+.1%}  Spearman {s['spearman']:.3f}  fastest predicted = measured: "
              f"{'yes' if s['fastest_agrees'] else 'no'} (measured {s['measured_fastest']}; predicted "
              f"{s['predicted_fastest']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

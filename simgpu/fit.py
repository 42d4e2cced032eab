"""``python -m simgpu.fit``: fit a platform's kernel models, or validate the method on NeuSight's data.

    python -m simgpu.fit --platform cpu_host            # platforms/cpu_host/microbench -> models/
    python -m simgpu.fit --neusight ../shared/data/kernels/neusight

A platform fit reads ``platforms/<name>/microbench/*.csv`` (the median time of each case), holds
out a random 20% per family to report the error, refits on everything and writes
``models/<family>.txt`` with ``manifest.json`` (content hashes of the data and of the analytical
model, features, held-out errors). If the manifest already matches the data and the method,
nothing is refitted (``--force`` refits). ``--neusight`` reports, per op family and GPU, the
held-out error of per-GPU models against the analytical model's, and the error on a GPU left out
of training (``--leave-out``, H100 by default) of models fitted on the other GPUs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import ConfigError, SimgpuError
from .kernels import store
from .kernels.learned import ROUNDS, VERSION, Sample, baseline_hash, errors, evaluate, predict_sample, train

H100 = "NVIDIA H100 80GB HBM3"


def fit_platform(ref: str, *, force: bool = False, time_column: str = "median_s",
                 seed: int = 0) -> tuple[dict[str, Any], bool]:
    """Fit (or keep) the models of platform ``ref``; returns the manifest and whether it refitted.

    ``time_column`` is the statistic fitted. LightGBM runs on one thread: with more, its sums are
    taken in another order and the model files differ in the last digits, and the same data must
    give the same files.
    """
    from .config.loader import load_platform

    platform, _ = load_platform(ref)
    folder = store.platform_dir(ref)
    if folder is None:
        raise ConfigError(f"platform {ref!r} has no YAML file", key="--platform")
    data, models = folder / "microbench", folder / "models"
    tables = store.read_tables(data)
    if time_column not in store.TIME_COLUMNS[:3]:
        raise ConfigError(f"expected one of {', '.join(store.TIME_COLUMNS[:3])}", key="--time-column")
    # The GPU's figures and the analytical model are part of what a fit depends on: corrections are
    # learned against the analytical model of this GPU, so an edit of either refits.
    ident = {"version": VERSION, "data_sha256": store.data_hash(data, tuple(tables)), "time_column": time_column,
             "rounds": ROUNDS, "seed": seed, "gpu_spec": platform.gpu.model_dump(mode="json"),
             "baseline_sha256": baseline_hash()}
    old = store.read_manifest(models)
    if (not force and old is not None and all(old.get(k) == v for k, v in ident.items())
            and set(old["families"]) == set(tables)):
        return old, False
    families: dict[str, Any] = {}
    models.mkdir(parents=True, exist_ok=True)
    for family, table in sorted(tables.items()):
        sample = Sample.of(family, table, platform.gpu, time_column)
        held = evaluate(family, sample, seed=seed) if len(table) >= 10 else {}
        model = train(family, sample, seed=seed)
        model.booster.save_model(str(models / f"{family}.txt"))
        families[family] = {"file": f"{family}.txt", "features": model.features, "dtypes": sorted(model.dtypes),
                            "rows": len(table), "target": "log2(seconds / analytical)" if model.residual
                            else "log2(seconds)", "heldout": held}
    for path in models.glob("*.txt"):
        if path.stem not in families:
            path.unlink()
    manifest = {**ident, "platform": platform.name, "gpu": platform.gpu.name, "families": families}
    store.write_manifest(models, manifest)
    return manifest, True


def _samples(root: str | Path, families: Sequence[str] | None) -> dict[str, dict[str, Sample]]:
    from .kernels.importers import NEUSIGHT_FILES, neusight_gpus, read_neusight

    known = sorted(NEUSIGHT_FILES.values())
    bad = [f for f in families or () if f not in known]
    if bad:
        raise ConfigError(f"unknown family {', '.join(bad)}; NeuSight measured: {', '.join(known)}", key="--families")
    gpus = neusight_gpus(root)
    out: dict[str, dict[str, Sample]] = {}
    for family, table in read_neusight(root, tuple(families) if families else None).items():
        out[family] = {}
        for gpu, t in table.groupby("gpu", sort=True):
            if gpu not in gpus:
                raise ConfigError(f"no device config for {gpu!r}", file=str(root))
            out[family][str(gpu)] = Sample.of(family, t.reset_index(drop=True), gpus[str(gpu)])
    return out


def neusight_heldout(root: str | Path, families: Sequence[str] | None = None, *, seed: int = 0,
                     threads: int = 1) -> pd.DataFrame:
    """Per family and GPU: a model per GPU on 80% of its shapes, errors on the other 20%."""
    rows = []
    for family, by_gpu in _samples(root, families).items():
        for gpu, sample in by_gpu.items():
            rows.append({"family": family, "gpu": gpu, **evaluate(family, sample, seed=seed, threads=threads)})
    return pd.DataFrame(rows)


def neusight_leave_out(root: str | Path, gpu: str = H100, families: Sequence[str] | None = None, *,
                       seed: int = 0, threads: int = 1) -> pd.DataFrame:
    """Per family with data on ``gpu``: one model on all other GPUs, errors on every shape of ``gpu``.

    Empty if no family has measurements of ``gpu``.
    """
    rows = []
    for family, by_gpu in _samples(root, families).items():
        if gpu not in by_gpu:
            continue
        others = Sample.concat([s for g, s in by_gpu.items() if g != gpu])
        model = train(family, others, seed=seed, threads=threads)
        test = by_gpu[gpu]
        meas = pd.Series(test.log_time).rpow(2).to_numpy()
        learned = errors(predict_sample(model, test), meas)
        base = errors(pd.Series(test.log_base).rpow(2).to_numpy(), meas)
        rows.append({"family": family, "gpu": gpu, "n_train": len(others.x), "n_test": learned["n"],
                     "geomean_ape": learned["geomean_ape"], "mape": learned["mape"],
                     "analytical_geomean_ape": base["geomean_ape"], "analytical_mape": base["mape"]})
    return pd.DataFrame(rows)


def format_table(df: pd.DataFrame) -> str:
    """A Markdown table of error rows, percentages with one decimal."""
    cols = [c for c in ("family", "gpu", "n_train", "n_test", "rows", "geomean_ape", "analytical_geomean_ape",
                        "mape", "analytical_mape") if c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = [f"{r[c] * 100:.1f}%" if ("ape" in c and pd.notna(r[c])) else str(r[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.fit", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--platform", help="platform name or YAML path whose microbench/ to fit")
    what.add_argument("--neusight", help="NeuSight's scripts/asplos folder (validation report)")
    ap.add_argument("--force", action="store_true", help="refit even if the models match the data")
    ap.add_argument("--time-column", default="median_s", help="median_s (default), p10_s or p90_s")
    ap.add_argument("--families", help="NeuSight only: comma list of families")
    ap.add_argument("--leave-out", default=H100, help="NeuSight only: the GPU left out of training")
    ap.add_argument("--threads", type=int, default=1, help="NeuSight only: LightGBM threads")
    ap.add_argument("--csv", help="NeuSight only: also write the rows to this CSV")
    args = ap.parse_args(argv)
    try:
        if args.threads < 1:
            raise ConfigError(f"expected --threads >= 1, got {args.threads}", key="--threads")
        if args.platform:
            manifest, refitted = fit_platform(args.platform, force=args.force, time_column=args.time_column)
            rows = [{"family": f, "rows": i["rows"], **i["heldout"]} for f, i in manifest["families"].items()]
            print(f"{manifest['platform']}: {'fitted' if refitted else 'up to date (same data hash)'}; "
                  f"held-out error per family:")
            print(format_table(pd.DataFrame(rows)))
            return 0
        fams = [f.strip() for f in args.families.split(",")] if args.families else None
        held = neusight_heldout(args.neusight, fams, threads=args.threads)
        left = neusight_leave_out(args.neusight, args.leave_out, fams, threads=args.threads)
    except SimgpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("Held-out 20% of shapes per GPU and family (model per GPU):\n" + format_table(held))
    if left.empty:
        print(f"\nNo family of these has measurements of {args.leave_out}: nothing to leave out.")
    else:
        print(f"\n{args.leave_out} left out of training (one model over the other GPUs):\n" + format_table(left))
    if args.csv:
        pd.concat([held.assign(split="heldout"), left.assign(split="leave_out")]).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

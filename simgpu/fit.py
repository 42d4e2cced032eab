"""``python -m simgpu.fit``: fit kernel models of platforms, or validate the method on measurements.

    python -m simgpu.fit --platform dgx_h100            # its kernel_data.yaml (and microbench/) -> models/
    python -m simgpu.fit --all                          # every shipped platform, then the transfer models
    python -m simgpu.fit --transfer                     # models over every measured GPU, for unmeasured ones
    python -m simgpu.fit --gpu-leave-out dgx_h100,dgx_b200 --families gemm,attention_fwd
    python -m simgpu.fit --neusight ../shared/data/kernels/neusight

A platform fit reads its measurements (:mod:`simgpu.kernels.datasets`: the platform's own
``microbench/*.csv`` and the published tables its ``kernel_data.yaml`` names, read from
``../shared/data``), holds out a random 20% per family to report the error (overall and per dtype
and op), refits on everything and writes ``models/<family>.txt.gz`` with ``manifest.json`` (the
sources with their commits, licences and content hashes, the hash of the analytical model, the
features, the kinds of kernel measured, the held-out errors). If the manifest already matches the
data and the method, nothing is refitted (``--force`` refits). ``--gpu-leave-out`` reports, for
each named platform, the error on its shapes of transfer models fitted on the other measured
GPUs. ``--neusight`` reports, per op family and GPU, the held-out error of per-GPU models against
the analytical model's, and the error on a GPU left out of training (``--leave-out``, H100 by
default) of models fitted on the other GPUs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .cli import ArgParser, check_out_file, entry, run_command
from .errors import ConfigError, SimgpuError
from .kernels import datasets, store
from .kernels.learned import (
    ROUNDS,
    ROW_FAMILIES,
    TRANSFER,
    TRANSFER_PARAMS,
    VERSION,
    Sample,
    baseline_hash,
    errors,
    evaluate,
    predict_sample,
    scores,
    train,
)

H100 = "NVIDIA H100 80GB HBM3"


def fit_platform(ref: str, *, force: bool = False, time_column: str = "median_s",
                 seed: int = 0) -> tuple[dict[str, Any], bool]:
    """Fit (or keep) the models of platform ``ref``; returns the manifest and whether it refitted.

    The measurements are the platform's own ``microbench/`` and the published tables its
    ``kernel_data.yaml`` lists (:mod:`simgpu.kernels.datasets`). ``time_column`` is the statistic
    fitted. LightGBM runs on one thread: with more, its sums are taken in another order and the
    model files differ in the last digits, and the same data must give the same files.
    """
    from .config.loader import load_platform

    platform, _ = load_platform(ref)
    folder = store.platform_dir(ref)
    if folder is None:
        raise ConfigError(f"platform {ref!r} has no YAML file", key="--platform")
    if time_column not in store.TIME_COLUMNS[:3]:
        raise ConfigError(f"expected one of {', '.join(store.TIME_COLUMNS[:3])}", key="--time-column")
    models = folder / "models"
    _, prov = datasets.platform_tables(folder, check_only=True)
    # The GPU's figures and the analytical model are part of what a fit depends on: corrections are
    # learned against the analytical model of this GPU, so an edit of either refits.
    ident = {"version": VERSION, "time_column": time_column, "rounds": ROUNDS, "seed": seed,
             "gpu_spec": platform.gpu.model_dump(mode="json"),
             "data_sha256": prov["data_sha256"], "sources_sha256": [x["sha256"] for x in prov["sources"]]}
    old = store.read_manifest(models)
    if (not force and old is not None and all(old.get(k) == v for k, v in ident.items())
            and old.get("baseline_sha256") == baseline_hash(old.get("families", ()))):
        return old, False
    tables, prov = datasets.platform_tables(folder)
    samples = {family: Sample.of(family, table, platform.gpu, time_column) for family, table in tables.items()}
    manifest = write_models(models, samples, seed=seed)
    manifest = {**ident, "baseline_sha256": baseline_hash(manifest["families"]), **prov, "platform": platform.name,
                "gpu": platform.gpu.name, **manifest}
    store.write_manifest(models, manifest)
    return manifest, True


def write_models(models: Path, samples: dict[str, Sample], *, seed: int = 0, transfer: bool = False) -> dict[str, Any]:
    """Hold out 20% of each family's rows for the errors, fit on all, write ``<family>.txt.gz``;
    returns the manifest's ``families`` (files it did not write are removed)."""
    families: dict[str, Any] = {}
    models.mkdir(parents=True, exist_ok=True)
    for family, sample in sorted(samples.items()):
        held = evaluate(family, sample, seed=seed, transfer=transfer) if len(sample.x) >= 10 else {}
        model = train(family, sample, seed=seed, transfer=transfer)
        name = f"{family}.txt.gz"
        store.save_booster(model.booster, models / name)
        families[family] = {"file": name, "features": model.features, "dtypes": sorted(model.dtypes),
                            "kinds": sample.measured_kinds(),
                            **({"measured_m": sample.measured_rows()} if family in ROW_FAMILIES else {}),
                            "rows": len(sample.x), "target": "log2(seconds / analytical)" if model.residual
                            else "log2(seconds)", "heldout": held}
    for path in [*models.glob("*.txt"), *models.glob("*.txt.gz")]:
        if path.name not in {str(f["file"]) for f in families.values()}:
            path.unlink()
    return {"families": families}


def measured_platforms() -> list[str]:
    """The shipped GPU platforms whose models are fitted on published tables (a ``kernel_data.yaml``)."""
    root = store.platforms_root()
    return sorted(p.parent.name for p in root.glob(f"*/{datasets.KERNEL_DATA}")
                  if (root / f"{p.parent.name}.yaml").is_file())


def gpu_samples(platforms: Sequence[str] | None = None) -> dict[str, dict[str, Sample]]:
    """Per family, per measured platform: its published measurements as features on its own GPU."""
    from .config.loader import load_platform

    out: dict[str, dict[str, Sample]] = {}
    for name in platforms or measured_platforms():
        platform, _ = load_platform(name)
        folder = store.platform_dir(name)
        assert folder is not None
        tables, _ = datasets.platform_tables(folder)
        for family, table in tables.items():
            out.setdefault(family, {})[name] = Sample.of(family, table, platform.gpu)
    return out


def fit_transfer(*, seed: int = 0) -> dict[str, Any]:
    """Models over every measured GPU (``platforms/transfer/models``), for GPUs without measurements:
    their features are shapes and the GPU's datasheet figures, so a new GPU is timed from its platform file."""
    names = measured_platforms()
    by_family = gpu_samples(names)
    samples = {f: Sample.concat(list(by_gpu.values())) for f, by_gpu in by_family.items()}
    models = store.platforms_root() / TRANSFER / "models"
    manifest = write_models(models, samples, seed=seed, transfer=True)
    sources = []
    for name in names:
        folder = store.platform_dir(name)
        assert folder is not None
        sources += [{**x, "platform": name} for x in datasets.platform_tables(folder, check_only=True)[1]["sources"]]
    manifest = {"version": VERSION, "rounds": ROUNDS, "seed": seed,
                "baseline_sha256": baseline_hash(manifest["families"]), "params": dict(TRANSFER_PARAMS),
                "data_sha256": None, "platforms": names, "sources": sources, **manifest}
    store.write_manifest(models, manifest)
    return manifest


def gpu_leave_out(gpus: Sequence[str], families: Sequence[str] | None = None, *, seed: int = 0,
                  samples: dict[str, dict[str, Sample]] | None = None) -> pd.DataFrame:
    """Per platform in ``gpus`` and family: transfer models fitted on the other measured GPUs
    (``samples``, default :func:`gpu_samples`), errors on every shape of that GPU: over all its
    rows (label ``all``), per dtype (``bf16``) and per dtype and op (``bf16:decode``)."""
    rows = []
    for family, by_gpu in sorted((samples or gpu_samples()).items()):
        if families is not None and family not in families:
            continue
        for gpu in gpus:
            if gpu not in by_gpu or len(by_gpu) < 2:
                continue
            model = train(family, Sample.concat([s for g, s in by_gpu.items() if g != gpu]), seed=seed, transfer=True)
            test = by_gpu[gpu]
            pred, meas = predict_sample(model, test), np.exp2(test.log_time)
            dtype = np.array([str(lab).partition(":")[0] for lab in test.labels])
            groups = {"all": np.ones(len(meas), dtype=bool), **{d: dtype == d for d in sorted(set(dtype))}}
            groups.update({str(lab): test.labels == lab for lab in sorted(set(test.labels)) if lab not in groups})
            for label, mask in groups.items():
                sc = scores(pred[mask], meas[mask], test.take(mask), model.residual)
                sc.pop("by", None)
                rows.append({"family": family, "gpu": gpu, "label": label, **sc})
    return pd.DataFrame(rows)


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
    cols = [c for c in ("family", "gpu", "label", "n_train", "n_test", "rows", "geomean_ape", "analytical_geomean_ape",
                        "mape", "analytical_mape") if c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = [("–" if pd.isna(r[c]) else f"{r[c] * 100:.1f}%") if "ape" in c
                 else ("–" if pd.isna(r[c]) else f"{int(r[c])}") if c in ("n_train", "n_test", "rows")
                 else str(r[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heldout_rows(manifest: dict[str, Any]) -> pd.DataFrame:
    """One row per family and per ``dtype:op`` group of a manifest's held-out errors."""
    rows = []
    for f, info in manifest["families"].items():
        held = dict(info["heldout"])
        by = held.pop("by", {})
        rows.append({"family": f, "label": "all", "rows": info["rows"], **held})
        rows += [{"family": f, "label": lab, **g} for lab, g in by.items()]
    return pd.DataFrame(rows)


def fittable_platforms() -> list[str]:
    """Every shipped platform with measurements of its own (``microbench/`` or ``kernel_data.yaml``)."""
    root = store.platforms_root()
    return sorted({p.parent.name for p in [*root.glob("*/microbench"), *root.glob(f"*/{datasets.KERNEL_DATA}")]
                   if (root / f"{p.parent.name}.yaml").is_file()})


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.fit", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--platform", help="platform name or YAML path whose measurements to fit")
    what.add_argument("--all", action="store_true",
                      help="fit every shipped platform with measurements, then the transfer models")
    what.add_argument("--transfer", action="store_true",
                      help="fit the models across every measured GPU (for GPUs without measurements)")
    what.add_argument("--gpu-leave-out", metavar="PLATFORMS",
                      help="comma list of measured platforms: each left out of a transfer fit in turn, errors on it")
    what.add_argument("--neusight", help="NeuSight's scripts/asplos folder (validation report)")
    ap.add_argument("--force", action="store_true", help="refit even if the models match the data")
    ap.add_argument("--time-column", default="median_s", help="median_s (default), p10_s or p90_s")
    ap.add_argument("--families", help="NeuSight and --gpu-leave-out: comma list of families")
    ap.add_argument("--leave-out", default=H100, help="NeuSight only: the GPU left out of training")
    ap.add_argument("--threads", type=int, default=1, help="NeuSight only: LightGBM threads")
    ap.add_argument("--csv", help="NeuSight and --gpu-leave-out: also write the rows to this CSV")
    args = ap.parse_args(argv)
    fams = [f.strip() for f in args.families.split(",")] if args.families else None
    try:
        if args.threads < 1:
            raise ConfigError(f"expected --threads >= 1, got {args.threads}", key="--threads")
        if args.csv:
            check_out_file(args.csv, "--csv")
        if args.platform or args.all:
            for name in [args.platform] if args.platform else fittable_platforms():
                manifest, refitted = fit_platform(name, force=args.force, time_column=args.time_column)
                print(f"{manifest['platform']}: {'fitted' if refitted else 'up to date (same data hash)'}; "
                      f"held-out error per family:")
                print(format_table(heldout_rows(manifest)), flush=True)
            if not args.all:
                return 0
        if args.transfer or args.all:
            manifest = fit_transfer()
            print(f"transfer models over {', '.join(manifest['platforms'])}; held-out error per family:")
            print(format_table(heldout_rows(manifest)))
            return 0
        if args.gpu_leave_out:
            gpus = [g.strip() for g in args.gpu_leave_out.split(",")]
            known = measured_platforms()
            bad = [g for g in gpus if g not in known]
            if bad:
                raise ConfigError(f"not a measured platform: {', '.join(bad)}; expected one of: {', '.join(known)}",
                                  key="--gpu-leave-out")
            left = gpu_leave_out(gpus, fams)
            print("Each GPU left out of training (one model over the other measured GPUs):\n" + format_table(left))
            if args.csv:
                left.to_csv(args.csv, index=False)
            return 0
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
    entry(main)

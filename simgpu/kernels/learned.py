"""The learned kernel model: one LightGBM regressor per op family, fitted on microbenchmarks.

A family's model predicts ``log2`` of the kernel time divided by the analytical model's time of the
same kernel on the same GPU (a correction, which stays right where measurements are few and lets
GPU datasheet figures carry over to GPUs not measured); families the analytical model has no
formula for (``memcpy``) learn ``log2`` seconds directly. Features: :mod:`simgpu.kernels.features`.
The L1 objective fits the conditional median, robust to the odd throttled or contended
measurement. The registered predictor ``learned`` (reported as ``lightgbm``) times the families
its platform has fitted models for (``platforms/<name>/models/``, written by ``python -m simgpu.fit``)
and nothing else, so in the default chain every other kernel falls through to the analytical model.
Times are in seconds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from ..config.platform import GPUSpec, PlatformSpec
from ..errors import ConfigError
from ..workload.graph import KernelSpec
from . import analytical, store
from .base import register
from .features import NO_BASELINE, analytical_for, feature_frame, kernels_from_table

#: Bumped whenever features or training change, so that models fitted before are refitted.
VERSION: Final = 2  # 2: elementwise flops_per_element
ROUNDS: Final = 400
LEAVES: Final = 7  # small trees: as accurate here as 31 leaves, and a quarter of the file size
HOLDOUT: Final = 0.2
_APE_FLOOR: Final = 1e-4  # an exact hit counts as 0.01% so that the geomean stays finite


def baseline_hash() -> str:
    """SHA-256 of the analytical model's source: corrections learned against one version of it are
    wrong against another, so a changed analytical model makes the fitted models stale."""
    return hashlib.sha256(Path(analytical.__file__).read_bytes().replace(b"\r\n", b"\n")).hexdigest()


def lgb_params(rows: int, seed: int = 0, threads: int = 1) -> dict[str, Any]:
    """LightGBM settings; leaves may be small where a family has few measurements."""
    return {"objective": "l1", "learning_rate": 0.1, "num_leaves": LEAVES,
            "min_data_in_leaf": int(np.clip(rows // 100, 3, 20)), "min_data_in_bin": 1,
            "num_threads": threads, "deterministic": True, "force_col_wise": True, "seed": seed,
            "verbose": -1}


def errors(pred_s: np.ndarray, meas_s: np.ndarray) -> dict[str, float]:
    """Geomean and mean absolute percentage error (fractions) of predictions against measurements."""
    ape = np.abs(np.asarray(pred_s) / np.asarray(meas_s) - 1.0)
    if ape.size == 0:
        return {"geomean_ape": float("nan"), "mape": float("nan"), "n": 0}
    return {"geomean_ape": float(np.exp(np.mean(np.log(np.maximum(ape, _APE_FLOOR))))),
            "mape": float(ape.mean()), "n": int(ape.size)}


@dataclass
class FamilyModel:
    """One family's booster, its feature columns, and whether it predicts a correction."""

    family: str
    booster: Any  # lightgbm.Booster
    features: list[str]
    dtypes: frozenset[str]

    @property
    def residual(self) -> bool:
        return self.family not in NO_BASELINE

    def predict(self, kernels: Sequence[KernelSpec], gpu: GPUSpec) -> np.ndarray:
        """Seconds per kernel (all of this model's family) on ``gpu``."""
        base = analytical_for(gpu).predict(kernels)[0] if self.residual else None
        x = feature_frame(self.family, kernels, gpu, base)[self.features]
        y = np.exp2(self.booster.predict(x))
        return y * base if base is not None else y


@dataclass(frozen=True)
class Sample:
    """Measurements of one family on one GPU as features, targets and baseline."""

    x: pd.DataFrame
    log_time: np.ndarray       # log2 seconds measured
    log_base: np.ndarray       # log2 seconds of the analytical model (zeros where there is none)
    dtypes: frozenset[str]

    @staticmethod
    def of(family: str, table: pd.DataFrame, gpu: GPUSpec, time_column: str = "median_s") -> Sample:
        kernels = kernels_from_table(family, table)
        base = None if family in NO_BASELINE else analytical_for(gpu).predict(kernels)[0]
        x = feature_frame(family, kernels, gpu, base)
        log_base = np.log2(base) if base is not None else np.zeros(len(kernels))
        return Sample(x, np.log2(table[time_column].to_numpy(dtype=float)), log_base,
                      frozenset(table["dtype"].astype(str)))

    def take(self, mask: np.ndarray) -> Sample:
        return Sample(self.x[mask].reset_index(drop=True), self.log_time[mask], self.log_base[mask], self.dtypes)

    @staticmethod
    def concat(samples: Sequence[Sample]) -> Sample:
        return Sample(pd.concat([s.x for s in samples], ignore_index=True),
                      np.concatenate([s.log_time for s in samples]), np.concatenate([s.log_base for s in samples]),
                      frozenset().union(*(s.dtypes for s in samples)))


def train(family: str, sample: Sample, *, rounds: int = ROUNDS, seed: int = 0, threads: int = 1) -> FamilyModel:
    """Fit ``family``'s model on ``sample``."""
    import lightgbm as lgb

    if len(sample.x) < 2:
        raise ConfigError(f"{family}: {len(sample.x)} measurement(s) are too few to fit a model")
    features = list(sample.x.columns)
    data = lgb.Dataset(sample.x, sample.log_time - sample.log_base, free_raw_data=True)
    booster = lgb.train(lgb_params(len(sample.x), seed, threads), data, num_boost_round=rounds)
    return FamilyModel(family, booster, features, sample.dtypes)


def predict_sample(model: FamilyModel, sample: Sample) -> np.ndarray:
    """Seconds per row of ``sample`` (features already computed)."""
    return np.exp2(model.booster.predict(sample.x[model.features]) + sample.log_base)


def holdout_mask(n: int, seed: int = 0, share: float = HOLDOUT) -> np.ndarray:
    """A random ``share`` of ``n`` rows (fixed by ``seed``), held out of training."""
    return np.random.default_rng(seed).random(n) < share


def evaluate(family: str, sample: Sample, *, seed: int = 0, rounds: int = ROUNDS,
             threads: int = 1) -> dict[str, float]:
    """Train on 80% of ``sample``, test on the held-out 20%: learned and analytical errors."""
    test = holdout_mask(len(sample.x), seed)
    if test.sum() == 0 or (~test).sum() < 2:
        raise ConfigError(f"{family}: {len(sample.x)} measurement(s) are too few to hold some out")
    model = train(family, sample.take(~test), rounds=rounds, seed=seed, threads=threads)
    held = sample.take(test)
    meas = np.exp2(held.log_time)
    learned = errors(predict_sample(model, held), meas)
    out = {"n_train": int((~test).sum()), "n_test": learned["n"],
           "geomean_ape": learned["geomean_ape"], "mape": learned["mape"]}
    if model.residual:
        base = errors(np.exp2(held.log_base), meas)
        out.update(analytical_geomean_ape=base["geomean_ape"], analytical_mape=base["mape"])
    return out


class Learned:
    """The predictor over a platform's fitted family models; see the module docstring."""

    name = "lightgbm"

    def __init__(self, gpu: GPUSpec, models: Mapping[str, FamilyModel]) -> None:
        self.gpu = gpu
        self.models = dict(models)

    def supports(self, kernel: KernelSpec) -> bool:
        m = self.models.get(kernel.family)
        return m is not None and kernel.dtype in m.dtypes

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]:
        out = np.empty(len(kernels))
        by_family: dict[str, list[int]] = {}
        for i, k in enumerate(kernels):
            if not self.supports(k):
                raise ValueError(f"no learned model for {k.family} kernels in {k.dtype} on {self.gpu.name}")
            by_family.setdefault(k.family, []).append(i)
        for family, idx in by_family.items():
            out[idx] = self.models[family].predict([kernels[i] for i in idx], self.gpu)
        return out, [self.name] * len(kernels)


def load_models(folder: Path) -> dict[str, FamilyModel]:
    """The models in ``folder/models`` if they were fitted on the data now in ``folder/microbench``.

    No manifest: no models. A manifest whose content hash differs from the data's (or from the
    analytical model's source, or whose method version differs): an error that says to refit,
    rather than predictions from models of other measurements.
    """
    models_dir, data_dir = folder / "models", folder / "microbench"
    manifest = store.read_manifest(models_dir)
    if manifest is None:
        return {}
    import lightgbm as lgb

    families = tuple(manifest["families"])
    stale = [what for what, ok in (
        ("measurements", manifest.get("data_sha256") == store.data_hash(data_dir, families)),
        ("analytical model", manifest.get("baseline_sha256") == baseline_hash()),
        ("fitting method", manifest.get("version") == VERSION)) if not ok]
    if stale:
        raise ConfigError(f"the kernel models were fitted with other {' and '.join(stale)}; "
                          f"run `python -m simgpu.fit --platform {folder.name}`", file=str(models_dir / store.MANIFEST))
    out = {}
    for family, info in manifest["families"].items():
        path = models_dir / str(info["file"])
        if not path.is_file():
            raise ConfigError("model file missing; refit with `python -m simgpu.fit`", file=str(path))
        booster = lgb.Booster(model_file=str(path))
        out[family] = FamilyModel(family, booster, list(info["features"]), frozenset(info["dtypes"]))
    return out


@register("learned")
def _factory(platform: PlatformSpec) -> Learned:
    folder = store.platform_dir(platform.name)
    return Learned(platform.gpu, load_models(folder) if folder is not None else {})

"""The learned kernel model: one LightGBM regressor per op family, fitted on microbenchmarks.

A family's model predicts ``log2`` of the kernel time divided by the analytical model's time of the
same kernel on the same GPU (a correction, which stays right where measurements are few and lets
GPU datasheet figures carry over to GPUs not measured); families the analytical model has no
formula for (``memcpy``) learn ``log2`` seconds directly. Features: :mod:`simgpu.kernels.features`.
The L1 objective fits the conditional median, robust to the odd throttled or contended
measurement. The registered predictor ``learned`` (reported as ``lightgbm``) times the families
its platform has fitted models for (``platforms/<name>/models/``, written by ``python -m simgpu.fit``,
or those of the platform ``gpu.kernel_models`` names), kernels that :mod:`simgpu.kernels.rules` maps
onto those (``lightgbm (rule)``), and, on a GPU, what its own models lack by the models fitted across
every measured GPU (``platforms/transfer/models/``, ``lightgbm-transfer``; all of it on a GPU without
measurements). In the default chain every other kernel falls through to the analytical model.
Times are in seconds.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from ..config.platform import GPUSpec, PlatformSpec
from ..errors import ConfigError
from ..graph import KernelSpec
from . import analytical, embedding, rules, store
from .base import Chain, register
from .datasets import KERNEL_DATA, stale_sources
from .features import NO_BASELINE, analytical_for, feature_frame, feature_matrix, kernels_from_table

#: Bumped whenever features or training change, so that models fitted before are refitted.
VERSION: Final = 5  # 2: elementwise flops_per_element; 3: attention GQA/window/KV width, larger trees on
# large tables, the kinds of kernel published tables measured; 4: GEMM/BMM/MoE operand widths (act_bytes,
# weight_bytes: block-scaled and 4-bit dtypes), the serving families; 5: MoE group_tokens (the tokens the
# whole expert-parallel group routes)
ROUNDS: Final = 400
LEAVES: Final = 7  # small trees: as accurate as 31 leaves on a few thousand rows, a quarter of the file size
#: Tables of at least this many rows get :data:`LARGE_LEAVES` leaves: on the published GPU tables
#: (10^4-10^5 shapes) 63-leaf trees halve the held-out error of 7-leaf ones (decode attention 9.2% -> 3.6%).
LARGE_TABLE: Final = 5000
LARGE_LEAVES: Final = 63
HOLDOUT: Final = 0.2
_APE_FLOOR: Final = 1e-4  # an exact hit counts as 0.01% so that the geomean stays finite


def baseline_hash(families: Iterable[str] = ()) -> str:
    """SHA-256 of the analytical model's code that models of ``families`` are corrections of: its
    module, and the embedding-lookup formula (:mod:`simgpu.kernels.embedding`) where an embedding
    family is among them. Corrections learned against one version of it are wrong against another,
    so a changed analytical model makes the fitted models stale. The code is hashed as its syntax
    tree without docstrings and import statements, so that rewording a docstring or moving a module
    it imports from leaves the fitted models valid."""
    return _baseline_hash(any(f.startswith("embedding") for f in families))


@functools.cache
def _baseline_hash(lookups: bool) -> str:
    modules = (analytical, embedding) if lookups else (analytical,)
    return hashlib.sha256("".join(_code_dump(Path(str(m.__file__))) for m in modules).encode()).hexdigest()


def _code_dump(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        body[:] = [n for n in body if not isinstance(n, ast.Import | ast.ImportFrom)
                   and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                            and isinstance(n.value.value, str))]
    return ast.dump(tree)


def lgb_params(rows: int, seed: int = 0, threads: int = 1) -> dict[str, Any]:
    """LightGBM settings; leaves may be small where a family has few measurements."""
    return {"objective": "l1", "learning_rate": 0.1, "num_leaves": LARGE_LEAVES if rows >= LARGE_TABLE else LEAVES,
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
    #: per dtype, the kinds of kernel (:func:`~simgpu.kernels.rules.kind`) the data measured; None:
    #: every kind (a platform's own harness measures what its runs need)
    kinds: Mapping[str, frozenset[str]] | None = None
    #: per dtype, the row counts (``m``) a GEMM family was measured at, ascending; None: not recorded
    measured_m: Mapping[str, np.ndarray] | None = None

    def takes(self, kernel: KernelSpec) -> bool:
        """Whether this model times ``kernel`` itself (its dtype and kind were measured)."""
        if kernel.dtype not in self.dtypes:
            return False
        return self.kinds is None or rules.kind(kernel) in self.kinds.get(kernel.dtype, frozenset())

    @property
    def residual(self) -> bool:
        return self.family not in NO_BASELINE

    def predict(self, kernels: Sequence[KernelSpec], gpu: GPUSpec) -> np.ndarray:
        """Seconds per kernel (all of this model's family) on ``gpu``.

        A GEMM whose row count lies between two measured ones more than :data:`ROW_GAP` apart is
        timed by linear interpolation between its neighbours' predictions: the trees have seen no
        row count in between, and what they give there follows no measurement (the H100's fp8 GEMMs
        of 1,568-2,016 rows came out at 87-95% of the dense peak, faster than 1,536 rows)."""
        between = _between(self.measured_m, kernels) if self.measured_m is not None else None
        if between is None:
            return self._predict(kernels, gpu)
        idx, lo, hi, w = between
        extra = [replace_m(kernels[i], m) for ms in (lo, hi) for i, m in zip(idx, ms, strict=True)]
        t = self._predict([*kernels, *extra], gpu)
        n, j = len(kernels), len(idx)
        out = t[:n].copy()
        out[idx] = t[n:n + j] * (1 - w) + t[n + j:] * w
        return out

    def _predict(self, kernels: Sequence[KernelSpec], gpu: GPUSpec) -> np.ndarray:
        base = analytical_for(gpu).predict(kernels)[0] if self.residual else None
        x = feature_matrix(self.family, kernels, gpu, base, self.features)
        # one thread: an OpenMP pool started here would deadlock the processes a what-if study forks
        y = np.exp2(self.booster.predict(x, num_threads=1))
        return y * base if base is not None else y


#: Measured row counts further apart than this (a quarter of a 128-row tile) are interpolated between.
ROW_GAP: Final = 32
#: The families whose row count ``m`` is interpolated between measured ones.
ROW_FAMILIES: Final = ("gemm", "bmm")


def replace_m(kernel: KernelSpec, m: float) -> KernelSpec:
    """``kernel`` with ``m`` rows."""
    return KernelSpec.make(kernel.family, kernel.dtype, **{**dict(kernel.params), "m": m})


def _between(rows: Mapping[str, np.ndarray], kernels: Sequence[KernelSpec]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The kernels whose ``m`` lies strictly between measured row counts more than
    :data:`ROW_GAP` apart: their indices, the row counts below and above, and the weight of the one
    above; None where there are none."""
    idx: list[int] = []
    lo: list[float] = []
    hi: list[float] = []
    for i, k in enumerate(kernels):
        grid = rows.get(k.dtype)
        m = k.get("m")
        if grid is None or m is None or len(grid) < 2:
            continue
        j = int(np.searchsorted(grid, m))
        if j == 0 or j == len(grid) or grid[j] == m:
            continue  # measured, or outside the measured range (the analytical baseline's to carry)
        a, b = float(grid[j - 1]), float(grid[j])
        if b - a > ROW_GAP:
            idx.append(i)
            lo.append(a)
            hi.append(b)
    if not idx:
        return None
    la, hb = np.array(lo), np.array(hi)
    ms = np.array([kernels[i].get("m") for i in idx], dtype=float)
    return np.array(idx), la, hb, (ms - la) / (hb - la)


@dataclass(frozen=True)
class Sample:
    """Measurements of one family on one GPU as features, targets and baseline."""

    x: pd.DataFrame
    log_time: np.ndarray       # log2 seconds measured
    log_base: np.ndarray       # log2 seconds of the analytical model (zeros where there is none)
    dtypes: frozenset[str]
    labels: np.ndarray         # "dtype:op" per row, the groups held-out errors are reported by
    kinds: np.ndarray          # "dtype:kind" per row of a published table, "" for a platform's own harness

    @staticmethod
    def of(family: str, table: pd.DataFrame, gpu: GPUSpec, time_column: str = "median_s") -> Sample:
        kernels = kernels_from_table(family, table)
        base = None if family in NO_BASELINE else analytical_for(gpu).predict(kernels)[0]
        x = feature_frame(family, kernels, gpu, base)
        log_base = np.log2(base) if base is not None else np.zeros(len(kernels))
        dt = table["dtype"].astype(str)
        labels = (dt + ":" + table["op"].astype(str) if "op" in table.columns else dt).to_numpy()
        own = (table["source"] == "microbench").to_numpy() if "source" in table.columns else np.zeros(len(table), bool)
        kinds = np.array(["" if o else f"{k.dtype}:{rules.kind(k)}" for k, o in zip(kernels, own, strict=True)],
                         dtype=object)
        return Sample(x, np.log2(table[time_column].to_numpy(dtype=float)), log_base, frozenset(dt), labels, kinds)

    def measured_kinds(self) -> dict[str, list[str]] | None:
        """Per dtype, the kinds of kernel measured; None where a platform's own harness measured any row."""
        if (self.kinds == "").any():
            return None
        out: dict[str, set[str]] = {}
        for dk in self.kinds:
            dt, _, kd = str(dk).partition(":")
            out.setdefault(dt, set()).add(kd)
        return {dt: sorted(v) for dt, v in sorted(out.items())}

    def measured_rows(self) -> dict[str, list[int]] | None:
        """Per dtype, the row counts (``m``) measured, ascending; None for a family without rows."""
        if "log_m" not in self.x.columns:
            return None
        m = np.rint(np.exp2(self.x["log_m"].to_numpy()) - 1.0).astype(np.int64)
        dt = np.array([str(lb).partition(":")[0] for lb in self.labels])
        return {str(d): sorted({int(v) for v in m[dt == d]}) for d in sorted(set(dt))}

    def take(self, mask: np.ndarray) -> Sample:
        return Sample(self.x[mask].reset_index(drop=True), self.log_time[mask], self.log_base[mask], self.dtypes,
                      self.labels[mask], self.kinds[mask])

    @staticmethod
    def concat(samples: Sequence[Sample]) -> Sample:
        return Sample(pd.concat([s.x for s in samples], ignore_index=True),
                      np.concatenate([s.log_time for s in samples]), np.concatenate([s.log_base for s in samples]),
                      frozenset().union(*(s.dtypes for s in samples)), np.concatenate([s.labels for s in samples]),
                      np.concatenate([s.kinds for s in samples]))


#: LightGBM settings of the models fitted across GPUs for a GPU none of them is: extremely randomised
#: split thresholds (``extra_trees``) generalise to the GPU left out better than the best splits,
#: which fit each measured GPU's quirks (B200 left out: bf16 attention 15.0% -> 11.5%, GEMM 10.9% ->
#: 8.7%), and cost accuracy on the GPUs measured (H100 held-out attention 1.8% -> 4.9%), so the
#: per-GPU models keep the best splits.
TRANSFER_PARAMS: Final = {"extra_trees": True}


def train(family: str, sample: Sample, *, rounds: int = ROUNDS, seed: int = 0, threads: int = 1,
          transfer: bool = False) -> FamilyModel:
    """Fit ``family``'s model on ``sample``; ``transfer``: with :data:`TRANSFER_PARAMS`."""
    import lightgbm as lgb

    if len(sample.x) < 2:
        raise ConfigError(f"{family}: {len(sample.x)} measurement(s) are too few to fit a model")
    features = list(sample.x.columns)
    data = lgb.Dataset(sample.x, sample.log_time - sample.log_base, free_raw_data=True)
    params = {**lgb_params(len(sample.x), seed, threads), **(TRANSFER_PARAMS if transfer else {})}
    booster = lgb.train(params, data, num_boost_round=rounds)
    kinds = sample.measured_kinds()
    return FamilyModel(family, booster, features, sample.dtypes,
                       None if kinds is None else {d: frozenset(v) for d, v in kinds.items()})


def predict_sample(model: FamilyModel, sample: Sample) -> np.ndarray:
    """Seconds per row of ``sample`` (features already computed)."""
    return np.exp2(model.booster.predict(sample.x[model.features], num_threads=1) + sample.log_base)


def holdout_mask(n: int, seed: int = 0, share: float = HOLDOUT) -> np.ndarray:
    """A random ``share`` of ``n`` rows (fixed by ``seed``), held out of training."""
    return np.random.default_rng(seed).random(n) < share


def evaluate(family: str, sample: Sample, *, seed: int = 0, rounds: int = ROUNDS,
             threads: int = 1, transfer: bool = False) -> dict[str, Any]:
    """Train on 80% of ``sample``, test on the held-out 20%: learned and analytical errors."""
    test = holdout_mask(len(sample.x), seed)
    if test.sum() == 0 or (~test).sum() < 2:
        raise ConfigError(f"{family}: {len(sample.x)} measurement(s) are too few to hold some out")
    model = train(family, sample.take(~test), rounds=rounds, seed=seed, threads=threads, transfer=transfer)
    held = sample.take(test)
    meas = np.exp2(held.log_time)
    pred = predict_sample(model, held)
    return {"n_train": int((~test).sum()), **scores(pred, meas, held, model.residual)}


def scores(pred: np.ndarray, meas: np.ndarray, held: Sample, residual: bool = True) -> dict[str, Any]:
    """Errors of ``pred`` against ``meas`` over all rows of ``held`` and per label (``by``), with the
    analytical model's beside them where the model is a correction of it."""
    def one(mask: np.ndarray) -> dict[str, float]:
        learned = errors(pred[mask], meas[mask])
        out = {"n_test": learned["n"], "geomean_ape": learned["geomean_ape"], "mape": learned["mape"]}
        if residual:
            base = errors(np.exp2(held.log_base[mask]), meas[mask])
            out.update(analytical_geomean_ape=base["geomean_ape"], analytical_mape=base["mape"])
        return out

    out: dict[str, Any] = one(np.ones(len(meas), dtype=bool))
    labels = np.unique(held.labels)
    if len(labels) > 1:
        out["by"] = {str(lab): one(held.labels == lab) for lab in labels}
    return out


class Learned:
    """The predictor over a platform's fitted family models; see the module docstring.

    A kernel of a family and dtype with a model of its own is timed by it; one that a rule of
    :mod:`simgpu.kernels.rules` maps onto such a kernel (a backward attention from the forward, a
    batched GEMM from the GEMM of its tiles, an optimizer step from the elementwise kernel that moves
    its bytes, bf16 from fp16 measurements) is timed through the rule and reported as ``<name>
    (rule)``; any other kernel is not supported and falls through to the next model of the chain.
    """

    def __init__(self, gpu: GPUSpec, models: Mapping[str, FamilyModel], name: str = "lightgbm") -> None:
        self.gpu = gpu
        self.models = dict(models)
        self.name = name

    def direct(self, kernel: KernelSpec) -> bool:
        m = self.models.get(kernel.family)
        return m is not None and m.takes(kernel)

    def supports(self, kernel: KernelSpec) -> bool:
        return self.direct(kernel) or rules.derive(kernel, self.direct) is not None

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]:
        out = np.empty(len(kernels))
        names = [self.name] * len(kernels)
        # each kernel becomes the kernel a model times and the rules' steps to it
        targets: list[KernelSpec] = []
        chains: list[list[rules.Step]] = []
        for i, k in enumerate(kernels):
            if self.direct(k):
                targets.append(k)
                chains.append([])
                continue
            steps = rules.derive(k, self.direct)
            if steps is None:
                raise ValueError(f"no learned model for {k.family} kernels in {k.dtype} on {self.gpu.name}")
            targets.append(steps[-1][1])
            chains.append(steps)
            names[i] = f"{self.name} (rule)"
        by_family: dict[str, list[int]] = {}
        for i, k in enumerate(targets):
            by_family.setdefault(k.family, []).append(i)
        for family, idx in by_family.items():
            out[idx] = self.models[family].predict([targets[i] for i in idx], self.gpu)
        # roofline-ratio factors: the analytical times of every kernel a step names, in one call
        ends = sorted({k for steps in chains for a, b, f in steps if f == rules.ROOFLINE for k in (a, b)}, key=repr)
        roof = dict(zip(ends, analytical_for(self.gpu).predict(ends)[0], strict=True)) if ends else {}
        scale = np.array([float(np.prod([f if isinstance(f, float) else roof[a] / roof[b] for a, b, f in steps]))
                          for steps in chains])
        return out * scale, names


class _LazyBooster:
    """A model file read on first use, so that a run parses only the models its kernels need."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._booster: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._booster is None:
            self._booster = store.load_booster(self.path)
        return getattr(self._booster, name)


#: Model files by path and modification time: a process reads each at most once.
_BOOSTERS: dict[tuple[str, int], _LazyBooster] = {}
#: The published sources found changed, by models folder and the manifest's record of them: a
#: process checks the shared data once (a whatif worker simulates many variants with the same models).
_SOURCES_STALE: dict[tuple[str, str], list[str]] = {}


def load_models(folder: Path) -> dict[str, FamilyModel]:
    """The models in ``folder/models`` if they were fitted on the data they name.

    No manifest: no models. A manifest whose hash of the platform's own ``microbench/`` differs
    from the data's, or whose published sources are in the shared folder with other contents
    (:func:`~simgpu.kernels.datasets.stale_sources`; absent sources are trusted), or whose
    analytical model or method version differs: an error that says to refit, rather than
    predictions from models of other measurements. Each model file is read, and the shared sources a
    manifest names are checked, once per process.
    """
    models_dir = folder / "models"
    manifest = store.read_manifest(models_dir)
    if manifest is None:
        return {}
    families = tuple(manifest["families"])
    own = manifest.get("data_sha256")
    stale = [what for what, ok in (
        ("measurements", own is None or own == store.data_hash(folder / "microbench", families)),
        ("analytical model", manifest.get("baseline_sha256") == baseline_hash(families)),
        ("fitting method", manifest.get("version") == VERSION)) if not ok]
    memo = (str(models_dir.resolve()), json.dumps(manifest.get("sources"), sort_keys=True, default=str))
    if memo not in _SOURCES_STALE:
        _SOURCES_STALE[memo] = stale_sources(manifest)
    stale += [f"data of {s}" for s in _SOURCES_STALE[memo]]
    if stale:
        raise ConfigError(f"the kernel models were fitted with other {' and '.join(stale)}; "
                          f"run `python -m simgpu.fit --platform {folder.name}`", file=str(models_dir / store.MANIFEST))
    out = {}
    for family, info in manifest["families"].items():
        path = models_dir / str(info["file"])
        if not path.is_file():
            raise ConfigError("model file missing; refit with `python -m simgpu.fit`", file=str(path))
        key = (str(path.resolve()), path.stat().st_mtime_ns)
        if key not in _BOOSTERS:
            _BOOSTERS[key] = _LazyBooster(path)
        kinds = info.get("kinds")
        rows = info.get("measured_m") if family in ROW_FAMILIES else None
        out[family] = FamilyModel(family, _BOOSTERS[key], list(info["features"]), frozenset(info["dtypes"]),
                                  None if kinds is None else {d: frozenset(v) for d, v in kinds.items()},
                                  None if rows is None else {d: np.array(v, dtype=float) for d, v in rows.items()})
    return out


#: Where the models fitted across every measured GPU lie (``python -m simgpu.fit --transfer``): they
#: time a GPU that has no measurements of its own from its datasheet figures.
TRANSFER: Final = "transfer"


def models_folder(platform: PlatformSpec) -> Path | None:
    """The platform folder whose models time ``platform``'s GPU: the platform's own where it has fitted
    models (``models/manifest.json``), else ``gpu.kernel_models`` if set, else the platform's own."""
    own = store.platform_dir(platform.name)
    if own is not None and (own / "models" / store.MANIFEST).is_file():
        return own
    ref = platform.gpu.kernel_models or platform.name
    folder = store.platform_dir(ref)
    if folder is None and platform.gpu.kernel_models:
        raise ConfigError(f"no platform {ref!r} to take kernel models from", key="gpu.kernel_models")
    return folder


@register("learned")
def _factory(platform: PlatformSpec) -> Learned | Chain:
    """The GPU's own models (``lightgbm``), then the models fitted across measured GPUs
    (``lightgbm-transfer``) for what the own ones do not time; a platform with measurements of
    another kind of device (``cpu_host``) has its own models only."""
    folder = models_folder(platform)
    models = load_models(folder) if folder is not None else {}
    transfer = Learned(platform.gpu, load_models(store.platforms_root() / TRANSFER), name="lightgbm-transfer")
    if not models:
        return transfer
    own = Learned(platform.gpu, models)
    if folder is not None and not (folder / KERNEL_DATA).is_file():
        return own  # measured with the harness on its own device only: no GPU to transfer from
    return Chain([own, transfer])

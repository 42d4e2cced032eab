"""Where a prediction's spread comes from: the sigma of the log error of each source, per platform.

A source is a kernel family, a fabric (``nvlink``, ``pcie``, ``network``) or the host. Its spread is
the standard deviation ``sigma`` of ``ln(predicted / true)`` for one of its predictions, read from
what the project measured:

- kernels: the held-out error the fitter records per family in ``platforms/<p>/models/manifest.json``
  (``heldout.geomean_ape``: the geometric mean of ``|pred / meas - 1|`` on the 20% of the measured
  shapes kept out of the fit). Taking the log error as normal with mean 0, ``|e|`` is half-normal
  and its geometric mean is ``sigma * exp(-(gamma + ln 2) / 2) = 0.530 * sigma``, so
  ``sigma = geomean_ape / 0.530`` (:data:`SIGMA_PER_GEOMEAN`). A kernel timed by a rule from a
  measured one (``lightgbm (rule)``) takes its family's figure widened by :data:`RULE_WIDEN`; one
  timed by the transfer models (``lightgbm-transfer``) takes the transfer manifest's figure, widened
  by :data:`TRANSFER_WIDEN` where the GPU is not among the GPUs those models were fitted on; one
  timed by the analytical model takes the manifest's ``analytical_geomean_ape`` of its family (the
  roofline's own held-out error), else :data:`DEFAULT_SIGMA`.
- collectives: the residuals of the nccl-tests validation (:mod:`simgpu.validate.collectives`), per
  fabric and size (:data:`FABRIC_SIGMA`; ``python -m simgpu.validate.coverage --fabrics`` recomputes
  them).
- host: the per-op host time is one calibrated figure (:data:`HOST_SIGMA`).

Each kind of source carries one calibration scale (:data:`SCALES`), fitted so that the 80% interval
covers 70-90% of measured values on the sets the project has (``docs/uncertainty.md``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ..config.platform import PlatformSpec
from ..kernels import store
from ..kernels.learned import TRANSFER, models_folder

#: ``sigma`` of a normal log error per unit of the geometric mean of its absolute value:
#: ``1 / exp(-(euler_gamma + ln 2) / 2)``.
SIGMA_PER_GEOMEAN: Final = 1.0 / math.exp(-(0.5772156649015329 + math.log(2.0)) / 2.0)
#: A kernel timed through a rule (a backward from its forward, bf16 from fp16): its family's spread times this.
RULE_WIDEN: Final = 2.0
#: A kernel timed by the transfer models on a GPU they were not fitted on: their held-out spread times this.
TRANSFER_WIDEN: Final = 2.0
#: The spread of a kernel no held-out figure speaks for (a family with no model and no roofline figure).
DEFAULT_SIGMA: Final = 0.3
#: Per fabric, the spread of a collective's time for messages of at least 1 MiB (scales the fabric's
#: bandwidth) and below (scales its latency): ``q80(|ln(pred / meas)|) / 1.2816`` over the nccl-tests
#: validation points of that fabric (``python -m simgpu.validate.coverage --fabrics``; one_node sweeps
#: are NVLink, pcie sweeps PCIe, two-node, pairwise and ten-node sweeps the network). NVLink below 1 MiB
#: has 5 points only; it takes the network's figure.
FABRIC_SIGMA: Final[Mapping[str, tuple[float, float]]] = {
    "nvlink": (0.070, 0.222), "pcie": (0.490, 0.258), "network": (0.076, 0.222)}
#: The spread of the framework's host time per launched op: one figure calibrated on a subset of the
#: vTrain rows stands for every row, model and framework version (``HOST_PROBES_US`` of
#: :mod:`simgpu.validate.iterations` bracket it by +-15%).
HOST_SIGMA: Final = 0.10
#: z of the 90th percentile of a standard normal: the 80% interval is ``exp(+-1.2816 sigma)``.
Z90: Final = 1.2815515655446004
#: The calibration scale per kind of source (``docs/uncertainty.md``, "Calibration").
SCALES: Final[Mapping[str, float]] = {"kernel": 5.0, "collective": 1.25, "host": 1.0}


def kernel_sigma(geomean_ape: float) -> float:
    """``sigma`` of the log error whose absolute value has geometric mean ``geomean_ape``."""
    return float(geomean_ape) * SIGMA_PER_GEOMEAN


@dataclass(frozen=True)
class Spread:
    """The spread of every source on one platform (``sigma`` of the log error, before :attr:`scales`)."""

    #: per family, the platform's own fitted models' held-out spread
    own: Mapping[str, float] = field(default_factory=dict)
    #: per family, the transfer models' held-out spread (widened where the GPU is not among theirs)
    transfer: Mapping[str, float] = field(default_factory=dict)
    #: per family, the analytical model's spread against the same measurements
    analytical: Mapping[str, float] = field(default_factory=dict)
    #: per fabric, ``(sigma >= 1 MiB, sigma < 1 MiB)``
    fabric: Mapping[str, tuple[float, float]] = field(default_factory=lambda: dict(FABRIC_SIGMA))
    host: float = HOST_SIGMA
    #: whether the GPU is among those the transfer models were fitted on
    transfer_measured: bool = True
    scales: Mapping[str, float] = field(default_factory=lambda: dict(SCALES))

    def kernel(self, family: str, model: str) -> float:
        """The scaled spread of a ``family`` kernel timed by the model named ``model`` (as a
        predictor reports it: ``lightgbm``, ``lightgbm (rule)``, ``lightgbm-transfer``, ``analytical``)."""
        base, rule = model.removesuffix(" (rule)"), model.endswith(" (rule)")
        table = {"lightgbm": self.own, "measured": self.own, "lightgbm-transfer": self.transfer,
                 "analytical": self.analytical}.get(base, {})
        sigma = table.get(family, _median(table) if rule and table else DEFAULT_SIGMA)
        if rule and base != "analytical":
            sigma *= RULE_WIDEN
        return sigma * self.scales.get(f"kernel:{family}", self.scales.get("kernel", 1.0))

    def collective(self, fabric: str) -> tuple[float, float]:
        """The scaled ``(bandwidth, latency)`` spread of collectives over ``fabric``."""
        big, small = self.fabric.get(fabric, (DEFAULT_SIGMA, DEFAULT_SIGMA))
        s = self.scales.get(f"collective:{fabric}", self.scales.get("collective", 1.0))
        return big * s, small * s

    def host_sigma(self) -> float:
        return self.host * self.scales.get("host", 1.0)

    def scaled(self, **scales: float) -> Spread:
        """The same spread with some calibration scales replaced: by kind of source (``kernel=1.5``,
        ``collective``, ``host``), or for one source (``**{"kernel:gemm": 2}``, ``collective:nvlink``)."""
        return replace(self, scales={**self.scales, **scales})


def _median(table: Mapping[str, float]) -> float:
    values = sorted(table.values())
    return values[len(values) // 2] if values else DEFAULT_SIGMA


def _figures(manifest: Mapping[str, Any] | None, key: str) -> dict[str, float]:
    """Per family of ``manifest``, :func:`kernel_sigma` of its held-out figure ``key``."""
    out: dict[str, float] = {}
    for family, info in ((manifest or {}).get("families") or {}).items():
        value = (info.get("heldout") or {}).get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            out[str(family)] = kernel_sigma(value)
    return out


@functools.cache
def _transfer() -> tuple[dict[str, float], dict[str, float], frozenset[str]]:
    """The transfer models' held-out spread and their analytical figures per family, and the
    platforms they were fitted on."""
    manifest = store.read_manifest(store.platforms_root() / TRANSFER / "models")
    fitted_on = frozenset(str(p) for p in (manifest or {}).get("platforms", ()))
    return _figures(manifest, "geomean_ape"), _figures(manifest, "analytical_geomean_ape"), fitted_on


def spread(platform: PlatformSpec) -> Spread:
    """The spread of every source on ``platform``, read from its kernel models' manifest and the
    transfer models' (see the module docstring)."""
    folder = models_folder(platform)
    manifest = store.read_manifest(folder / "models") if folder is not None else None
    own, roof_own = _figures(manifest, "geomean_ape"), _figures(manifest, "analytical_geomean_ape")
    transfer, roof_transfer, fitted_on = _transfer()
    measured = folder is not None and folder.name in fitted_on
    widen = 1.0 if measured else TRANSFER_WIDEN
    return Spread(own=own, transfer={f: s * widen for f, s in transfer.items()},
                  analytical={**roof_transfer, **roof_own}, transfer_measured=measured)

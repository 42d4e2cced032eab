"""Coverage of the 80% interval on measured sets (``python -m simgpu.validate.coverage``)."""

from __future__ import annotations

import pytest

from simgpu.uncertainty.sources import FABRIC_SIGMA
from simgpu.validate import collectives as vc
from simgpu.validate import coverage as cov
from simgpu.validate import iterations as vi

pytestmark = pytest.mark.validation
needs_collectives = pytest.mark.skipif(not vc.DATA.is_dir(), reason=f"nccl-tests measurements not found at "
                                       f"{vc.DATA} (../shared/data beside the checkout)")
needs_vtrain = pytest.mark.skipif(not (vi.DATA / vi.CSV).is_file(), reason=f"vTrain measurements not found at "
                                  f"{vi.DATA} (../shared/data beside the checkout)")


@needs_collectives
def test_fabric_spread_is_the_validations():
    got = cov.fabric_spread(cov.collective_points())
    for fabric, (big, small) in FABRIC_SIGMA.items():
        assert got[fabric] == pytest.approx((big, small), abs=0.002), fabric


@needs_collectives
def test_collectives_coverage_is_calibrated():
    s = cov.scores(cov.collective_coverage(), "p10_us", "p90_us")
    assert cov.LOW <= s["coverage"] <= cov.HIGH, s


@needs_vtrain
@pytest.mark.slow
def test_vtrain_coverage_is_calibrated():
    """One row per (GPUs, tp, pp, micro-batch) stratum (72 rows), 16 draws each."""
    df = cov.iteration_coverage(vi.stratified_sample(vi.load_cases(), 1), workers=2)
    s = cov.scores(df, "p10_ms", "p90_ms")
    assert cov.LOW <= s["coverage"] <= cov.HIGH, s
    assert s["median_p90_over_p10"] < 2.5, s  # wide: see docs/uncertainty.md


def _splitwise_data():
    from simgpu.kernels.importers import data_root
    from simgpu.validate.splitwise import SPLITWISE

    return data_root(), (data_root() / SPLITWISE).is_file()


@pytest.mark.skipif(not _splitwise_data()[1], reason="Splitwise measurements not found (../shared/data beside the "
                    "checkout)")
def test_splitwise_coverage_out_of_sample():
    """The serving iterations, with scales calibrated on the other sets: decode lands inside 70-90%;
    prefill does not yet (its misses are mostly below the interval: predicted too slow)."""
    from simgpu.validate.coverage_serving import splitwise_coverage

    df = splitwise_coverage(_splitwise_data()[0])
    s = cov.scores(df, "p10_ms", "p90_ms")
    assert cov.LOW <= s["coverage"] <= cov.HIGH, s
    d = cov.scores(df[df["what"] == "decode"], "p10_ms", "p90_ms")
    assert cov.LOW <= d["coverage"] <= cov.HIGH, d
    assert s["median_p90_over_p10"] < 1.5, s

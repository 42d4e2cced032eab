"""Whole-iteration predictions against the measured Megatron iterations of vTrain (one A100 node).

The whole set (1,440 rows) runs with ``python -m simgpu.validate.iterations`` (docs/accuracy-iterations.md);
here a stratified sample (one row per GPU count x tp x pp x micro-batch stratum, fixed seed) must
meet the error threshold, and complete model x batch groups the rank-correlation threshold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simgpu.validate import iterations as vi

pytestmark = pytest.mark.validation
needs_data = pytest.mark.skipif(not (vi.DATA / vi.CSV).is_file(),
                                reason=f"measurements not found at {vi.DATA} (../shared/data beside the checkout)")
#: Complete (hidden, layers, global batch) groups whose every parallel configuration is simulated:
#: for each hidden size, the cheapest group of at least 20 configurations (12 layers, global batch 4),
#: and the group of 8 whose order turns on tensor parallelism 8 at micro-batch 1 (two score matrices
#: per rank, which Megatron's fused softmax does not take).
GROUPS = [(1024, 12, 4), (2048, 12, 4), (2048, 12, 2)]


@pytest.fixture(scope="module")
def cases() -> pd.DataFrame:
    return vi.load_cases()


@pytest.fixture(scope="module")
def sample(cases: pd.DataFrame) -> pd.DataFrame:
    return vi.predict(vi.stratified_sample(cases, 1, seed=0))


@needs_data
def test_the_data_is_what_the_module_expects(cases: pd.DataFrame) -> None:
    assert len(cases) == 1440
    assert set(cases["gpus"]) == {2, 4, 8}
    assert (cases["tp"] * cases["dp"] * cases["pp"] == cases["gpus"]).all()


@needs_data
def test_sample_covers_every_stratum(sample: pd.DataFrame, cases: pd.DataFrame) -> None:
    strata = ["gpus", "tp", "pp", "micro_batch"]
    assert len(sample) == len(cases.groupby(strata))
    assert set(sample["hidden"]) == {1024, 2048} and set(sample["layers"]) == {12, 16, 20, 24}


@needs_data
def test_geomean_error_of_the_sample(sample: pd.DataFrame) -> None:
    err = vi.geomean_error(sample)
    assert err <= vi.MAX_GEOMEAN_ERROR, f"geomean |error| {err:.1%} over {len(sample)} cases"
    # no sign of a systematic bias either way
    assert abs(sample["error"].median()) < 0.1


@needs_data
@pytest.mark.parametrize("hidden, layers, batch", GROUPS)
def test_rank_correlation_within_a_group(cases: pd.DataFrame, hidden: int, layers: int, batch: int) -> None:
    group = cases[(cases["hidden"] == hidden) & (cases["layers"] == layers) & (cases["global_batch"] == batch)]
    assert len(group) >= (20 if batch >= 4 else 8)
    rho = vi.spearman(vi.predict(group))
    assert len(rho) == 1
    assert rho["rho"].iloc[0] >= vi.MIN_SPEARMAN, rho


@needs_data
def test_host_overhead_is_the_calibration_rule(cases: pd.DataFrame) -> None:
    """The one calibrated figure is what its rule gives on the 12-layer models, not a hand-picked value."""
    rows = vi.calibration_rows(cases)
    assert set(rows["layers"]) == {12} and len(rows) >= 40
    assert vi.calibrate_host_overhead(cases) == pytest.approx(vi.HOST_OVERHEAD_US, abs=0.5)


def test_metrics() -> None:
    df = pd.DataFrame({"hidden": 1, "heads": 1, "layers": 1, "seq_len": 1, "global_batch": [1, 1, 1, 2, 2, 2],
                       "predicted_ms": [1.0, 2.0, 3.0, 2.0, 1.0, 3.0], "measured_ms": [2.0, 4.0, 6.0, 1.0, 2.0, 3.0]})
    # |ln(1/2)| three times, |ln 2| twice, ln 1 once
    assert vi.geomean_error(df) == pytest.approx(2 ** (5 / 6) - 1)
    rho = vi.spearman(df).set_index("global_batch")["rho"]
    assert rho[1] == pytest.approx(1.0) and rho[2] == pytest.approx(0.5)


def test_hit_rates() -> None:
    df = pd.DataFrame({"hidden": 1, "heads": 1, "layers": 1, "seq_len": 1, "gpus": 8,
                       "global_batch": [1, 1, 1, 1, 2, 2, 2, 2, 3],
                       "predicted_ms": [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0, 1.0],
                       "measured_ms": [5.0, 6.0, 7.0, 8.0, 9.0, 8.0, 7.0, 6.0, 1.0]})
    h = vi.hit_rates(df)
    # batch 1: predicted fastest is the measured fastest; batch 2: the measured fastest is predicted 4th;
    # batch 3 has one configuration only and is no choice
    assert h["choices"] == 2 and h["top1"] == 0.5 and h["top3"] == 0.5
    assert h["regret"] == pytest.approx(np.sqrt(1.0 * 9.0 / 6.0) - 1)

"""Collective predictions against the nccl-tests measurements in ../shared/data/collectives/."""

from __future__ import annotations

import numpy as np
import pytest

from simgpu.comm.calibrate import fit
from simgpu.validate import collectives as vc

pytestmark = pytest.mark.validation
needs_data = pytest.mark.skipif(not vc.DATA.is_dir(), reason=f"measurements not found at {vc.DATA} "
                                "(../shared/data beside the checkout)")


@pytest.fixture(scope="module")
def table():
    return vc.validate(vc.DATA, vtrain_stride_mb=16)


@needs_data
def test_every_category_is_validated(table):
    counts = table.groupby("category").size()
    assert counts["one_node"] >= 20 and counts["two_node"] >= 4 and counts["pcie"] >= 5
    assert set(table["platform"]) >= {"dgx_a100", "dgx_h100", "dgx_h200", "dgx1_v100", "aws_p4de", "aws_p5",
                                      "gcp_a3mega", "oci_bm_gpu4_8"}


@needs_data
def test_thresholds_hold_except_recorded_gaps(table):
    bad, _known = vc.failures(table)
    assert not bad, "\n".join(bad)


@needs_data
def test_known_gaps_are_still_gaps(table):
    """A recorded gap that now meets its threshold must leave KNOWN_GAPS (so the table stays true)."""
    above = set()
    for row in table.itertuples():
        big, small = vc.THRESHOLDS[str(row.category)]
        if big is not None and row.err_ge_1MB > big:
            above.add((row.sweep, "ge"))
        if small is not None and row.err_lt_1MB > small:
            above.add((row.sweep, "lt"))
    assert set(vc.KNOWN_GAPS) <= above, sorted(set(vc.KNOWN_GAPS) - above)


@needs_data
def test_most_one_node_sweeps_within_15_percent(table):
    one = table[table["category"] == "one_node"]
    assert (one["err_ge_1MB"] <= 0.15).mean() >= 0.8
    assert one["err_ge_1MB"].median() <= 0.10


@needs_data
@pytest.mark.parametrize("name", ["vtrain:A100x8:all_reduce", "vtrain:V100x4:all_reduce",
                                  "h100-cluster:1x8:all_gather"])
def test_calibration_on_half_the_sizes_predicts_the_other_half(name):
    """Fit the bounding link's efficiency and latency on every other size; the rest within 8%."""
    sweep = next(s for s in vc.sweeps(vc.DATA, vtrain_stride_mb=64) if s.name == name)
    sizes, meas = np.array(sweep.sizes), np.array(sweep.measured_us)
    result = fit(sweep.platform, sweep.op, sizes[::2], meas[::2], nodes=sweep.nodes,
                 gpus_per_node=sweep.gpus_per_node)
    over = [(k, v) for k, v in result.params.items()]
    held = vc.Sweep(name, sweep.category, sweep.platform, sweep.nodes, sweep.gpus_per_node, sweep.op,
                    tuple(sizes[1::2]), tuple(meas[1::2]), sweep.overrides)
    err = vc.geomean_error(vc.predict(held, over), meas[1::2])
    assert err <= 0.08
    assert result.error_after <= result.error_before + 1e-9

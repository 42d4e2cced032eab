"""Collective predictions against the nccl-tests measurements in ../shared/data/collectives/."""

from __future__ import annotations

import pytest

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
def test_ten_node_h100_runs_within_10_percent(table):
    """The ten-node H100 runs with 1, 2 and 4 GPUs per node: all five collectives, send/recv
    included, within 10% at every size (all are >= 32 MiB)."""
    ten = table[table["category"] == "ten_node"]
    assert len(ten) == 15 and set(ten["gpus"]) == {"10x1", "10x2", "10x4"}
    assert (ten["err_ge_1MB"] <= 0.10).all(), ten[["sweep", "err_ge_1MB"]].to_string()


@needs_data
def test_two_node_pairwise_sweeps_within_15_percent_with_the_spread_reported(table):
    """Both clusters' two-node alltoall and sendrecv, every node pair: the median pair within 15%
    (beyond the recorded gap), and the spread of the error across pairs reported."""
    pairs = table[table["category"] == "pairwise"]
    assert len(pairs) == 14 and set(pairs["platform"]) == {"h100_ndr_cluster", "h100_ndr_cluster00"}
    assert (pairs["runs"] >= 45).all()
    assert pairs[["run_err_p10", "run_err_p50", "run_err_p90"]].notna().all().all()
    ok = pairs[[(name, "ge") not in vc.KNOWN_GAPS for name in pairs["sweep"]]]
    assert len(ok) == 13 and (ok["err_ge_1MB"] <= 0.15).all(), ok[["sweep", "err_ge_1MB"]].to_string()


@needs_data
def test_most_one_node_sweeps_within_15_percent(table):
    one = table[table["category"] == "one_node"]
    assert (one["err_ge_1MB"] <= 0.15).mean() >= 0.8
    assert one["err_ge_1MB"].median() <= 0.10


@needs_data
@pytest.mark.parametrize("name", [
    "vtrain:A100x2:all_reduce", "vtrain:V100x4:all_reduce", "h100-cluster:1x8:all_gather",
    "h100-cluster:1x8:sendrecv",                                  # NCCL's per-channel bound, fitted
    "stas00:8xH200:all_reduce",                                   # the small-message plateau, fitted
    "oci:oci_2x8xA100-SXM4-40GB_all_reduce_perf:all_reduce",      # two nodes over RoCE
    "autodl:autodl_2x2080Ti_PCIe3_noP2P_nccl_tests:alltoall",     # PCIe through host memory
    "autodl:autodl_2x2080Ti_PCIe3_noP2P_nccl_tests:all_reduce",
])
def test_calibration_on_half_the_sizes_predicts_the_other_half(name):
    """Fit the platform's knobs on every other size (no worse there than the platform as given);
    the sizes left out come within 8%."""
    sweep = next(s for s in vc.sweeps(vc.DATA, vtrain_stride_mb=64) if s.name == name)
    row = vc.calibration_holdout(sweep)
    assert row["after"] <= 0.08, row
    assert row["fit_after"] <= row["fit_before"] + 1e-9, row

"""Communication that slows compute, derived per GPU generation and collective kind from the SMs
NCCL's thread blocks take and the HBM bandwidth the collective's bytes take
(simgpu.kernels.overlap), against the one measurement on a profiler trace (A100)."""

from __future__ import annotations

import pytest

from simgpu.config.loader import load_platform
from simgpu.kernels.overlap import KINDS, NVLS_CHANNELS, P2P_PEER_CHANNELS, derive, hbm_share, main, nccl_ctas
from simgpu.trace.overlap import HTA, measure


def by_kind(name: str) -> dict[str, float]:
    return {d.kind: d.sm_slowdown for d in derive(load_platform(name)[0])}


def test_ctas_per_kind_follow_nccls_channels():
    """Rings: twice one per NIC (8 NICs: 16); NVLS all-reduce: NCCL_NVLS_NCHANNELS; a send/recv
    peer: two channels; a PCIe node with one NIC: two rings' worth."""
    h100, _ = load_platform("dgx_h100")
    assert nccl_ctas(h100, "all_reduce") == NVLS_CHANNELS == 16
    assert nccl_ctas(h100, "reduce_scatter") == nccl_ctas(h100, "all_to_all") == 2 * 8
    assert nccl_ctas(h100, "send_recv") == P2P_PEER_CHANNELS == 2
    with pytest.raises(ValueError, match="expected one of"):
        nccl_ctas(h100, "allreduce")
    # one NVLink domain of 72 GPUs and 72 NICs: NCCL's MAXCHANNELS (32), not two per NIC
    nvl72, _ = load_platform("gb200_nvl72")
    assert nccl_ctas(nvl72, "all_gather") == 32 and nccl_ctas(nvl72, "all_reduce") == NVLS_CHANNELS


def test_sm_share_per_generation():
    """c / (S - c): 16 blocks of 108 SMs (A100) 17.4%, of 132 (H100, H200) 13.8%, of 148 (B200)
    12.1%; a send/recv's two blocks about a tenth of that."""
    a100, h100, h200, b200 = (by_kind(n) for n in ("dgx_a100", "dgx_h100", "dgx_h200", "dgx_b200"))
    assert a100["all_reduce"] == pytest.approx(16 / 92)
    assert h100["all_gather"] == pytest.approx(16 / 116) == h200["all_gather"]
    assert b200["reduce_scatter"] == pytest.approx(16 / 132)
    assert a100["all_reduce"] > h100["all_reduce"] > b200["all_reduce"]
    for g in (a100, h100, b200):
        assert set(g) == set(KINDS)
        assert g["send_recv"] < g["all_gather"] / 5


def test_hbm_share_grows_with_nvlink_and_shrinks_with_hbm():
    """Three HBM bytes per NVLink byte: H100 3 x 360 of 2,848 GB/s; H200 (the same NVLink, 4.8 TB/s
    HBM) takes less, B200 (twice the NVLink, 8 TB/s) more than H200."""
    h100, h200, b200 = (load_platform(n)[0] for n in ("dgx_h100", "dgx_h200", "dgx_b200"))
    assert hbm_share(h100) == pytest.approx(3 * 450 * 0.8 / (3350 * 0.85))
    assert hbm_share(h200) < hbm_share(h100)
    assert hbm_share(h200) < hbm_share(b200) < hbm_share(h100)
    d = derive(h100)[0]
    assert d.hbm_slowdown == pytest.approx(hbm_share(h100) / (1 - hbm_share(h100)))


def test_command_prints_every_kind_and_refuses_a_bad_platform(capsys):
    assert main(["dgx_h100"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in KINDS)
    assert main(["no_such_platform"]) == 2
    assert "expected" in capsys.readouterr().err


@pytest.mark.skipif(not (HTA / "nccl_parser_config" / "nccl_data.json.gz").is_file(),
                    reason="../shared/data/traces/hta is absent")
def test_derived_bounds_the_a100_measurement():
    """On A100 (PG509-200) the measured slowdown of kernels under an NCCL all-reduce (9.6%) lies
    below the SM share a kernel filling the GPU would lose (17.4%) and above half of it: kernels
    that leave SMs idle lose less."""
    measured = {s.op: s.slowdown for s in measure(HTA / "nccl_parser_config" / "nccl_data.json.gz")}
    derived = by_kind("dgx_a100")["all_reduce"]
    assert derived / 2 < measured["all_reduce"] < derived


#: The platforms of H100, H200 and B200 GPUs, which no trace measures: they ship the derived figures.
DERIVED_PLATFORMS = ("dgx_h100", "dgx_h200", "dgx_b200", "gb200_nvl72", "aws_p5", "gcp_a3mega",
                     "h100_ndr_cluster", "h100_ndr_cluster00")


@pytest.mark.parametrize("name", DERIVED_PLATFORMS)
def test_unmeasured_generations_ship_the_derived_figures(name):
    p, _ = load_platform(name)
    shipped = {str(k): v for k, v in p.gpu.overlap_slowdown_by_op.items()}
    assert shipped == {d.kind: pytest.approx(d.sm_slowdown, abs=5e-4) for d in derive(p)}

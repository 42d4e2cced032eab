"""Validation of the learned kernel models against NeuSight's measured kernel latencies.

Per GPU and op family, a model fitted on a random 80% of the shapes (fixed seed) must time the
other 20% within 8% geomean absolute percentage error, and better than the analytical model. A
model fitted on the other GPUs must time every H100 shape within 20%. The data lies in
``../shared/data/kernels/neusight``; without it these tests skip.
"""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import DATA

from simgpu.fit import H100, format_table, neusight_heldout, neusight_leave_out
from simgpu.fit import main as fit_main

NEUSIGHT = DATA / "kernels" / "neusight"
pytestmark = [pytest.mark.validation,
              pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset" / "test" / "linear.csv").is_file(),
                                 reason=f"NeuSight's measurements are not in {NEUSIGHT}")]

FAMILIES = ("gemm", "bmm", "norm", "softmax", "elementwise")  # NeuSight's linear, bmm, ln, softmax, elem
THRESHOLD = 0.08
#: NeuSight's L4 batched GEMMs are not repeatable: the same (m, n, k) with more batches is often
#: measured faster (b=12: 0.139 ms, b=16: 0.521 ms, b=32: 0.388 ms for 256x512x512), bimodal
#: between about 5 and 12 TFLOP/s, which no shape feature can predict. Its bound is the noise floor.
NOISY = {("bmm", "NVIDIA L4"): 0.11}
LEAVE_OUT_THRESHOLD = 0.20


@pytest.fixture(scope="module")
def heldout() -> pd.DataFrame:
    return neusight_heldout(NEUSIGHT, FAMILIES, threads=1)


def test_every_family_and_gpu_is_covered(heldout: pd.DataFrame):
    assert set(heldout["family"]) == set(FAMILIES)
    assert (heldout.groupby("family")["gpu"].nunique() >= 7).all()
    assert (heldout["n_test"] >= 8).all()


def test_heldout_geomean_error_within_threshold(heldout: pd.DataFrame):
    print("\n" + format_table(heldout))
    bad = []
    for _, r in heldout.iterrows():
        limit = NOISY.get((r["family"], r["gpu"]), THRESHOLD)
        if not r["geomean_ape"] <= limit:
            bad.append(f"{r['family']} on {r['gpu']}: {r['geomean_ape']:.1%} > {limit:.0%}")
    assert not bad, "; ".join(bad)


def test_learned_beats_analytical_on_every_family_and_gpu(heldout: pd.DataFrame):
    worse = heldout[heldout["geomean_ape"] >= heldout["analytical_geomean_ape"]]
    assert worse.empty, format_table(worse)
    by_family = heldout.groupby("family")[["geomean_ape", "analytical_geomean_ape"]].median()
    assert (by_family["geomean_ape"] * 2 < by_family["analytical_geomean_ape"]).all()


def test_gpu_left_out_of_training():
    left = neusight_leave_out(NEUSIGHT, H100, FAMILIES, threads=1)
    print("\n" + format_table(left))
    # NeuSight measured only GEMMs and batched GEMMs on the H100
    assert set(left["family"]) == {"gemm", "bmm"}
    assert (left["n_test"] >= 1000).all()
    assert (left["geomean_ape"] <= LEAVE_OUT_THRESHOLD).all(), format_table(left)


def test_command_line_report(tmp_path, capsys):
    out = tmp_path / "neusight.csv"
    assert fit_main(["--neusight", str(NEUSIGHT), "--families", "norm", "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| norm | NVIDIA A100-PCIE-40GB |" in printed and "nothing to leave out" in printed
    rows = pd.read_csv(out)
    assert set(rows["family"]) == {"norm"} and (rows["split"] == "heldout").all()
    assert fit_main(["--neusight", str(NEUSIGHT), "--families", "conv"]) == 2

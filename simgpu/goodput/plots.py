"""``goodput.png``: goodput against the checkpoint interval (the analytic curve, Monte Carlo points
with their standard error, the best intervals marked) and against the cluster size at the best
interval of each size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .model import analytic
from .run import curve_arrays
from .spec import HOUR


def goodput_plot(summary: dict[str, Any], path: Path) -> None:
    """Write the two panels of ``summary`` to ``path``."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    c, r = summary["checkpoint"]["checkpoint_s"], summary["checkpoint"]["restart_s"]
    m = summary["failures"]["mtbf_hours"] * HOUR
    t, _, mc, err = curve_arrays(summary)
    dense = np.geomspace(t.min(), t.max(), 400)
    ax.plot(dense, 100 * analytic(dense, c, r, m), color="#4c72b0", label="analytic (exponential failures)")
    ax.errorbar(t, 100 * mc, yerr=100 * err, fmt="o", ms=4, color="#dd8452", label="Monte Carlo")
    b = summary["best"]
    for key, label, style in (("young", "Young", ":"), ("daly", "Daly", "--")):
        ax.axvline(b[key]["interval_s"], color="#555555", ls=style, lw=1,
                   label=f"{label}: {b[key]['interval_s']:.4g} s")
    ax.plot([b["monte_carlo"]["interval_s"]], [100 * b["monte_carlo"]["goodput"]], "*", ms=12, color="#c44e52",
            label=f"Monte Carlo best: {b['monte_carlo']['interval_s']:.4g} s")
    if summary["at_interval"]:
        ax.axvline(summary["at_interval"]["interval_s"], color="#55a868", lw=1.2,
                   label=f"given: {summary['at_interval']['interval_s']:.4g} s")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s of training between checkpoints)")
    ax.set_ylabel("goodput (%)")
    top = 100 * float(np.nanmax(mc))
    ax.set_ylim(max(0.0, top - 3 * (100 - top) - 5), min(100.0, top + (100 - top) * 0.6 + 0.5))
    ax.set_title(f"{summary['name']}: {summary['job']['gpus']} GPUs, MTBF {summary['failures']['mtbf_hours']:.3g} h, "
                 f"C {c:.3g} s, R {r:.3g} s", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower center")

    sc = summary["scale"]
    n = np.array([p["gpus"] for p in sc])
    bx.plot(n, [100 * p["goodput"] for p in sc], "-", color="#4c72b0", label="analytic at Daly's interval")
    bx.errorbar(n, [100 * p["monte_carlo"] for p in sc], yerr=[100 * p["stderr"] for p in sc], fmt="o", ms=4,
                color="#dd8452", label="Monte Carlo")
    bx.axvline(summary["job"]["gpus"], color="#555555", ls="--", lw=1, label=f"this job: {summary['job']['gpus']}")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("GPUs (failure rate grows with the count)")
    bx.set_ylabel("goodput at the best interval (%)")
    bx.set_title("goodput against cluster size", fontsize=10)
    bx.grid(alpha=0.3, which="both")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

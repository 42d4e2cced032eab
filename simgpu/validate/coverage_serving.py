"""How often the predicted 80% interval holds the measured serving iterations (Splitwise).

Each scored Splitwise group (model, machine, tensor parallelism) is timed as
:mod:`simgpu.validate.splitwise` times it with the group's held-out stack figures, once at the point
and ``draws`` more times with the errors of its sources drawn as ``simgpu serve --uncertainty``
draws them (:mod:`simgpu.uncertainty.serving`: one factor per kernel family on the timer's kernel
times, fabrics and host through the job). Each prefill and decode iteration's interval is P10 to P90
of its draws. ``python -m simgpu.validate.coverage --set splitwise``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..serve.timer import EngineTimer
from ..uncertainty import spread
from ..uncertainty.draws import fabrics, normals, perturbed
from ..uncertainty.serving import KernelScale
from . import splitwise as vs
from .inference_jobs import MODELS, make_job

#: Draws per group.
DRAWS = 16


def splitwise_coverage(data: Path, draws: int = DRAWS, seed: int = 0) -> pd.DataFrame:
    """One line per scored iteration with held-out stack figures: predicted, P10, P90 and measured ms."""
    rows = vs.splitwise_rows(data)
    out = []
    for (model, hw, tp), g in rows.groupby(["model", "hardware", "tensor_parallel"]):
        if hw not in vs.SCORED_HARDWARE:
            continue
        g = g[g["batch_size"] != vs.SUSPECT_BATCH]
        machine = str(hw).removesuffix("-pcap")
        fold = vs.SPLITWISE_FOLDS.get(machine, {}).get((str(model), int(tp)))
        if fold is None or not len(g):
            continue
        inf, plat = vs._split({**vs.SPLITWISE_FIXED.get(machine, {}), **fold})
        job = make_job(MODELS[str(model)], vs.HARDWARE[str(hw)], int(tp), "fp16", inference=inf,
                       platform_overrides=plat)
        sp = spread(job.platform)
        scale = KernelScale(sp)
        pre, dec = vs.group_steps(g)
        point = EngineTimer(job, kernel_scale=scale)
        p_pre, p_dec = point.time(pre) * 1e3, point.time(dec) * 1e3
        names = ([f"kernel:{f}" for f in sorted(scale.seen)] + [f"collective:{f}" for f in fabrics(job)]
                 + (["host"] if sp.host_sigma() > 0 else []))
        pres, decs = [], []
        for z in normals(draws, len(names), seed):
            zs = dict(zip(names, (float(x) for x in z), strict=True))
            scale.z = {s.removeprefix("kernel:"): v for s, v in zs.items() if s.startswith("kernel:")}
            timer = EngineTimer(perturbed(job, sp, zs), kernel_scale=scale)
            pres.append(timer.time(pre) * 1e3)
            decs.append(timer.time(dec) * 1e3)
        scale.z = {}
        for what, pt, drawn, meas in (("prefill", p_pre, np.array(pres), g["prompt_time"].to_numpy()),
                                      ("decode", p_dec, np.array(decs), g["token_time"].to_numpy())):
            lo, hi = np.quantile(drawn, 0.1, axis=0), np.quantile(drawn, 0.9, axis=0)
            for i in range(len(g)):
                out.append({"model": model, "hardware": hw, "tp": int(tp), "what": what,
                            "predicted_ms": float(pt[i]), "p10_ms": float(lo[i]), "p90_ms": float(hi[i]),
                            "measured_ms": float(meas[i])})
    t = pd.DataFrame(out)
    return t.assign(inside=(t["measured_ms"] >= t["p10_ms"]) & (t["measured_ms"] <= t["p90_ms"]))

"""``python -m simgpu.serve serving.yaml``: simulate serving requests, print a summary, write outputs.

Writes ``requests.csv``, ``summary.json``, ``kv_occupancy.csv``, ``latency_cdf.png``,
``kv_occupancy.png`` and ``timeline.png`` into ``--out`` (default ``out/<name>``), and with a rate
sweep (``--sweep 2,4,8`` or the file's ``outputs.sweep_rates_per_s``) ``sweep.csv`` and
``throughput_vs_load.png``. A file whose deployment is a ``dlrm_inference`` workload is served by
the dynamic batcher of :mod:`simgpu.serve.dlrm` instead. ``--set`` overrides keys of the serving file
(``scheduler.max_batch=64``; a pool's workload keys through ``deployment.set.<key>``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..cli import ArgParser, Progress, check_out_dir, entry, out_dir, run_command


def rate_list(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of rates > 0, got {text!r}") from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"expected a comma list of rates > 0, got {text!r}")
    return rates


def parser() -> ArgParser:
    ap = ArgParser(prog="simgpu serve", description="Simulate an LLM or DLRM serving deployment at the request level.")
    ap.add_argument("serving", help="serving YAML file (see workloads/serving/)")
    ap.add_argument("--out", help="output folder (default out/<name>)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the serving file: scheduler.kind=chunked, requests.rate_per_s=4, ...")
    ap.add_argument("--seed", type=int, help="seed of the request draws (overrides the file's)")
    ap.add_argument("--sweep", type=rate_list, metavar="RATES",
                    help="also simulate at these arrival rates (req/s) for throughput_vs_load.png")
    ap.add_argument("--uncertainty", type=int, default=0, metavar="N",
                    help="after the point run, N correlated draws of the kernel, fabric and host errors: P10/P50/P90 "
                         "of TTFT, TPOT and output tokens/s (docs/uncertainty.md; LLM deployments; default 0: none)")
    ap.add_argument("--no-plots", action="store_true", help="write the tables only")
    ap.add_argument("--quiet", action="store_true", help="print only the one-line figures")
    return ap


def sweep_row(rate: float, s: dict[str, Any]) -> dict[str, Any]:
    th = s["throughput"]
    return {"rate_per_s": rate, "requests_per_s": th["requests_per_s"],
            "output_tokens_per_s": th["output_tokens_per_s"],
            "output_tokens_per_s_per_gpu": th["output_tokens_per_s_per_gpu"],
            "goodput_requests_per_s": s["goodput"]["requests_per_s"],
            "goodput_tokens_per_s": th["output_tokens_per_s"] * s["goodput"]["attained"],
            "ttft_p99_ms": s["ttft_ms"]["p99"], "tpot_p99_ms": s["tpot_ms"]["p99"], "e2e_mean_ms": s["e2e_ms"]["mean"],
            "mean_in_system": s["mean_in_system"]}


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    from ..errors import ConfigError
    from .deploy import build, serve
    from .metrics import format_summary
    from .outputs import write_outputs
    from .spec import load_serving

    if args.uncertainty < 0:
        raise ConfigError(f"--uncertainty: expected a number of draws >= 0, got {args.uncertainty}")
    if args.out:
        check_out_dir(args.out)
    overrides = list(args.overrides) + ([f"seed={args.seed}"] if args.seed is not None else [])
    from ..config.loader import job_kind
    from .dlrm import run_dlrm

    if job_kind(args.serving, overrides, "serving") == "dlrm_serving":
        if args.uncertainty:
            raise ConfigError("--uncertainty: not supported for DLRM serving yet; expected an LLM serving file",
                              file=args.serving)
        return run_dlrm(args.serving, overrides, Path(args.out) if args.out else None, args.sweep,
                        not args.no_plots, args.quiet)
    serving = load_serving(args.serving, overrides)
    spec = serving.spec
    rates = args.sweep or spec.outputs.sweep_rates_per_s
    if rates and spec.requests.kind in ("fixed", "closed_loop"):
        raise ConfigError("a sweep of arrival rates needs poisson or trace requests; expected requests.kind poisson "
                          "or trace", file=serving.file, key="--sweep" if args.sweep else "outputs.sweep_rates_per_s")
    out = out_dir(args.out, spec.name)
    with Progress() as progress:
        progress.set(f"{spec.name}: timers")
        t0 = time.perf_counter()
        draws, bands = None, None
        if args.uncertainty:
            from ..uncertainty.serving import ServingDraws

            draws = ServingDraws(serving)
            deployment = draws.point()
        else:
            deployment = build(serving)
        t_build = time.perf_counter() - t0

        def bar(what: str) -> Any:
            def show(done: int, total: int) -> None:
                filled = int(30 * done / max(total, 1))
                progress.set(f"{spec.name}: {what} [{'#' * filled}{'.' * (30 - filled)}] {done:,}/{total:,} requests")
            return show

        t1 = time.perf_counter()
        res, summary = serve(serving, deployment, progress=bar("serving"))
        wall = time.perf_counter() - t1
        summary["wall_s"] = {"deployment": round(t_build, 3), "serving": round(wall, 3)}
        if draws is not None:
            t2 = time.perf_counter()
            drawn = draws.run(args.uncertainty, summary, progress=lambda i, n: progress.set(
                f"{spec.name}: uncertainty draw {i + 1}/{n}"))
            summary["uncertainty"], bands = drawn.as_dict(), dict(drawn.bands)
            summary["wall_s"]["uncertainty"] = round(time.perf_counter() - t2, 3)
        sweep = None
        if rates:
            rows = []
            for rate in rates:
                _, s = serve(serving, deployment, rate_per_s=rate, progress=bar(f"{rate:g} req/s"))
                rows.append(sweep_row(rate, s))
            sweep = pd.DataFrame(rows)
        progress.set(f"{spec.name}: files")
        if args.no_plots:
            from .metrics import request_table

            out.mkdir(parents=True, exist_ok=True)
            import json

            request_table(res).to_csv(out / "requests.csv", index=False, float_format="%.4f")
            (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
            paths = {"requests": out / "requests.csv", "summary": out / "summary.json"}
            if sweep is not None:
                paths["sweep"] = out / "sweep.csv"
                sweep.to_csv(paths["sweep"], index=False)
        else:
            paths = write_outputs(res, summary, out, slo=(spec.slo.ttft_ms, spec.slo.tpot_ms),
                                  gantt_iterations=spec.outputs.gantt_iterations, sweep=sweep, cdf_bands=bands)
    if args.quiet:
        th = summary["throughput"]
        print(f"{th['output_tokens_per_s']:.1f} output tokens/s, TTFT P99 {summary['ttft_ms']['p99']:.1f} ms, "
              f"TPOT P99 {(summary['tpot_ms']['p99'] or 0):.1f} ms")
        return 0
    print(format_summary(summary))
    if summary.get("uncertainty"):
        from ..uncertainty.serving import format_lines

        print("\n".join(format_lines(summary["uncertainty"])))
    if sweep is not None:
        print("\n" + sweep.to_string(index=False, float_format=lambda x: f"{x:,.1f}"))
    print(f"\nsimulated {len(res.requests):,} requests ({summary['iterations']:,} iterations, "
          f"{summary['distinct_steps_timed']:,} distinct steps timed) in {wall:.2f} s after {t_build:.2f} s building "
          "the deployment; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    entry(main)

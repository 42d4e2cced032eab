"""Serving a DLRM: queries of a number of samples arrive, a dynamic batcher groups them, and each
batch runs the forward of the deployment's ``dlrm_inference`` workload on all of its GPUs at once.

A serving file whose ``deployment.workload`` is a ``dlrm_inference`` workload is read here instead
of by :mod:`simgpu.serve.spec` (:func:`simgpu.config.loader.job_kind` tells them apart). The batcher is the
dynamic batcher of TorchServe and Triton: queries wait in arrival order; when the deployment is
free it sends a batch as soon as the waiting queries reach ``batcher.max_batch_samples`` samples or
the oldest has waited ``batcher.max_queue_delay_us``, whichever comes first, taking the oldest
queries that fit. One batch runs at a time: the embedding tables are sharded over every GPU, so
each batch's all-to-alls occupy the whole deployment.

A batch of ``B`` samples is split evenly over the ``G`` GPUs and timed by the engine as the workload
with ``inference.batch_per_gpu = ceil(B / G)`` rounded up to a multiple of
``batcher.bucket_samples_per_gpu``; each distinct bucket is simulated once (:class:`BatchTimer`).
Latency is arrival to the end of the query's batch (queue wait plus the batch's service time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from ..config.base import Spec
from ..config.checks import check_requests
from ..config.loader import Job, apply_override, check_name, load_job, parse_override, read_yaml, resolve_path, validate
from ..errors import ConfigError
from .spec import DeploymentSpec, LengthSpec

PERCENTILES = (50, 90, 99)


class QueriesSpec(Spec):
    """Where queries come from: ``poisson`` arrivals at a rate, or ``fixed`` (all at time 0)."""

    kind: Literal["poisson", "fixed"] = Field(description="poisson or fixed")
    count: int = Field(ge=1, description="queries to simulate")
    rate_per_s: float | None = Field(None, gt=0, description="poisson: mean arrivals per second")
    samples: int | LengthSpec = Field(1, description="samples (user-item pairs to score) per query: a count, or "
                                      "a distribution {dist, mean, max} drawn with the seed")

    @model_validator(mode="after")
    def _complete(self) -> QueriesSpec:
        if self.kind == "poisson" and self.rate_per_s is None:
            raise ValueError("poisson queries need rate_per_s; expected arrivals per second")
        if isinstance(self.samples, int) and self.samples < 1:
            raise ValueError(f"samples {self.samples}; expected at least 1 sample per query")
        return self


class BatcherSpec(Spec):
    """The dynamic batcher."""

    max_batch_samples: int = Field(ge=1, description="most samples in one batch (over all GPUs)")
    max_queue_delay_us: float = Field(0.0, ge=0, description="longest the oldest query waits for a fuller batch")
    bucket_samples_per_gpu: int = Field(16, ge=1, description="batches are timed with their samples per GPU "
                                        "rounded up to a multiple of this")


class DlrmSloSpec(Spec):
    """The latency objective a query must meet to count in goodput."""

    latency_ms: float = Field(gt=0, description="arrival to scores, ms")


class DlrmOutputSpec(Spec):
    """Extras of the outputs."""

    sweep_rates_per_s: list[float] = Field(default_factory=list, description="arrival rates of the "
                                           "throughput-vs-load sweep (poisson), none for no sweep")

    @model_validator(mode="after")
    def _positive(self) -> DlrmOutputSpec:
        bad = [r for r in self.sweep_rates_per_s if not r > 0]
        if bad:
            raise ValueError(f"rate {bad[0]:g}; expected arrival rates > 0")
        return self


class DlrmServingSpec(Spec):
    """A DLRM serving file."""

    name: str = Field(description="the run's name (default output folder out/<name>)")
    seed: int = Field(0, description="seed of the query draws")
    deployment: DeploymentSpec = Field(description="the dlrm_inference workload serving the queries")
    queries: QueriesSpec = Field(description="the query source")
    batcher: BatcherSpec = Field(description="how queries are grouped into batches")
    slo: DlrmSloSpec | None = Field(None, description="the latency objective of goodput (none: no goodput)")
    outputs: DlrmOutputSpec = Field(default_factory=lambda: DlrmOutputSpec())

    @model_validator(mode="after")
    def _fits(self) -> DlrmServingSpec:
        s = self.queries.samples
        most = s if isinstance(s, int) else s.max
        if most > self.batcher.max_batch_samples:
            raise ValueError(f"a query of up to {most} samples never fits a batch of {self.batcher.max_batch_samples}"
                             "; expected batcher.max_batch_samples >= the most samples per query")
        return self


def _read(path: str | Path, overrides: tuple[str, ...] | list[str]) -> tuple[dict[str, Any], dict[Any, int]]:
    data, lines = read_yaml(path, "serving")
    for item in overrides:
        key, value = parse_override(item)
        apply_override(data, key, value, str(path))
    return data, lines


@dataclass(frozen=True)
class DlrmServing:
    """A validated DLRM serving file and where it was read from."""

    spec: DlrmServingSpec
    file: str
    overrides: tuple[str, ...] = ()

    def workload_path(self) -> Path:
        return resolve_path(self.file, self.spec.deployment.workload)


def load_dlrm_serving(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> DlrmServing:
    """Read a DLRM serving file with ``--set`` overrides and validate it."""
    file = str(path)
    data, lines = _read(path, overrides)
    spec = validate(DlrmServingSpec, data, file, lines)
    check_name(spec.name, file, lines.get(("name",)))
    serving = DlrmServing(spec, file, tuple(overrides))
    check_requests(spec.queries.count, file=file, key="queries.count", line=lines.get(("queries", "count")))
    if not serving.workload_path().is_file():
        raise ConfigError(f"workload {spec.deployment.workload!r} not found; expected a dlrm_inference workload "
                          "YAML, relative to the serving file or absolute", file=file, key="deployment.workload",
                          line=lines.get(("deployment", "workload")))
    return serving


class BatchTimer:
    """Seconds of a batch of a number of samples on the deployment: the engine's time of one forward
    of the workload at the bucketed samples per GPU, each bucket simulated once."""

    def __init__(self, job: Job, bucket_per_gpu: int,
                 simulate_bucket: Callable[[Job, int], float] | None = None) -> None:
        from ..config.checks import world_size

        self.job, self.bucket, self.gpus = job, bucket_per_gpu, world_size(job)
        self._simulate = simulate_bucket or _engine_time
        self.cache: dict[int, float] = {}

    def per_gpu(self, samples: int) -> int:
        return self.bucket * math.ceil(math.ceil(samples / self.gpus) / self.bucket)

    def __call__(self, samples: int) -> float:
        b = self.per_gpu(samples)
        if b not in self.cache:
            self.cache[b] = self._simulate(self.job, b)
        return self.cache[b]


def bucket_job(job: Job, batch_per_gpu: int) -> Job:
    """``job`` with ``inference.batch_per_gpu`` set, checked as :func:`~simgpu.config.loader.load_job`
    would check it, without reading its files again."""
    from dataclasses import replace

    from ..config.checks import check_job

    inference = job.workload.serve.model_copy(update={"batch_per_gpu": batch_per_gpu})
    j = replace(job, workload=job.workload.model_copy(update={"inference": inference}),
                overrides=(*job.overrides, f"inference.batch_per_gpu={batch_per_gpu}"))
    check_job(j)
    return j


def _engine_time(job: Job, batch_per_gpu: int) -> float:
    from ..sim import simulate

    return float(simulate(bucket_job(job, batch_per_gpu)).iteration_time_s)


@dataclass(frozen=True)
class Queries:
    """``arrival_s`` (sorted) and ``samples`` per query."""

    arrival_s: np.ndarray
    samples: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)


def make_queries(spec: QueriesSpec, seed: int, rate_per_s: float | None = None) -> Queries:
    """The queries of ``spec`` (``rate_per_s`` replaces the spec's rate, for a sweep)."""
    from .requests import draw_counts

    rng = np.random.default_rng(seed)
    samples = draw_counts(spec.samples, spec.count, rng)
    if spec.kind == "fixed":
        return Queries(np.zeros(spec.count), samples)
    rate = rate_per_s if rate_per_s is not None else spec.rate_per_s
    assert rate is not None  # checked by the spec
    arrival = np.cumsum(rng.exponential(1.0 / rate, spec.count))
    return Queries(arrival - arrival[0], samples)


@dataclass
class DlrmResult:
    """Per query: ``dispatch_s`` (its batch starts), ``finish_s`` (its batch ends), ``batch`` (index);
    per batch: ``batches`` rows of (start_s, end_s, queries, samples)."""

    queries: Queries
    dispatch_s: np.ndarray
    finish_s: np.ndarray
    batch: np.ndarray
    batches: list[tuple[float, float, int, int]]
    gpus: int
    distinct_batches: int
    meta: dict[str, Any] = field(default_factory=dict)


def simulate_batching(q: Queries, batcher: BatcherSpec, batch_time: Callable[[int], float], gpus: int,
                      distinct: Callable[[], int] = lambda: 0) -> DlrmResult:
    """The dynamic batcher over ``q`` with one batch in flight; ``batch_time(samples)`` in seconds."""
    n, cap, delay = len(q), batcher.max_batch_samples, batcher.max_queue_delay_us * 1e-6
    a = q.arrival_s
    c = np.concatenate([[0], np.cumsum(q.samples)])
    dispatch, finish, index = np.empty(n), np.empty(n), np.empty(n, dtype=np.int64)
    batches: list[tuple[float, float, int, int]] = []
    free, head = 0.0, 0
    while head < n:
        t = max(free, float(a[head]))
        ready = float(a[head]) + delay
        fill = int(np.searchsorted(c, c[head] + cap, "left"))  # queries head..fill-1 reach the cap
        if fill <= n:
            ready = min(ready, float(a[fill - 1]))
        start = max(t, ready)
        arrived = int(np.searchsorted(a, start, "right"))
        fits = int(np.searchsorted(c, c[head] + cap, "right")) - 1
        end = max(min(arrived, fits), head + 1)
        samples = int(c[end] - c[head])
        stop = start + batch_time(samples)
        dispatch[head:end], finish[head:end], index[head:end] = start, stop, len(batches)
        batches.append((start, stop, end - head, samples))
        free, head = stop, end
    return DlrmResult(q, dispatch, finish, index, batches, gpus, distinct())


def query_table(res: DlrmResult) -> pd.DataFrame:
    """One row per query (times in ms)."""
    q = res.queries
    return pd.DataFrame({
        "query": np.arange(len(q)), "arrival_ms": q.arrival_s * 1e3, "samples": q.samples,
        "queue_ms": (res.dispatch_s - q.arrival_s) * 1e3, "service_ms": (res.finish_s - res.dispatch_s) * 1e3,
        "latency_ms": (res.finish_s - q.arrival_s) * 1e3, "finish_ms": res.finish_s * 1e3, "batch": res.batch,
    })


def _stats(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), **{f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}}


def summarize_dlrm(res: DlrmResult, slo: DlrmSloSpec | None) -> dict[str, Any]:
    """The figures of ``summary.json``."""
    from .metrics import time_average

    t = query_table(res)
    q = res.queries
    t0, t1 = float(q.arrival_s[0]), float(res.finish_s.max())
    span = t1 - t0
    samples = int(q.samples.sum())
    changes = sorted([(float(x), 1) for x in q.arrival_s] + [(float(x), -1) for x in res.finish_s])
    level = np.cumsum([d for _, d in changes])
    in_system = time_average([(tt, int(v)) for (tt, _), v in zip(changes, level, strict=True)], t0, t1)
    lat = t["latency_ms"].to_numpy()
    good = None
    if slo is not None:
        ok = lat <= slo.latency_ms
        good = {"slo_latency_ms": slo.latency_ms, "queries_per_s": float(ok.sum()) / span if span > 0 else None,
                "attained": float(ok.mean()), "p99_meets_slo": bool(np.percentile(lat, 99) <= slo.latency_ms)}
    bs = np.array([b[3] for b in res.batches])
    return {
        "queries": len(q), "samples": samples, "gpus": res.gpus, "duration_s": span,
        "latency_ms": _stats(lat), "queue_ms": _stats(t["queue_ms"].to_numpy()),
        "service_ms": _stats(t["service_ms"].to_numpy()),
        "throughput": {"queries_per_s": len(q) / span if span > 0 else None,
                       "samples_per_s": samples / span if span > 0 else None,
                       "samples_per_s_per_gpu": samples / span / res.gpus if span > 0 else None},
        "goodput": good,
        "batches": len(res.batches), "mean_batch_samples": float(bs.mean()),
        "busy_share": float(sum(b[1] - b[0] for b in res.batches) / span) if span > 0 else 1.0,
        "distinct_batches_timed": res.distinct_batches, "mean_in_system": in_system, **res.meta,
    }


def format_dlrm_summary(s: dict[str, Any]) -> str:
    """The printed summary."""
    def ms(d: dict[str, float]) -> str:
        return f"mean {d['mean']:9.3f}  P50 {d['p50']:9.3f}  P90 {d['p90']:9.3f}  P99 {d['p99']:9.3f}"

    th = s["throughput"]
    lines = [f"{s.get('name', 'serving')}: {s['queries']:,} queries ({s['samples']:,} samples) on {s['gpus']} GPUs"
             + (f" ({s['deployment']})" if s.get("deployment") else ""),
             f"  latency ms {ms(s['latency_ms'])}",
             f"  queue ms   {ms(s['queue_ms'])}",
             f"  service ms {ms(s['service_ms'])}",
             f"  throughput {th['queries_per_s']:,.1f} queries/s, {th['samples_per_s']:,.0f} samples/s "
             f"({th['samples_per_s_per_gpu']:,.0f} per GPU) over {s['duration_s']:.2f} s; {s['batches']:,} batches, "
             f"mean {s['mean_batch_samples']:,.0f} samples, deployment busy {s['busy_share']:.1%}"]
    g = s["goodput"]
    if g is not None:
        lines.append(f"  goodput    {g['queries_per_s']:,.1f} queries/s ({g['attained']:.1%} within "
                     f"{g['slo_latency_ms']:g} ms; P99 {'meets' if g['p99_meets_slo'] else 'misses'} the SLO)")
    return "\n".join(lines)


def sweep_row(rate: float, s: dict[str, Any]) -> dict[str, Any]:
    g = s["goodput"]
    return {"rate_per_s": rate, "queries_per_s": s["throughput"]["queries_per_s"],
            "samples_per_s": s["throughput"]["samples_per_s"],
            "goodput_queries_per_s": g["queries_per_s"] if g else None,
            "latency_p50_ms": s["latency_ms"]["p50"], "latency_p99_ms": s["latency_ms"]["p99"],
            "latency_mean_ms": s["latency_ms"]["mean"], "busy_share": s["busy_share"]}


@dataclass
class DlrmDeployment:
    """The job of the deployment and its batch timer."""

    job: Job
    timer: BatchTimer

    @property
    def label(self) -> str:
        return f"{self.timer.gpus} GPUs, tables sharded over all"


def dlrm_job(serving: DlrmServing) -> Job:
    """The deployment's workload with the serving file's overrides, loaded and validated."""
    from .deploy import overrides_of

    return load_job(serving.workload_path(), overrides_of(serving.spec.deployment))


def build_dlrm(serving: DlrmServing, simulate_bucket: Callable[[Job, int], float] | None = None,
               job: Job | None = None) -> DlrmDeployment:
    """The deployment of ``serving``: its workload (a ``dlrm_inference`` one; ``job`` where already
    loaded, else read from the files) and a batch timer."""
    job = job if job is not None else dlrm_job(serving)
    if job.workload.model.kind != "dlrm_inference":
        raise ConfigError(f"the workload is a {job.workload.model.kind} model; expected a dlrm_inference workload",
                          file=serving.file, key="deployment.workload")
    timer = BatchTimer(job, serving.spec.batcher.bucket_samples_per_gpu, simulate_bucket)
    most = serving.spec.batcher.max_batch_samples
    try:  # a full batch first: one that does not fit is refused before any query is served
        timer(most)
    except ConfigError as e:
        why = e.message.replace("training.batch_per_gpu", "batcher.max_batch_samples")
        raise ConfigError(f"a full batch of {most:,} samples ({timer.per_gpu(most):,} per GPU): {why}",
                          file=serving.file, key="batcher.max_batch_samples") from None
    return DlrmDeployment(job, timer)


def serve_dlrm(serving: DlrmServing, deployment: DlrmDeployment,
               rate_per_s: float | None = None) -> tuple[DlrmResult, dict[str, Any]]:
    """Simulate ``serving`` on ``deployment`` (at ``rate_per_s`` instead of its own rate, if given)."""
    spec = serving.spec
    q = make_queries(spec.queries, spec.seed, rate_per_s)
    timer = deployment.timer
    res = simulate_batching(q, spec.batcher, timer, timer.gpus, lambda: len(timer.cache))
    res.meta.update(name=spec.name, deployment=deployment.label, platform=deployment.job.platform.name,
                    seed=spec.seed, rate_per_s=rate_per_s or spec.queries.rate_per_s,
                    max_batch_samples=spec.batcher.max_batch_samples,
                    max_queue_delay_us=spec.batcher.max_queue_delay_us, overrides=list(serving.overrides))
    return res, summarize_dlrm(res, spec.slo)


def latency_cdf(table: pd.DataFrame, path: Path, title: str, slo_ms: float | None) -> None:
    """CDFs of the queue wait and the latency (ms, log x axis), with the SLO as a vertical line."""
    from .outputs import cdf_axis, one_axis_figure

    fig, ax = one_axis_figure(8, 4)
    cdf_axis(ax, [(table[col].to_numpy(dtype=float), label) for col, label in
                  (("latency_ms", "latency"), ("queue_ms", "queue wait"), ("service_ms", "service"))], slo_ms, "ms")
    ax.set_xlim(left=0.1 * float(table["service_ms"].min()))  # the shortest waits would stretch the axis
    ax.set_ylabel("share of queries")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, format="png")


def load_plot(sweep: pd.DataFrame, path: Path, title: str) -> None:
    """Queries/s and latency percentiles against the arrival rate."""
    from .outputs import load_plot as plot

    plot(sweep, path, title, unit="queries", served_axis="queries/s",
         served=(("queries_per_s", "queries/s"), ("goodput_queries_per_s", "within SLO")),
         latencies=(("latency_p50_ms", "latency P50"), ("latency_p99_ms", "latency P99"),
                    ("latency_mean_ms", "latency mean")))


def write_dlrm_outputs(res: DlrmResult, summary: dict[str, Any], out: Path, *, plots: bool = True,
                       sweep: pd.DataFrame | None = None) -> dict[str, Path]:
    """``requests.csv`` (one row per query), ``summary.json``, ``latency_cdf.png`` and, with a sweep,
    ``sweep.csv`` and ``throughput_vs_load.png``; returns them by name."""
    out.mkdir(parents=True, exist_ok=True)
    name = str(summary.get("name", "serving"))
    paths = {"requests": out / "requests.csv", "summary": out / "summary.json"}
    table = query_table(res)
    table.to_csv(paths["requests"], index=False, float_format="%.4f")
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str) + "\n")
    g = summary.get("goodput")
    if plots:
        paths["cdf"] = out / "latency_cdf.png"
        latency_cdf(table, paths["cdf"], f"{name}: latency CDFs", g["slo_latency_ms"] if g else None)
    if sweep is not None and len(sweep):
        paths["sweep"] = out / "sweep.csv"
        sweep.to_csv(paths["sweep"], index=False)
        if plots:
            paths["load"] = out / "throughput_vs_load.png"
            load_plot(sweep, paths["load"], f"{name}: throughput and latency against load")
    return paths


def run_dlrm(file: str, overrides: list[str], out: Path | None, rates: list[float] | None, plots: bool,
             quiet: bool) -> int:
    """``python -m simgpu.serve`` on a DLRM serving file."""
    import time

    from ..cli import out_dir

    serving = load_dlrm_serving(file, overrides)
    spec = serving.spec
    key = "--sweep" if rates else "outputs.sweep_rates_per_s"
    rates = rates or spec.outputs.sweep_rates_per_s
    if rates and spec.queries.kind == "fixed":
        raise ConfigError("a sweep of arrival rates needs poisson queries; expected queries.kind poisson",
                          file=file, key=key)
    out = out_dir(out, spec.name)
    t0 = time.perf_counter()
    deployment = build_dlrm(serving)
    res, summary = serve_dlrm(serving, deployment)
    sweep = pd.DataFrame([sweep_row(r, serve_dlrm(serving, deployment, r)[1]) for r in rates]) if rates else None
    wall = time.perf_counter() - t0
    summary["wall_s"] = round(wall, 3)
    paths = write_dlrm_outputs(res, summary, out, plots=plots, sweep=sweep)
    if quiet:
        th, lat = summary["throughput"], summary["latency_ms"]
        print(f"{th['queries_per_s']:.1f} queries/s, latency P99 {lat['p99']:.3f} ms")
        return 0
    print(format_dlrm_summary(summary))
    if sweep is not None:
        print("\n" + sweep.to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
    print(f"\nsimulated {len(res.queries):,} queries ({len(res.batches):,} batches, {len(deployment.timer.cache)} "
          f"distinct batch sizes timed) in {wall:.2f} s; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0

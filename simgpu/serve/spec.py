"""The serving file: which deployment(s) serve, which requests arrive, how batches are formed.

A serving YAML names its deployment by an inference workload file plus overrides
(``deployment: {workload: ../inference/x.yaml, set: {parallelism.tp: 4}}``), or, disaggregated, a
``prefill`` and a ``decode`` pool each named that way; then its request source, scheduler, SLOs
and seed. :func:`load_serving` reads and validates it; every problem is one
:class:`~simgpu.errors.ConfigError` naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..config.base import Spec
from ..config.checks import check_requests
from ..config.loader import apply_override, check_name, job_kind, parse_override, read_yaml, resolve_path, validate
from ..errors import ConfigError

SCHEDULERS = ("static", "continuous", "chunked", "prefill_first", "framework")


class DeploymentSpec(Spec):
    """One pool of model replicas: an inference workload file and overrides of its keys."""

    workload: str = Field(description="an inference workload YAML, relative to the serving file or absolute")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides of the workload: key.path -> value")


class LengthSpec(Spec):
    """Token counts drawn per request: lognormal with a mean (tokens), clipped to [min, max]."""

    dist: Literal["fixed", "uniform", "lognormal"] = Field("lognormal", description="fixed, uniform or lognormal")
    mean: float = Field(gt=0, description="mean tokens (before clipping)")
    sigma: float = Field(0.8, gt=0, description="lognormal shape (std of log tokens)")
    min: int = Field(1, ge=1, description="fewest tokens")
    max: int = Field(4096, ge=1, description="most tokens")

    @model_validator(mode="after")
    def _order(self) -> LengthSpec:
        if self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}; expected min <= max")
        return self


class RequestsSpec(Spec):
    """Where requests come from: ``poisson`` arrivals at a rate, ``fixed`` (all at time 0, offline
    throughput), ``trace`` (a CSV of arrival times and token counts, e.g. Azure's) or
    ``closed_loop`` (the serving benchmarks' load: ``concurrency`` clients, each sending its next
    request the moment its last one finishes, ``count`` requests in all; the first ``warmup`` sent,
    by default the first wave of ``concurrency``, are left out of the latency figures)."""

    kind: Literal["poisson", "fixed", "trace", "closed_loop"] = Field(
        description="poisson, fixed, trace or closed_loop")
    concurrency: int | None = Field(None, ge=1, description="closed_loop: clients, each with one request in flight")
    warmup: int | None = Field(None, ge=0, description="closed_loop: requests left out of the latency figures at the "
                               "start (default: the first wave, concurrency of them)")
    count: int | None = Field(None, ge=1, description="requests to simulate (a trace: at most this many)")
    rate_per_s: float | None = Field(None, gt=0, description="poisson: mean arrivals per second; trace: rescale "
                                     "the trace's arrivals to this mean rate")
    prompt_tokens: int | LengthSpec | None = Field(None, description="poisson / fixed: prompt tokens per request")
    output_tokens: int | LengthSpec | None = Field(None, description="poisson / fixed: output tokens per request")
    file: str | None = Field(None, description="trace: CSV with TIMESTAMP, ContextTokens, GeneratedTokens columns "
                                "(a path, or data:<path> in the shared data folder)")
    skip: int = Field(0, ge=0, description="trace: rows skipped from the start")

    @field_validator("prompt_tokens", "output_tokens")
    @classmethod
    def _at_least_one(cls, v: int | LengthSpec | None) -> int | LengthSpec | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"expected a token count >= 1 (a request has at least one prompt and one output "
                             f"token), got {v}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> RequestsSpec:
        if self.kind == "trace":
            if not self.file:
                raise ValueError("a trace needs file; expected the path of a CSV trace")
        else:
            if self.count is None:
                raise ValueError(f"{self.kind} requests need count; expected the number of requests")
            if self.prompt_tokens is None or self.output_tokens is None:
                raise ValueError(f"{self.kind} requests need prompt_tokens and output_tokens; expected a token "
                                 "count or a distribution {dist, mean, max}")
            if self.kind == "poisson" and self.rate_per_s is None:
                raise ValueError("poisson requests need rate_per_s; expected arrivals per second")
        if self.kind == "closed_loop":
            if self.concurrency is None:
                raise ValueError("closed_loop requests need concurrency; expected the number of clients (>= 1)")
            if self.rate_per_s is not None:
                raise ValueError("closed_loop requests arrive as others finish; expected no rate_per_s")
            if self.count is not None and self.count <= self.warmup_count:
                raise ValueError(f"count {self.count} leaves no request after the {self.warmup_count} of the warm-up; "
                                 "expected more requests than warmup")
        elif self.concurrency is not None or self.warmup is not None:
            raise ValueError(f"concurrency and warmup are a closed loop's; expected kind: closed_loop, not {self.kind}")
        return self

    @property
    def warmup_count(self) -> int:
        """Requests left out of the latency figures (a closed loop's warm-up; none otherwise)."""
        if self.kind != "closed_loop":
            return 0
        return self.warmup if self.warmup is not None else int(self.concurrency or 0)


class SchedulerSpec(Spec):
    """How each iteration's batch is formed on a replica."""

    kind: str = Field("continuous", description="static, continuous (vLLM V0), chunked (Sarathi-Serve; vLLM V1 "
                      "and TensorRT-LLM mix prompt chunks and decodes this way), prefill_first (SGLang: "
                      "prefill and decode batches apart, prompts first) or framework (the default of the "
                      "deployment's inference.framework: chunked for vllm and tensorrt_llm, prefill_first "
                      "for sglang)")
    max_batch: int = Field(256, ge=1, description="most requests in one iteration's batch")
    max_tokens: int = Field(8192, ge=1, description="most tokens in one iteration (chunked: the token budget; "
                            "continuous: prompt tokens admitted per iteration; prefill_first: prompt tokens in a "
                            "prefill batch)")
    routing: Literal["least_loaded", "round_robin"] = Field(
        "least_loaded", description="which replica an arriving request goes to")

    @model_validator(mode="after")
    def _known(self) -> SchedulerSpec:
        if self.kind not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.kind!r}; expected one of: {', '.join(SCHEDULERS)}")
        return self


class SloSpec(Spec):
    """Latency objectives a request must meet to count in goodput (at P99 for the pass/fail line)."""

    ttft_ms: float = Field(2000.0, gt=0, description="time to first token, ms")
    tpot_ms: float = Field(200.0, gt=0, description="time per output token after the first, ms")


class TimingSpec(Spec):
    """How steps are shaped for the timer (which times each distinct shape once)."""

    context_bucket_tokens: int = Field(
        64, ge=1, description="decode KV lengths are timed as their mean, rounded up to a multiple of this")
    prefill_bucket_tokens: int = Field(32, ge=1, description="prefill chunks are timed rounded up to this")
    mode: Literal["additive", "direct"] = Field(
        "additive", description="additive: steps timed from small interpolated tables (see simgpu.serve.loop); "
        "direct: every distinct step shape timed by the engine")
    grid_per_octave: int = Field(8, ge=1, description="additive: grid points per doubling of a count")


class OutputSpec(Spec):
    """Extras of the outputs."""

    gantt_iterations: int = Field(80, ge=0, description="iterations drawn in the Gantt chart (from the middle)")
    sweep_rates_per_s: list[float] = Field(default_factory=list, description="arrival rates of the "
                                           "throughput-vs-load sweep (poisson / trace), none for no sweep")


class ServingSpec(Spec):
    """A serving file."""

    name: str = Field(description="the run's name (default output folder out/<name>)")
    seed: int = Field(0, description="seed of the request draws")
    deployment: DeploymentSpec | None = Field(None, description="the replicas serving both phases")
    prefill: DeploymentSpec | None = Field(None, description="disaggregated: the prefill pool")
    decode: DeploymentSpec | None = Field(None, description="disaggregated: the decode pool")
    requests: RequestsSpec = Field(description="the request source")
    scheduler: SchedulerSpec = Field(default_factory=lambda: SchedulerSpec())
    slo: SloSpec = Field(default_factory=lambda: SloSpec())
    timing: TimingSpec = Field(default_factory=lambda: TimingSpec())
    outputs: OutputSpec = Field(default_factory=lambda: OutputSpec())

    @model_validator(mode="after")
    def _pools(self) -> ServingSpec:
        split = self.prefill is not None or self.decode is not None
        if self.deployment is not None and split:
            raise ValueError("give deployment, or prefill and decode; expected one of the two")
        if self.deployment is None and not (self.prefill is not None and self.decode is not None):
            raise ValueError("missing deployment; expected deployment, or both prefill and decode pools")
        return self

    @property
    def disaggregated(self) -> bool:
        return self.deployment is None


@dataclass(frozen=True)
class Serving:
    """A validated serving file and where it was read from."""

    spec: ServingSpec
    file: str
    overrides: tuple[str, ...] = ()

    def resolve(self, ref: str) -> Path:
        """A path from the file (see :func:`~simgpu.config.loader.resolve_path`)."""
        return resolve_path(self.file, ref)


def load_serving(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> Serving:
    """Read a serving file with ``--set`` overrides (``scheduler.max_batch=64``) and validate it."""
    file = str(path)
    if job_kind(path, overrides, "serving") == "dlrm_serving":
        raise ConfigError("the deployment is a dlrm_inference workload, served by the dynamic batcher of "
                          "simgpu.serve.dlrm (python -m simgpu.serve); expected an LLM inference workload here",
                          file=file, key="deployment.workload")
    data, lines = read_yaml(path, "serving")
    for item in overrides:
        key, value = parse_override(item)
        apply_override(data, key, value, file)
    unknown = _rename_scheduler_error(data)
    if unknown:
        raise ConfigError(unknown, file=file, key="scheduler.kind", line=lines.get(("scheduler", "kind")))
    spec = validate(ServingSpec, data, file, lines)
    check_name(spec.name, file, lines.get(("name",)))
    serving = Serving(spec, file, tuple(overrides))
    r = spec.requests
    if r.kind != "trace" and r.count is not None:  # a trace's count is a cap on rows already read
        check_requests(r.count, file=file, line=lines.get(("requests", "count")))
    if r.kind == "trace" and r.file:
        trace = serving.resolve(r.file)
        if not trace.is_file():
            raise ConfigError(f"trace file {r.file!r} not found; expected a CSV trace, relative to the serving file "
                              "or absolute", file=file, key="requests.file", line=lines.get(("requests", "file")))
    for pool in ("deployment", "prefill", "decode"):
        dep = getattr(spec, pool)
        if dep is not None and not serving.resolve(dep.workload).is_file():
            raise ConfigError(f"workload {dep.workload!r} not found; expected an inference workload YAML, relative "
                              "to the serving file or absolute", file=file, key=f"{pool}.workload",
                              line=lines.get((pool, "workload")))
    return serving


def _rename_scheduler_error(data: dict[str, Any]) -> str | None:
    sched = data.get("scheduler")
    if isinstance(sched, dict) and isinstance(sched.get("kind"), str) and sched["kind"] not in SCHEDULERS:
        return f"unknown scheduler {sched['kind']!r}; expected one of: {', '.join(SCHEDULERS)}"
    return None

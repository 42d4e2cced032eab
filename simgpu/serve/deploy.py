"""From a serving file to what the loop runs: the pools' timers, the request list, the network.

Each pool's inference workload (with the serving file's overrides) is loaded as a job and given to
:func:`simgpu.serve.timer.make_timer`. Disaggregated, the two pools must share a platform: the
prefill pool takes the first nodes and the decode pool the nodes after it, and the KV transfers run
over the :class:`~simgpu.platform.topology.Topology` of all of them. :func:`load` reads at once all
that a run reads from files (the pools' jobs, a trace's requests) into a :class:`Loaded` that
pickles: built and served elsewhere (on a Dask worker), it reads none of them again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.loader import Job, load_job
from ..errors import ConfigError
from .loop import Network, Pool, ServeResult, check_fits, simulate_serving
from .metrics import summarize
from .requests import Requests, make_requests, read_trace
from .spec import DeploymentSpec, SchedulerSpec, Serving


def overrides_of(dep: DeploymentSpec) -> list[str]:
    """A deployment's ``set`` as ``--set`` items; a nested mapping sets the keys inside it
    (``set: {parallelism: {tp: 8}}`` is ``parallelism.tp=8``, as ``--set deployment.set.parallelism.tp=8`` gives)."""
    def flat(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict) and value:
            return [item for k, v in value.items() for item in flat(f"{prefix}.{k}", v)]
        return [f"{prefix}={value if isinstance(value, str) else json.dumps(value)}"]
    return [item for k, v in dep.set.items() for item in flat(k, v)]


def check_memory(serving: Serving, deployment: Deployment) -> None:
    """Refuse a pool whose replica has no room for a single KV block once its weights are loaded."""
    for key, pool in zip(pool_keys(serving), deployment.pools, strict=True):
        mem = pool.timer.memory
        if mem.kv_blocks // pool.stages < 1:  # each virtual engine needs a block (pipeline parallel)
            gib = 2 ** 30
            need = mem.weights_bytes + mem.activation_bytes + mem.workspace_bytes
            raise ConfigError(
                f"the model does not fit: {pool.name} replicas of {pool.timer.replica_gpus} GPU(s) need "
                f"{need / gib:.1f} GiB per GPU (weights {mem.weights_bytes / gib:.1f}, activations "
                f"{mem.activation_bytes / gib:.1f}, workspace {mem.workspace_bytes / gib:.1f}) before any KV cache, "
                f"of {mem.gpu_bytes / gib:.1f} GiB; expected more GPUs per replica (parallelism.tp / pp) or a "
                "smaller precision", file=serving.file, key=f"{key}.set")


#: the scheduler's limits and the inference workload keys whose memory plan must hold them
LIMITS = (("scheduler.max_batch", "inference.max_batch_size"), ("scheduler.max_tokens", "inference.max_batch_tokens"))


def pool_job(serving: Serving, key: str) -> Job:
    """A pool's inference job. Its memory plan reserves room for the largest iteration the
    scheduler forms: ``inference.max_batch_size`` and ``max_batch_tokens`` are the scheduler's
    ``max_batch`` and ``max_tokens`` unless the deployment sets them, and one set below the
    scheduler's limit is refused."""
    dep = getattr(serving.spec, key)
    over = overrides_of(dep)
    given = {item.split("=", 1)[0] for item in over}
    sched = serving.spec.scheduler
    limits = {"scheduler.max_batch": sched.max_batch, "scheduler.max_tokens": sched.max_tokens}
    over += [f"{wkey}={limits[skey]}" for skey, wkey in LIMITS if wkey not in given]
    job = load_job(serving.resolve(dep.workload), over)
    inf = job.workload.inference
    if inf is not None:
        for skey, wkey in LIMITS:
            held = getattr(inf, wkey.split(".", 1)[1])
            if held < limits[skey]:
                raise ConfigError(f"{skey} = {limits[skey]:,} but the deployment's {wkey} is {held:,}; expected "
                                  f"{wkey} >= {skey} (or leave it unset: it follows the scheduler)",
                                  file=serving.file, key=f"{key}.set.{wkey}")
    return job


def _timer(job: Job) -> Any:
    from .timer import make_timer

    return make_timer(job)


@dataclass
class Deployment:
    """The pools of a serving file, their jobs and the network between them."""

    pools: list[Pool]
    jobs: list[Job]
    network: Network | None

    @property
    def label(self) -> str:
        return " + ".join(f"{p.name} {p.timer.replicas} x {p.timer.replica_gpus} GPUs"
                          + (f" ({p.stages} stages, {p.stages} batches in flight)" if p.stages > 1 else "")
                          for p in self.pools)


def pool_keys(serving: Serving) -> list[str]:
    """The keys of the serving file's pools: ``deployment``, or ``prefill`` and ``decode``."""
    return ["prefill", "decode"] if serving.spec.disaggregated else ["deployment"]


@dataclass(frozen=True)
class Loaded:
    """A serving file with all that its run reads from files: the file validated after its overrides,
    each pool's job (workload and platform validated, by pool key) and a trace's requests as read
    (before any rescaling), or the error reading it gave, raised by :func:`serve` where it would
    read the trace. It pickles: built and served on another machine, it needs none of the files."""

    serving: Serving
    jobs: dict[str, Job]
    trace: Requests | ConfigError | None = None


def load(serving: Serving) -> Loaded:
    """Read the pools' jobs and the trace of ``serving`` (each pool's job refused as :func:`build` would)."""
    jobs = {key: pool_job(serving, key) for key in pool_keys(serving)}
    r = serving.spec.requests
    trace: Requests | ConfigError | None = None
    if r.kind == "trace" and r.file:
        try:
            trace = read_trace(serving.resolve(r.file), skip=r.skip, count=r.count)
        except ConfigError as e:
            trace = e
    return Loaded(serving, jobs, trace)


def serve_loaded(loaded: Loaded, rate_per_s: float | None = None) -> tuple[ServeResult, dict[str, Any]]:
    """:func:`build` and :func:`serve` of a loaded serving file, reading none of its files."""
    deployment = build(loaded.serving, jobs=loaded.jobs)
    return serve(loaded.serving, deployment, rate_per_s, trace=loaded.trace)


def build(serving: Serving, make_timer: Callable[[Job], Any] = _timer,
          jobs: Mapping[str, Job] | None = None) -> Deployment:
    """The deployment of ``serving``: one pool, or a prefill pool and a decode pool (their jobs
    ``jobs`` by pool key where already loaded, else read from the files)."""
    from ..config.checks import gpus_per_node

    def job_of(key: str) -> Job:
        return jobs[key] if jobs is not None else pool_job(serving, key)

    spec = serving.spec
    if not spec.disaggregated:
        job = job_of("deployment")
        return Deployment([Pool("replica", make_timer(job))], [job], None)
    jp, jd = job_of("prefill"), job_of("decode")
    if jp.platform != jd.platform:
        raise ConfigError(f"the decode pool runs on {jd.platform.name} but the prefill pool on {jp.platform.name}; "
                          "expected both pools on one platform", file=serving.file, key="decode.workload")
    gpn = gpus_per_node(jp)
    if gpus_per_node(jd) != gpn:
        raise ConfigError(f"the decode pool uses {gpus_per_node(jd)} GPUs per node but the prefill pool {gpn}; "
                          "expected the same", file=serving.file, key="decode.workload")
    tp, td = make_timer(jp), make_timer(jd)
    prefill = Pool("prefill", tp, "prefill", 0)
    decode = Pool("decode", td, "decode", jp.workload.nodes * gpn)
    from ..platform.topology import Topology

    topo = Topology(jp.platform, jp.workload.nodes + jd.workload.nodes, gpn)
    return Deployment([prefill, decode], [jp, jd], Network(topo.route, topo.route_latency, topo.capacity))


def requests_of(serving: Serving, rate_per_s: float | None = None,
                trace: Requests | ConfigError | None = None) -> Requests:
    """The requests of ``serving``: drawn, or a trace's (``trace``: as :func:`load` read it, else read here)."""
    r = serving.spec.requests
    if isinstance(trace, ConfigError):
        raise trace
    read: Requests | Path | None = trace if trace is not None else (
        serving.resolve(r.file) if r.kind == "trace" and r.file else None)
    return make_requests(r, serving.spec.seed, read, rate_per_s)


def check_slo(serving: Serving, deployment: Deployment, reqs: Requests) -> None:
    """Refuse SLOs that no request can meet: a TTFT below the prefill of the shortest prompt alone,
    or a TPOT below a decode iteration of one request alone."""
    from ..workload.inference.api import Step

    slo, pools = serving.spec.slo, deployment.pools
    shortest = int(reqs.prompt.min())
    prefill_s = float(pools[0].timer.time([Step(prefill=((shortest, 0),))])[0])
    decode_s = float(pools[-1].timer.time([Step(decode=(shortest,))])[0])
    if slo.ttft_ms < prefill_s * 1e3:
        raise ConfigError(f"{slo.ttft_ms:g} ms can never be met: the shortest prompt ({shortest} tokens) alone takes "
                          f"{prefill_s * 1e3:.1f} ms to prefill; expected at least that", file=serving.file,
                          key="slo.ttft_ms")
    if slo.tpot_ms < decode_s * 1e3:
        raise ConfigError(f"{slo.tpot_ms:g} ms can never be met: one request alone takes {decode_s * 1e3:.1f} ms "
                          "per decode iteration; expected at least that", file=serving.file, key="slo.tpot_ms")


#: Each framework's default batching (``scheduler.kind: framework``): vLLM's V1 engine and
#: TensorRT-LLM's in-flight batching put prompt chunks and decodes in one batch; SGLang runs
#: prefill batches apart from decode ones, and first.
FRAMEWORK_SCHEDULERS = {"vllm": "chunked", "tensorrt_llm": "chunked", "sglang": "prefill_first"}


def scheduler_of(serving: Serving, jobs: list[Job]) -> SchedulerSpec:
    """The serving file's scheduler, ``framework`` resolved to the pools' framework's own batching."""
    sched = serving.spec.scheduler
    if sched.kind != "framework":
        return sched
    frameworks = sorted({j.workload.inference.framework for j in jobs if j.workload.inference is not None})
    if len(frameworks) != 1:
        raise ConfigError(f"the pools run {' and '.join(frameworks)}; expected one framework for "
                          "scheduler.kind: framework (or name the scheduler)", file=serving.file, key="scheduler.kind")
    return sched.model_copy(update={"kind": FRAMEWORK_SCHEDULERS[frameworks[0]]})


def serve(serving: Serving, deployment: Deployment, rate_per_s: float | None = None,
          progress: Callable[[int, int], None] | None = None,
          trace: Requests | ConfigError | None = None, *,
          check_slos: bool = True) -> tuple[ServeResult, dict[str, Any]]:
    """Simulate ``serving`` on ``deployment`` (at ``rate_per_s`` instead of its own rate, if given;
    ``trace``: the trace's requests as :func:`load` read them; ``check_slos=False``: SLOs no request
    can meet are not refused, as in a draw of ``--uncertainty`` slower than the point)."""
    spec = serving.spec
    reqs = requests_of(serving, rate_per_s, trace)
    check_memory(serving, deployment)
    try:
        check_fits(reqs, deployment.pools)
    except ConfigError as e:
        raise ConfigError(e.message, file=serving.file, key=e.key) from None
    if check_slos:
        check_slo(serving, deployment, reqs)
    closed = spec.requests.concurrency if spec.requests.kind == "closed_loop" else None
    sched = scheduler_of(serving, deployment.jobs)
    res = simulate_serving(reqs, deployment.pools, sched, spec.timing, deployment.network, progress,
                           concurrency=closed, warmup=spec.requests.warmup_count)
    res.meta.update(name=spec.name, deployment=deployment.label, scheduler=sched.kind,
                    platform=deployment.jobs[0].platform.name, seed=spec.seed,
                    rate_per_s=rate_per_s or spec.requests.rate_per_s, overrides=list(serving.overrides))
    return res, summarize(res, spec.slo)

"""From a serving file to what the loop runs: the pools' timers, the request list, the network.

Each pool's inference workload (with the serving file's overrides) is loaded as a job and given to
:func:`simgpu.workload.inference.make_timer`. Disaggregated, the two pools must share a platform:
the prefill pool takes the first nodes and the decode pool the nodes after it, and the KV transfers
run over the :class:`~simgpu.platform.topology.Topology` of all of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.loader import Job, load_job
from ..errors import ConfigError
from .loop import Network, Pool, ServeResult, check_fits, simulate_serving
from .metrics import summarize
from .requests import Requests, make_requests
from .spec import DeploymentSpec, Serving


def overrides_of(dep: DeploymentSpec) -> list[str]:
    """A deployment's ``set`` as ``--set`` items."""
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in dep.set.items()]


def pool_job(serving: Serving, key: str) -> Job:
    dep = getattr(serving.spec, key)
    return load_job(serving.resolve(dep.workload), overrides_of(dep))


def _timer(job: Job) -> Any:
    from ..workload.inference import make_timer

    return make_timer(job)


@dataclass
class Deployment:
    """The pools of a serving file, their jobs and the network between them."""

    pools: list[Pool]
    jobs: list[Job]
    network: Network | None

    @property
    def label(self) -> str:
        return " + ".join(f"{p.name} {p.timer.replicas} x {p.timer.replica_gpus} GPUs" for p in self.pools)


def build(serving: Serving, make_timer: Callable[[Job], Any] = _timer) -> Deployment:
    """The deployment of ``serving``: one pool, or a prefill pool and a decode pool."""
    from ..config.checks import gpus_per_node

    spec = serving.spec
    if not spec.disaggregated:
        job = pool_job(serving, "deployment")
        return Deployment([Pool("replica", make_timer(job))], [job], None)
    jp, jd = pool_job(serving, "prefill"), pool_job(serving, "decode")
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


def requests_of(serving: Serving, rate_per_s: float | None = None) -> Requests:
    r = serving.spec.requests
    trace = serving.resolve(r.file) if r.kind == "trace" and r.file else None
    return make_requests(r, serving.spec.seed, trace, rate_per_s)


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


def serve(serving: Serving, deployment: Deployment, rate_per_s: float | None = None,
          progress: Callable[[int, int], None] | None = None) -> tuple[ServeResult, dict[str, Any]]:
    """Simulate ``serving`` on ``deployment`` (at ``rate_per_s`` instead of its own rate, if given)."""
    spec = serving.spec
    reqs = requests_of(serving, rate_per_s)
    check_slo(serving, deployment, reqs)
    try:
        check_fits(reqs, deployment.pools)
    except ConfigError as e:
        raise ConfigError(e.message, file=serving.file, key=e.key) from None
    res = simulate_serving(reqs, deployment.pools, spec.scheduler, spec.timing, deployment.network, progress)
    res.meta.update(name=spec.name, deployment=deployment.label, scheduler=spec.scheduler.kind,
                    platform=deployment.jobs[0].platform.name, seed=spec.seed,
                    rate_per_s=rate_per_s or spec.requests.rate_per_s, overrides=list(serving.overrides))
    return res, summarize(res, spec.slo)

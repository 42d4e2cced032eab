"""The goodput file: a training job, how often it is interrupted, and what a checkpoint costs.

::

    name: llama3_405b_16k_h100
    job:                              # a workload to simulate one iteration of ...
      workload: ../gpt_2x_dgx_h100.yaml
    # ... or the job's figures directly: iteration_s, gpus, state_gib
    failures:                         # per-component MTBF ...
      mtbf_hours_per_gpu: 50000
      node: {mtbf_hours: 100000, count: 2}
    # ... or a measured rate: interruptions, days, gpus
    checkpoint:
      storage_gbytes_per_s: 100       # or checkpoint_s
      restart_s: 600
      interval_s: 1800                # optional: without it, the best interval is used

:func:`load_goodput` reads and validates the file and resolves the job: with ``workload`` the
iteration is simulated (:func:`simgpu.simulate`) for its time and GPU count, and the checkpoint state
is estimated from the memory estimate (:func:`checkpoint_state_gib`). Every failure is a
:class:`~simgpu.errors.ConfigError` naming the file, the key and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from ..config.base import Spec
from ..config.loader import Job, check_name, load_job, read_yaml, resolve_path, validate
from ..errors import ConfigError

HOUR = 3600.0
DAY = 24 * HOUR


class JobPart(Spec):
    """The training job: a workload to simulate, or its figures given directly."""

    workload: str | None = Field(
        None, description="a workload YAML (relative to this file): one iteration is simulated for its time and "
                          "GPU count, and the checkpoint state is estimated from its memory estimate")
    iteration_s: PositiveFloat | None = Field(None, description="seconds per training iteration (without workload)")
    gpus: PositiveInt | None = Field(None, description="GPUs of the job (without workload)")
    state_gib: PositiveFloat | None = Field(
        None, description="GiB a checkpoint writes (weights and optimizer states of the whole job); with a "
                          "workload it replaces the estimate")

    @model_validator(mode="after")
    def _one_source(self) -> JobPart:
        if self.workload is not None:
            given = [k for k in ("iteration_s", "gpus") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{given[0]} comes from the workload; expected workload or iteration_s and gpus, "
                                 "not both")
        elif self.iteration_s is None or self.gpus is None:
            missing = "iteration_s" if self.iteration_s is None else "gpus"
            raise ValueError(f"missing {missing}; expected workload: <path> or both iteration_s and gpus")
        return self


class Component(Spec):
    """A kind of component whose failure interrupts the job."""

    mtbf_hours: PositiveFloat = Field(description="mean time between failures of one such component, hours")
    count: PositiveInt | None = Field(
        None, description="how many the job uses (node: default the workload's nodes; network: default 1)")


class Failures(Spec):
    """How often the job is interrupted: per-component MTBFs, or a measured interruption rate."""

    mtbf_hours_per_gpu: PositiveFloat | None = Field(
        None, description="mean time between failures of one GPU, hours (the job's rate grows with its GPUs)")
    node: Component | None = Field(None, description="host failures (CPU, memory, NIC, power): MTBF of one node")
    network: Component | None = Field(None, description="network failures (switches, links): MTBF of one unit")
    interruptions: PositiveInt | None = Field(None, description="measured: job interruptions counted ...")
    days: PositiveFloat | None = Field(None, description="measured: ... over this many days ...")
    gpus: PositiveInt | None = Field(None, description="measured: ... on this many GPUs (the rate scales per GPU)")

    @model_validator(mode="after")
    def _one_model(self) -> Failures:
        measured = [k for k in ("interruptions", "days", "gpus") if getattr(self, k) is not None]
        mtbf = [k for k in ("mtbf_hours_per_gpu", "node", "network") if getattr(self, k) is not None]
        if measured and mtbf:
            raise ValueError(f"{mtbf[0]} is a per-component MTBF and {measured[0]} a measured rate; expected one of "
                             "the two")
        if measured and len(measured) < 3:
            missing = next(k for k in ("interruptions", "days", "gpus") if k not in measured)
            raise ValueError(f"missing {missing}; expected a measured rate as interruptions, days and gpus")
        if not measured and self.mtbf_hours_per_gpu is None:
            raise ValueError("missing mtbf_hours_per_gpu; expected a per-GPU MTBF (with optional node and network) "
                             "or a measured rate (interruptions, days, gpus)")
        return self


class Checkpoint(Spec):
    """What a checkpoint and a restart cost, and how often checkpoints are taken."""

    storage_gbytes_per_s: PositiveFloat | None = Field(
        None, description="aggregate write bandwidth of the checkpoint storage, GB/s (1e9 bytes): a checkpoint "
                          "takes state / bandwidth")
    checkpoint_s: PositiveFloat | None = Field(None, description="seconds one checkpoint stalls training")
    restart_s: NonNegativeFloat = Field(
        description="seconds from a failure to training again: detection, rescheduling, restart and reload")
    interval_s: PositiveFloat | None = Field(
        None, description="seconds of training between checkpoints; absent: the best interval")

    @model_validator(mode="after")
    def _one_cost(self) -> Checkpoint:
        if (self.storage_gbytes_per_s is None) == (self.checkpoint_s is None):
            raise ValueError("expected one of storage_gbytes_per_s and checkpoint_s" +
                             (", not both" if self.checkpoint_s is not None else ""))
        return self


class MonteCarlo(Spec):
    """The simulated failure timelines."""

    replicas: PositiveInt = Field(64, description="independent timelines (their spread gives the standard error)")
    horizon_mtbf: PositiveFloat = Field(
        400.0, description="wall time each timeline covers, in mean times between the job's failures")
    points: int = Field(25, ge=5, le=200, description="checkpoint intervals on the goodput curve")


class GoodputSpec(Spec):
    """A goodput file (``simgpu goodput``)."""

    name: str = Field(description="names the output folder")
    job: JobPart = Field(description="the training job")
    failures: Failures = Field(description="how often the job is interrupted")
    checkpoint: Checkpoint = Field(description="checkpoint and restart costs")
    monte_carlo: MonteCarlo = Field(MonteCarlo(), description="the simulated failure timelines")
    scale_gpus: list[PositiveInt] | None = Field(
        None, min_length=1, description="cluster sizes of the goodput-against-size panel; default powers of two "
                                        "around the job's")
    seed: int = Field(0, ge=0, description="seed of the failure timelines")


@dataclass(frozen=True)
class Goodput:
    """A goodput file with its job resolved: the figures the model needs, in seconds."""

    spec: GoodputSpec
    file: str
    iteration_s: float
    gpus: int
    state_gib: float | None
    state_note: str
    rate_per_s: float                  # the job's interruptions per second at ``gpus``
    components: tuple[dict[str, Any], ...]
    checkpoint_s: float
    restart_s: float
    workload_file: str | None = None

    @property
    def mtbf_s(self) -> float:
        return 1.0 / self.rate_per_s


def checkpoint_state_gib(job: Job, memory_gib: list[dict[str, float]]) -> tuple[float, str]:
    """GiB of one copy of the job's weights and optimizer states, with how it was found.

    From the memory estimate per GPU (:mod:`simgpu.workload.transformer.memory`): each GPU's fp32
    gradients give its parameter count (4 bytes each, sharded over the dp x cp replicas from ZeRO 2);
    summed over the GPUs and divided by the replicas, one copy's parameters, each stored with its
    weights (fp32 masters plus the low-precision copy under mixed precision) and its fp32 optimizer
    states; embedding tables (DLRM), sharded rather than replicated, count as they are held.
    """
    from ..workload.common import dense_memory

    w, tr = job.workload, job.workload.training
    if tr is None:
        raise ConfigError("the workload is served, not trained; expected a training workload",
                          file=job.workload_file, key="training")
    par = w.parallelism
    gpus = len(memory_gib)
    replicas = max(1, gpus // (par.tp * par.pp))
    shard = replicas if par.zero_stage >= 2 else 1
    params = sum(m.get("gradients", 0.0) for m in memory_gib) * 2**30 / 4 * shard / replicas
    weights, _, optimizer = dense_memory(round(params), tr.precision, tr.optimizer)
    tables = sum(m.get("embeddings", 0.0) for m in memory_gib)
    gib = (weights + optimizer) / 2**30 + tables
    note = (f"{params / 1e9:.3g} B parameters x {(weights + optimizer) / max(params, 1):.0f} bytes "
            f"(weights and {tr.optimizer} states, {tr.precision})"
            + (f" + {tables:.3g} GiB embedding tables" if tables else "") + ", from the memory estimate")
    return gib, note


def _rate(spec: GoodputSpec, gpus: int, nodes: int | None, file: str,
          lines: dict[tuple[str, ...], int]) -> tuple[float, list[dict[str, Any]]]:
    """The job's interruptions per second, and each component's share."""
    f = spec.failures
    if f.interruptions is not None and f.days is not None and f.gpus is not None:
        per_gpu = f.interruptions / (f.days * DAY) / f.gpus
        return per_gpu * gpus, [{"component": "measured", "count": gpus, "mtbf_hours": 1 / per_gpu / HOUR,
                                 "rate_per_day": per_gpu * gpus * DAY}]
    assert f.mtbf_hours_per_gpu is not None
    parts: list[dict[str, Any]] = [{"component": "gpu", "count": gpus, "mtbf_hours": f.mtbf_hours_per_gpu}]
    for name, comp, default in (("node", f.node, nodes), ("network", f.network, 1)):
        if comp is None:
            continue
        count = comp.count or default
        if count is None:
            key = ("failures", name)
            raise ConfigError("missing count; expected the number of nodes of the job (the job's figures are "
                              "given directly, so its nodes are not known)", file=file,
                              key=f"failures.{name}.count", line=lines.get(key))
        parts.append({"component": name, "count": count, "mtbf_hours": comp.mtbf_hours})
    for p in parts:
        p["rate_per_day"] = p["count"] / p["mtbf_hours"] * 24
    return sum(p["rate_per_day"] for p in parts) / DAY, parts


def load_goodput(path: str | Path) -> Goodput:
    """Read, validate and resolve a goodput file (a workload's iteration is simulated here)."""
    file = str(path)
    data, lines = read_yaml(path, "goodput")
    spec = validate(GoodputSpec, data, file, lines)
    check_name(spec.name, file, lines.get(("name",)))
    nodes: int | None = None
    workload_file = None
    state_note = "given"
    state = spec.job.state_gib
    if spec.job.workload is not None:
        wpath = resolve_path(file, spec.job.workload)
        if not wpath.is_file():
            raise ConfigError(f"workload file {wpath} not found; expected the path of a workload YAML (relative to "
                              "this file)", file=file, key="job.workload", line=lines.get(("job", "workload")))
        job = load_job(wpath)
        workload_file = str(wpath)
        nodes = job.workload.nodes
        if job.workload.training is None:
            raise ConfigError("the workload is served, not trained; expected a training workload",
                              file=file, key="job.workload", line=lines.get(("job", "workload")))
        from ..sim import simulate

        result = simulate(job)
        iteration_s = float(result.iteration_time_s)
        gpus = int(result.meta["gpus"])
        if state is None:
            state, state_note = checkpoint_state_gib(job, list(result.meta.get("memory_gib") or []))
    else:
        assert spec.job.iteration_s is not None and spec.job.gpus is not None
        iteration_s, gpus = spec.job.iteration_s, spec.job.gpus
    c = spec.checkpoint
    if c.checkpoint_s is not None:
        checkpoint_s = c.checkpoint_s
    elif state is None:
        raise ConfigError("checkpoint time from storage_gbytes_per_s needs the state size; expected job.state_gib "
                          "(or checkpoint.checkpoint_s)", file=file, key="job.state_gib", line=lines.get(("job",)))
    else:
        assert c.storage_gbytes_per_s is not None
        checkpoint_s = state * 2**30 / (c.storage_gbytes_per_s * 1e9)
    rate, parts = _rate(spec, gpus, nodes, file, lines)
    return Goodput(spec, file, iteration_s, gpus, state, state_note, rate, tuple(parts), checkpoint_s,
                   c.restart_s, workload_file)

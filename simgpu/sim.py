"""The pipeline in one call: job -> op graph -> kernel times -> engine -> result.

``simulate(job)`` returns a :class:`~simgpu.result.SimResult` and writes nothing; writing files is
:func:`simgpu.report.write_outputs`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .comm.planner import Planner
from .config.checks import check_memory, gpus_per_node
from .config.loader import Job, load_job
from .config.mixed import MixedPlatform, check_memory_by_kind, is_mixed
from .config.platform import PlatformSpec
from .config.transformer import TransformerModel
from .config.variability import Speeds, resolve
from .config.workload import INFERENCE_KINDS
from .engine import EngineOptions, shortcuts
from .engine.fold import local_shift_unit
from .engine.shortcuts import Choose
from .engine.steady import steady_window
from .errors import ConfigError
from .graph import KernelSpec, Workload
from .kernels.registry import make_predictor
from .platform.topology import Topology
from .result import SimResult
from .workload import World, get_builder
from .workload.kinds import by_kind


def build(job: Job, *, fold: bool = False, topo: Topology | None = None,
          micro_batches: Choose | None = None, whole_nodes: bool = True) -> Workload:
    """The per-rank op graph of ``job``, after checking that it fits in GPU memory; with ``fold``,
    the builder may return the representative ranks' programs only (see :mod:`simgpu.engine.fold`),
    folding ranks inside a node too where ``topo`` shows the node symmetric, and whole nodes unless
    ``whole_nodes`` is off; ``micro_batches`` chooses how many micro-batches a pipeline's programs run
    (see :mod:`simgpu.engine.periodic`)."""
    mixed = is_mixed(job.platform)
    fold = fold and not mixed  # ranks of different kinds are not identical
    local = partial(local_shift_unit, topo) if fold and topo is not None else None
    memory_gib = min(k.gpu.memory_gib for k in kinds_of(job.platform))
    world = World(job.workload.nodes, gpus_per_node(job), memory_gib, fold=fold,
                  gpu_dtypes=tuple(job.platform.gpu.peak_tflops), local_unit=local,
                  micro_batches=micro_batches, whole_nodes=whole_nodes)
    # Building makes millions of objects and frees few, so the cyclic collector's passes over them
    # during the build find nothing; it is off until the builder returns.
    collecting = gc.isenabled()
    gc.disable()
    try:
        workload = get_builder(job.workload.model.kind)(job.workload, world)
    except ConfigError as e:  # a builder's refusal names the key; the file is the job's
        if e.file is not None:
            raise
        raise ConfigError(e.message, file=job.workload_file, key=e.key) from None
    finally:
        if collecting:
            gc.enable()
    if not mixed:
        check_memory(job, workload)
        return workload
    assert isinstance(job.platform, MixedPlatform)
    check_memory_by_kind(job.platform, [m.total for m in workload.memory], gpus_per_node(job), job.workload_file)
    return by_kind(workload, rank_kinds(job), len(job.platform.distinct()))


def kinds_of(p: PlatformSpec) -> list[PlatformSpec]:
    """The distinct kinds of node of ``p``'s nodes (``p`` itself where it has one kind)."""
    return p.distinct() if isinstance(p, MixedPlatform) else [p]


def rank_kinds(job: Job) -> list[int]:
    """Per rank, the index of its node's kind among :func:`kinds_of` (all 0 on a platform of one kind)."""
    g = gpus_per_node(job)
    per_node = job.platform.node_kinds() if isinstance(job.platform, MixedPlatform) else [0] * job.workload.nodes
    return [per_node[r // g] for r in range(job.workload.nodes * g)]


#: The default kernel models, in order: a platform's fitted models for the families it has measured
#: (none for a platform without ``platforms/<name>/models/``), then the analytical model.
DEFAULT_KERNEL_MODEL = ("learned", "analytical")
#: A run's kernel times from the kernels and a function that times them by the kernel models: the
#: durations (s) and the model that timed each (:mod:`simgpu.uncertainty` scales them per draw)
KernelTimer = Callable[[Sequence[KernelSpec], Callable[[], tuple[np.ndarray, list[str]]]], tuple[np.ndarray, list[str]]]


def simulate(job: Job, *, kernel_model: str | Sequence[str] = DEFAULT_KERNEL_MODEL,
             record_links: bool = False, fold: bool = True, periodic: bool = True, steady_cut: bool = True,
             on_stage: Callable[[str], None] | None = None, kernel_timer: KernelTimer | None = None) -> SimResult:
    """Simulate one training iteration of ``job``; ``kernel_model`` names a model or a chain of them.

    Where work crosses the iteration boundary (``overlap_param_gather``) or ``steady_state: always``,
    the programs run two iterations and the result is the steady one (:mod:`simgpu.engine.steady`);
    ``meta["steady_state"]`` says how the reported iteration was found.

    With ``fold`` (the default), identical ranks (data-parallel replicas, tensor-parallel ranks inside
    a node) are simulated once where that is exact (see :mod:`simgpu.engine.fold`): the records then
    cover the representative ranks only
    (:meth:`SimResult.expanded` gives every rank's) and ``meta["fold"]`` says by how much; where
    it is not exact, every rank is simulated and ``meta["fold_note"]`` says why. With ``periodic``
    (the default), a pipeline's identical middle micro-batches are simulated once where the schedule
    is found to repeat (see :mod:`simgpu.engine.periodic`); ``meta["periodic"]`` says how, or why
    not. With ``steady_cut`` (the default), the first of two iterations is simulated from each rank's
    last micro-batch on where a check on that run finds it exact (see :mod:`simgpu.engine.steady_cut`);
    the ``steady_state`` note says which way the steady iteration was found. ``on_stage`` is told
    what is being done (for a progress line). ``kernel_timer``, where given, gives the kernels' times
    from the kernel models' (:data:`KernelTimer`).
    """
    say = on_stage or (lambda _: None)
    fold_asked, steady_asked = fold, steady_cut
    say("building the topology")
    p = job.platform
    try:
        topo = Topology(p, job.workload.nodes, gpus_per_node(job))
    except ConfigError as e:  # a fault the job's nodes do not have, or one that cuts a group off
        raise ConfigError(e.message, file=e.file or job.platform_file, key=e.key, line=e.line) from None
    kinds = kinds_of(p)  # a mixed platform's kinds of node: each times its ranks' kernels (simgpu/workload/kinds.py)
    predictors = [cache(partial(make_predictor, kernel_model, k)) for k in kinds]  # made once the programs are built

    def predict(w: Workload) -> tuple[np.ndarray, list[str]]:
        """Every distinct (kernel, kind) pair timed once, by its kind's models."""
        if kernel_timer is not None:
            return kernel_timer(w.kernels, partial(timed, w))
        return timed(w)

    def timed(w: Workload) -> tuple[np.ndarray, list[str]]:
        if len(kinds) == 1:
            return predictors[0]().predict(w.kernels)
        n = len(w.kernels) // len(kinds)
        timed = [f().predict(w.kernels[i * n:(i + 1) * n]) for i, f in enumerate(predictors)]
        return np.concatenate([np.asarray(d, dtype=float) for d, _ in timed]), [m for _, ms in timed for m in ms]

    planner = Planner(topo, p.collectives, job.workload.comm.algorithm, job.workload.comm.protocol)
    options = EngineOptions(launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
                            overlap_slowdown=p.gpu.overlap_slowdown, record_links=record_links,
                            sms=p.gpu.sms, overlap_slowdown_by_op=tuple(sorted(p.gpu.overlap_slowdown_by_op.items())),
                            overlap_slowdown_memory=tuple(sorted(p.gpu.overlap_slowdown_memory.items())),
                            periodic=periodic)
    vary = job.workload.variability
    speeds: Speeds | None = None
    if vary is not None:  # ranks differ: none stands for another, no micro-batch or iteration for another
        csv = vary.measured_speeds(job.workload_file)
        speeds = resolve(vary, topo.world, topo.gpus_per_node, job.workload.seed, csv)
        options = replace(options, variability=speeds, periodic=False)
        if job.workload.model.kind in INFERENCE_KINDS:  # the memory-bound flags below are for a slow memory only
            options = replace(options, overlap_slowdown_memory=())  # (the op's figure for every kernel, as before)
        fold, steady_cut = False, False
    if len(kinds) > 1:  # each kind's GPU its own slowdown beside collectives
        fold = False
        options = replace(options, kind_overlap=tuple(
            (k.gpu.overlap_slowdown, tuple(sorted(k.gpu.overlap_slowdown_by_op.items())),
             tuple(sorted(k.gpu.overlap_slowdown_memory.items()))) for k in kinds))
    from .kernels.overlap import memory_bound  # here: `python -m simgpu.kernels.overlap` imports simgpu first

    bounds: list[dict[KernelSpec, bool]] = [{} for _ in kinds]  # each kernel shape's bound per kind's GPU
    # Each build's programs (and what the process holds then) are frozen out of the cyclic collector
    # until the runs are over: between and after the event loops (the records, the periodic shortcut's
    # extension) its full passes would walk every op of every program again, and ops, calls and their
    # tuples hold no cycles (they are freed by reference counting as before).
    # Not where the caller has frozen objects itself (its freeze is left as it is).
    freeze = gc.get_freeze_count() == 0

    def built(folded: bool, inside: bool, micro: Choose | None, nodes: bool = True) -> Workload:
        w = build(job, fold=folded, topo=topo if inside else None, micro_batches=micro, whole_nodes=nodes)
        # where memory-bound kernels have their own figures; an inference iteration keeps the op's
        # figure for every kernel, as the serving stage's timer times it (docs/steady-state.md, "Steady state and the
        # overlaps the frameworks turn on"), so a simulated iteration and a served one agree
        if (any(k.gpu.overlap_slowdown_memory for k in kinds) and job.workload.model.kind not in INFERENCE_KINDS) or (
                speeds is not None and any(f != 1.0 for f in speeds.memory)):
            n = len(w.kernels) // len(kinds)  # a kind without memory figures: the op's figure for its kernels
            w.memory_bound = [b for i, k in enumerate(kinds) for b in (
                memory_bound(w.kernels[i * n:(i + 1) * n], k.gpu, bounds[i])
                if k.gpu.overlap_slowdown_memory or len(kinds) == 1 else [False] * n)]
        if freeze:
            gc.freeze()
        return w

    try:
        outcome = shortcuts.run(topo, built, predict, planner, options, fold=fold,
                                steady_cut=steady_cut, say=say)
    finally:
        if freeze:
            gc.unfreeze()
    workload = outcome.workload
    result = steady_window(outcome.result)
    note = shortcuts.slack_note(result, outcome.note)
    share = kernel_seconds(result.records)
    reps = workload.replicas
    result.replicas = reps
    result.meta.update(
        workload=job.workload.name, platform=p.name, gpu=p.gpu.name, nodes=topo.nodes, gpus=topo.world,
        samples=workload.samples, tokens=workload.tokens, model_flops=workload.model_flops,
        peak_flops_per_gpu=float(p.gpu.peak_tflops.get(workload.compute_dtype, np.nan)) * 1e12,  # type: ignore[call-overload]
        gpu_memory_gib=p.gpu.memory_gib, memory_gib=[m.as_gib() for m in workload.memory],
        kernel_model_share=share, seed=job.workload.seed,
        workload_file=job.workload_file, platform_file=job.platform_file,
        fold=1 if reps is None else reps.factor, fold_note=note, run=run_info(job, topo),
        steady_state=steady_note(job, workload.iterations, result), periodic=outcome.periodic,
    )
    if len(kinds) > 1:
        assert isinstance(p, MixedPlatform)
        per_rank = rank_kinds(job)
        result.meta.update(kinds_meta(p, per_rank))
        peaks = [kinds[k].gpu.peak_tflops.get(workload.compute_dtype, np.nan) for k in per_rank]  # type: ignore[call-overload]
        result.meta["peak_flops_per_gpu"] = float(np.mean(peaks)) * 1e12  # the mean GPU's, for MFU
        result.meta["fold_note"] = MIXED_NOTE
    if vary is not None:
        result.meta["fold_note"] = VARIABILITY_NOTE
        result.meta["periodic"] = f"not used: {VARIABILITY_NOTE}"
        say("simulating the same job without variability")
        plain = replace(job, workload=job.workload.model_copy(update={"variability": None}))
        base = simulate(plain, kernel_model=kernel_model, fold=fold_asked, periodic=periodic, steady_cut=steady_asked,
                        kernel_timer=kernel_timer)
        result.meta["variability"] = variability_meta(job, topo, result, base)
    notes = model_notes(job)
    if notes:
        result.meta["model_notes"] = notes
    pp = job.workload.parallelism.pp
    if job.workload.model.kind == "transformer_inference" and pp > 1:
        result.meta["pipeline_note"] = (
            f"one batch passes the {pp} stages one after another, so each stage is idle about {pp - 1}/{pp} of "
            f"the iteration; `simgpu serve` keeps {pp} batches in flight per replica (vLLM's virtual engines)")
    return result


#: why a job on nodes of several kinds is simulated rank by rank
MIXED_NOTE = ("mixed platform: ranks on nodes of different kinds are not identical, so every rank is simulated "
              "(no folding)")


def kinds_meta(p: MixedPlatform, per_rank: Sequence[int]) -> dict[str, Any]:
    """A mixed platform's kinds in the result's meta: the GPU named by kind, the mean peak per GPU
    (for MFU), and ``kinds``: per kind its name, GPU, nodes and ranks."""
    kinds, labels = p.distinct(), p.labels()
    ranks = [[r for r, k in enumerate(per_rank) if k == i] for i in range(len(kinds))]
    return {
        "gpu": " + ".join(dict.fromkeys(k.gpu.name for k in kinds)),
        "kinds": [{"kind": labels[i], "gpu": k.gpu.name, "gpu_memory_gib": k.gpu.memory_gib,
                   "nodes": sum(e.nodes for e in p.kinds if e.platform == k), "ranks": ranks[i]}
                  for i, k in enumerate(kinds)],
    }


#: why a job with variability is simulated rank by rank, micro-batch by micro-batch
VARIABILITY_NOTE = ("variability: ranks run at different speeds, so every rank, micro-batch and iteration is "
                    "simulated (no folding, no periodic or shortened-iteration shortcut)")


def variability_meta(job: Job, topo: Topology, result: SimResult, base: SimResult) -> dict[str, Any]:
    """How much the variability section stretched the iteration and why: the iteration of a second
    simulation of the job without the section, the stretch, the section in words, and what the
    collectives waited for (:func:`simgpu.engine.rendezvous.rendezvous_waits`)."""
    from .config.variability import describe

    v = job.workload.variability
    assert v is not None
    return {
        "baseline_iteration_s": base.iteration_time_s,
        "baseline_note": "a second simulation of the same job with the variability section removed",
        "entries": describe(v, topo.world, topo.gpus_per_node, job.workload.seed),
        "rendezvous": result.meta.pop("rendezvous", None),
    }


def model_notes(job: Job) -> list[str]:
    """What the run reads but approximates of its model: the config adapter's notes, and a precision
    that runs another GEMM path on this GPU."""
    from .config.hf import notes
    from .precision import gemm_path

    md, out = job.workload.model, []
    if job.platform.faults:
        out.append("faults: " + "; ".join(f"{f.part()} {f.effect()}" for f in job.platform.faults)
                   + " (docs/faults.md)")
    if isinstance(md, TransformerModel) and md.config is not None:
        out += [f"{Path(md.config).name}: {n}" for n in notes(md.config)]
    if isinstance(md, TransformerModel) and job.workload.training is not None:
        if md.mla is not None:
            out.append("mla in training: the attention core timed as flash attention of the mean of the query/key and "
                       "value head widths (both matmuls' FLOPs exact)")
        if md.sparse_attention is not None:
            out.append("sparse_attention in training: each query's top-k keys timed as attention over a window of "
                       "index_topk keys, the indexer's scores as batched GEMMs")
        if md.linear_attention is not None:
            out.append("linear_attention in training: the backward timed as two passes of the chunked kernel")
    inf = job.workload.inference
    if inf is not None:
        for key, prec in (("precision", inf.precision), ("moe_precision", inf.moe_precision)):
            path = gemm_path(prec, job.platform.gpu.peak_tflops) if prec else None
            if prec and path and path != prec:
                out.append(f"inference.{key} {prec}: {job.platform.gpu.name} has no {prec} tensor cores; its GEMMs "
                           f"run as {path} (4-bit weights dequantised into 16-bit GEMMs)")
    return out


#: rows :func:`kernel_seconds` reads at a time
_CHUNK = 1 << 20


def kernel_seconds(records: pd.DataFrame) -> dict[str, float]:
    """Simulated kernel seconds per model name (sorted by name): ``records``' kernel rows grouped by
    ``model``, their durations summed. The kernel rows' columns are read, not copied as rows; a
    categorical ``model`` column (the engine's) is grouped by its codes, an Arrow-backed one by its
    dictionary codes, rather than by its strings."""
    kernel = (records["kind"] == "kernel").to_numpy()
    start, end = records["start_s"].to_numpy(), records["end_s"].to_numpy()
    durations = np.empty(int(kernel.sum()))
    at = 0
    for a in range(0, len(kernel), _CHUNK):  # a chunk of rows at a time: no full-length copies
        mask = kernel[a:a + _CHUNK]
        part = end[a:a + _CHUNK][mask] - start[a:a + _CHUNK][mask]
        durations[at:at + len(part)] = part
        at += len(part)
    d = pd.Series(durations, copy=False)  # pandas copies an array by default
    model = records["model"]
    arrow = getattr(model.array, "__arrow_array__", None)
    if isinstance(model.dtype, pd.CategoricalDtype):
        cat = model.array
        key: Any = pd.Categorical.from_codes(cat.codes[kernel], dtype=cat.dtype)
        key = key.reorder_categories(sorted(cat.categories))  # groups in the order of their names
    elif arrow is None:
        key = model.to_numpy()[kernel]
    else:
        import pyarrow.compute as pc

        enc = pc.dictionary_encode(arrow()).combine_chunks()
        names = enc.dictionary.to_pylist()
        key = pd.Categorical.from_codes(enc.indices.to_numpy()[kernel], categories=names)
        key = key.reorder_categories(sorted(names))  # groups in the order of their names, as for strings
    share = d.groupby(key, observed=True).sum()
    return {str(k): float(v) for k, v in share.items()}


def steady_note(job: Job, iterations: int, result: SimResult) -> str:
    """How the reported iteration was found (see :mod:`simgpu.engine.steady`)."""
    cut = str(result.meta.get("steady_cut", ""))  # kept in meta: why not, where it was not used
    if iterations > 1:
        first = float(result.meta.get("first_iteration_s", 0.0))
        if cut.startswith("used"):
            return (f"steady: the last of {iterations} iterations simulated back to back, the first from each rank's "
                    f"last micro-batch on (its last kernel ended {first * 1e3:.3f} ms after a cold start; discarded), "
                    f"from the end of the previous iteration's last kernel to the end of its own; shortened first "
                    f"iteration {cut}, checked exact from its own run")
        earlier = "the earlier ones" if iterations > 2 else "the first"
        note = (f"steady: the last of {iterations} iterations simulated back to back ({earlier} discarded; the "
                f"first's last kernel ended {first * 1e3:.3f} ms after a cold start), from the end of the previous "
                "iteration's last kernel to the end of its own")
        ends = [float(x) for x in result.meta.get("iteration_ends_s", ())]
        if len(ends) > 2:  # steady_state: check
            lengths = [b - a for a, b in zip(ends, ends[1:], strict=False)]
            note += (f"; iterations 2 to {len(ends)}: " + ", ".join(f"{x * 1e3:.6f}" for x in lengths)
                     + f" ms (the last against the second: {(lengths[-1] - lengths[0]) / lengths[0]:+.1e})")
            tails = result.meta.get("steady_tails")
            if tails:
                note += "; " + tails_note(tails)
        return note
    w = job.workload
    if w.training is None:
        return "one iteration: a served model's iterations are independent steps"
    if w.training.steady_state == "never":
        return "one isolated iteration (steady_state: never): what crosses the boundary is exposed at its end"
    if w.training.steady_state in ("always", "check"):
        return f"one isolated iteration: the {w.model.kind} builder runs one"
    return ("one isolated iteration: nothing crosses the iteration boundary, and it stands for the steady "
            "one")


def tails_note(tails: Sequence[dict[str, Any]]) -> str:
    """``meta["steady_tails"]`` in words: how far each iteration's ops from its optimizer step on are from
    the previous iteration's, one window later (the last tail runs under no next iteration)."""
    def one(t: dict[str, Any]) -> str:
        k, off = int(t["iteration"]), float(t["offset_s"])
        where = f" (rank {t['rank']}'s {t['op']!r})" if off >= 5e-10 else ""  # where it shows in ns
        return f"{k + 1} vs {k}: {off * 1e3:.6f} ms{where}"
    return ("from the optimizer step on, each iteration's ops against the previous one's, one window later, "
            "the largest difference: " + ", ".join(one(t) for t in tails)
            + " (the last iteration's tail runs under no next iteration)")


def run_info(job: Job, topo: Topology) -> dict[str, object]:
    """What a run was: its overrides and seed, the platform figures that matter most, the files read
    and the versions of the simulator, Python and the libraries that timed it."""
    return {
        "overrides": list(job.overrides),
        "seed": job.workload.seed,
        "platform": platform_figures(job.platform, topo),
        "workload_file": job.workload_file, "platform_file": job.platform_file,
        "versions": versions(),
    }


def platform_figures(p: PlatformSpec, topo: Topology) -> dict[str, object]:
    """The platform's name, GPU, GPU memory, NIC speed and count, and the job's nodes and GPUs."""
    return {"name": p.name, "gpu": p.gpu.name, "gpu_memory_gib": p.gpu.memory_gib,
            "nic_gbps": p.network.nic_gbps, "nics_per_node": p.network.nics_per_node,
            "nodes": topo.nodes, "gpus_per_node": topo.gpus_per_node, "gpus": topo.world}


def versions() -> dict[str, str]:
    """Versions of simgpu, Python, and of numpy, pandas, SimPy, torch and LightGBM where imported."""
    import platform as python
    import sys

    from .version import __version__

    out = {"simgpu": __version__, "python": python.python_version()}
    for name in ("numpy", "pandas", "simpy", "torch", "lightgbm"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = str(getattr(module, "__version__", "?"))
    return out


def simulate_file(path: str | Path, overrides: Sequence[str] = (), **kwargs: object) -> SimResult:
    """Load a workload file (with ``key.path=value`` overrides) and simulate it."""
    return simulate(load_job(path, overrides), **kwargs)  # type: ignore[arg-type]

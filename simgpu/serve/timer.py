"""Iteration times of a deployment's batches, simulated on the engine and cached.

:class:`EngineTimer` implements :class:`~simgpu.workload.inference.api.IterationTimer` for a job
whose model is ``transformer_inference``. Each step is reduced to its grid :class:`Shape`
(:func:`~simgpu.workload.inference.shape.canonical`); a shape is simulated once, on one replica's
GPUs (replicas share no link), and its time kept. The shapes a call has not seen are built
together, their new kernel shapes timed in one bulk call of the kernel models, then each is run.

Cheap by construction: every block of a stage runs the same program, so a shape is simulated with
:data:`PROBE_LAYERS` and one more block per stage and the rest added at the per-block step between
the two (exact once the CPU thread and the GPU streams settle into their per-block rhythm, which
they do within the first block; ``tests/test_inference_timer.py`` compares it with the whole
model); identical tensor-parallel ranks inside a node are folded as the training engine folds them
(:mod:`simgpu.engine.fold`). ``exact=True`` simulates every block, unrounded.

Under pipeline parallelism (``pp > 1``) a shape's run also gives each stage's share of the step
(:meth:`EngineTimer.stage_times`): stage ``k``'s share is from when stage ``k - 1``'s last record
ends (its send of the activations received) to when stage ``k``'s does, stage 0's from the start;
the shares sum to the step's time, and each is extrapolated from the two probes as the whole is.
The serving loop keeps ``pp`` batches in flight with them (:mod:`simgpu.serve.loop`).

``kernel_scale`` (optional) rewrites the kernel models' times once they are predicted: it is given
the new kernels, their seconds and the model that timed each, and returns their seconds (a draw of
``simgpu serve --uncertainty N`` scales them per family; :mod:`simgpu.uncertainty.serving`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..comm.planner import Planner
from ..config.checks import gpus_per_node
from ..config.loader import Job
from ..engine import Engine, EngineOptions
from ..engine.fold import FoldBroken, fold_blocker, local_shift_unit
from ..errors import ConfigError
from ..graph import KernelSpec, KernelTable, MemoryEstimate, Program, Replicas, Workload
from ..kernels.registry import make_predictor
from ..platform.topology import Topology
from ..workload.inference.api import ReplicaMemory, Step
from ..workload.inference.builder import Deployment, deployment, replica_programs
from ..workload.inference.shape import Shape, canonical, shape_of
from ..workload.registry import World

#: Rewrites predicted kernel times: (kernels, their seconds, the model that timed each) -> seconds.
KernelScale = Callable[[Sequence[KernelSpec], np.ndarray, Sequence[str]], np.ndarray]

#: Blocks per stage of the shorter of the two probes a shape is simulated with.
PROBE_LAYERS = 2
DEFAULT_KERNEL_MODEL = ("learned", "analytical")


class EngineTimer:
    """Times the batches of one replica of ``job`` (a ``transformer_inference`` workload) on the
    engine; see the module docstring. ``exact``: every block simulated, steps not rounded."""

    def __init__(self, job: Job, *, exact: bool = False,
                 kernel_model: str | Sequence[str] = DEFAULT_KERNEL_MODEL,
                 kernel_scale: KernelScale | None = None) -> None:
        p, w = job.platform, job.workload
        gpn = gpus_per_node(job)
        world = World(w.nodes, gpn, p.gpu.memory_gib, gpu_dtypes=tuple(p.gpu.peak_tflops))
        try:
            self.deployment: Deployment = deployment(w, world)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{e}; expected a transformer_inference workload whose tp*ep*pp divides the GPUs",
                              file=job.workload_file, key="model.kind" if isinstance(e, TypeError)
                              else "parallelism") from None
        dep = self.deployment
        self.job, self.exact = job, exact
        self.replica_gpus: int = dep.gpus
        self.replicas: int = dep.replicas
        self.memory: ReplicaMemory = dep.memory
        g = dep.gpus
        if gpn < g and g % gpn:
            raise ConfigError(f"a replica of {g} GPUs does not fill whole nodes of {gpn}; expected tp*ep*pp "
                              f"below {gpn} or a multiple of it", file=job.workload_file, key="parallelism.tp")
        self.topo = Topology(p, max(g // gpn, 1), min(g, gpn))
        self.planner = Planner(self.topo, p.collectives, w.comm.algorithm, w.comm.protocol)
        self.options = EngineOptions(launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
                                     overlap_slowdown=p.gpu.overlap_slowdown, sms=p.gpu.sms,
                                     overlap_slowdown_by_op=tuple(sorted(p.gpu.overlap_slowdown_by_op.items())))
        self.predictor = make_predictor(kernel_model, p)
        self.kernel_scale = kernel_scale
        self.kernels = KernelTable()
        self._durations = np.zeros(0)
        self._models: list[str] = []
        self._cache: dict[Shape, float] = {}
        #: pipeline stages of a replica, and per shape each stage's share of the step (pp > 1)
        self.stages: int = dep.setup.layout.pp
        self._stage_cache: dict[Shape, tuple[float, ...]] = {}
        self.fold = self._fold()
        self.simulated = 0  # shapes simulated so far

    def _fold(self) -> Replicas | None:
        lay = self.deployment.setup.layout
        if lay.tp < 2 or lay.tp > self.topo.gpus_per_node or self.topo.gpus_per_node % lay.tp:
            return None
        unit = local_shift_unit(self.topo, lay.tp)
        if unit >= lay.tp:
            return None
        reps = Replicas(world=self.topo.world, levels=((lay.tp, unit),))
        return reps if fold_blocker(self.topo, reps) is None else None

    # ---- the interface

    def time(self, steps: Sequence[Step]) -> np.ndarray:
        """Seconds of each step on one replica, in order (see :class:`IterationTimer`)."""
        shapes = self._timed(steps)
        return np.array([self._cache[s] for s in shapes], dtype=float)

    def stage_times(self, steps: Sequence[Step]) -> np.ndarray:
        """Seconds of each step on each pipeline stage, one row per step (``len(steps) x stages``):
        stage ``k``'s share from when it has the activations to when it has passed them on (the
        last stage: the sampled tokens); a row sums to :meth:`time`'s figure of the step."""
        if self.stages == 1:
            return self.time(steps)[:, None]
        shapes = self._timed(steps)
        return np.array([self._stage_cache[s] for s in shapes], dtype=float).reshape(len(shapes), self.stages)

    def _timed(self, steps: Sequence[Step]) -> list[Shape]:
        """The shapes of ``steps``, those not yet cached simulated."""
        key: Callable[[Step], Shape] = (lambda s: shape_of(s, exact=True)) if self.exact else canonical
        shapes = [key(s) for s in steps]
        self.time_shapes([s for s in dict.fromkeys(shapes) if s not in self._cache])
        return shapes

    def time_shapes(self, shapes: Sequence[Shape]) -> None:
        """Simulate ``shapes`` (not yet cached) in bulk and cache their times."""
        if not shapes:
            return
        per = self.deployment.setup.model.layers // self.deployment.setup.layout.pp
        probes = [None] if self.exact or per <= PROBE_LAYERS + 1 else [PROBE_LAYERS, PROBE_LAYERS + 1]
        built = [[self._programs(sh, k) for k in probes] for sh in shapes]
        self._predict()
        for i, (sh, progs) in enumerate(zip(shapes, built, strict=True)):
            try:
                if self.stages == 1:
                    times = [self._run(p) for p in progs]
                else:
                    shares = [self._run_stages(p) for p in progs]
            except FoldBroken:  # a collective planned differently seen from another rank: unfold
                self.fold = None
                self.time_shapes(shapes[i:])
                return
            if self.stages == 1:
                t = times[0] if len(times) == 1 else times[0] + (per - PROBE_LAYERS) * (times[1] - times[0])
                self._cache[sh] = float(t)
            else:
                d = shares[0] if len(shares) == 1 else shares[0] + (per - PROBE_LAYERS) * (shares[1] - shares[0])
                self._stage_cache[sh] = tuple(float(x) for x in d)
                self._cache[sh] = float(d.sum())
            self.simulated += 1

    def kernel_times(self, step: Step) -> dict[tuple[str, str, str], float]:
        """Seconds of the kernels of ``step``'s shape on the replica's first rank, summed per
        (kernel name without its block's prefix, family, dtype) over every block: where an iteration's
        GPU time goes (its sum is the iteration where one GPU's stream is the critical path, TP1)."""
        sh = shape_of(step, exact=True) if self.exact else canonical(step)
        progs = self._programs(sh, None)
        self._predict()
        out: dict[tuple[str, str, str], float] = {}
        for op in progs[min(progs)].ops:
            if op.kernel < 0:
                continue
            spec = self.kernels.specs[op.kernel]
            head, _, rest = op.name.partition(".")
            name = rest if rest and head.rstrip("0123456789") != head else op.name
            key = (name, spec.family, spec.dtype)
            out[key] = out.get(key, 0.0) + float(self._durations[op.kernel])
        return out

    # ---- building and running

    def _programs(self, shape: Shape, layers: int | None) -> dict[int, Program]:
        ranks = None if self.fold is None else set(self.fold.representatives())
        return replica_programs(self.deployment, shape, self.kernels, layers=layers, ranks=ranks)

    def _predict(self) -> None:
        specs: list[KernelSpec] = self.kernels.specs
        new = specs[len(self._durations):]
        if new:
            secs, who = self.predictor.predict(new)
            if self.kernel_scale is not None:
                secs = self.kernel_scale(new, np.asarray(secs, dtype=float), list(who))
            self._durations = np.concatenate([self._durations, np.asarray(secs, dtype=float)])
            self._models += list(who)

    def _engine(self, programs: dict[int, Program]) -> Engine:
        g = self.replica_gpus
        wl = Workload(name=self.job.workload.name, programs=[programs[r] for r in sorted(programs)],
                      kernels=self.kernels.specs[:len(self._durations)], memory=[MemoryEstimate()] * g,
                      samples=1, replicas=self.fold)
        return Engine(self.topo, wl, self._durations, self._models, self.planner, self.options)

    def _run(self, programs: dict[int, Program]) -> float:
        return self._engine(programs).run_time()

    def _run_stages(self, programs: dict[int, Program]) -> np.ndarray:
        """Each stage's share of one run: from the end of the stage before (0 for the first) to
        the end of its own last record, the end of a stage the latest over its ranks."""
        ends = self._engine(programs).run_rank_ends()
        per = self.replica_gpus // self.stages
        stage_end = np.zeros(self.stages)
        for rank, end in ends.items():
            k = rank // per
            stage_end[k] = max(stage_end[k], end)
        # a share never negative, and the shares summing to the run's end (the latest of all ranks)
        reached = np.maximum.accumulate(stage_end)
        return np.diff(reached, prepend=0.0)


def make_timer(job: Job, **kwargs: object) -> EngineTimer:
    """The :class:`~simgpu.workload.inference.api.IterationTimer` of ``job`` (keyword arguments go to
    :class:`EngineTimer`)."""
    return EngineTimer(job, **kwargs)  # type: ignore[arg-type]

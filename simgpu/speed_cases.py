"""The cases ``python -m simgpu.speed`` measures: workloads, studies and collectives from 8 to 16,384
GPUs, each a function that simulates it and returns its simulated time and its events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _workload(path: str, *overrides: str, fold: bool = True, steady_cut: bool = True
              ) -> Callable[[], tuple[float, int]]:
    def run() -> tuple[float, int]:
        from .config.loader import load_job
        from .sim import simulate

        r = simulate(load_job(ROOT / path, list(overrides)), fold=fold, steady_cut=steady_cut)
        return r.iteration_time_s, r.events
    return run


def _uncertain(path: str, draws: int) -> Callable[[], tuple[float, int]]:
    """The point run of a workload and ``draws`` correlated draws through the engine
    (``simgpu run --uncertainty``); the events are the point run's."""
    def run() -> tuple[float, int]:
        from .config.loader import load_job
        from .uncertainty.draws import propagate

        point, _ = propagate(load_job(ROOT / path), draws)
        return point.iteration_time_s, point.events
    return run


def _allreduce(platform: str, nodes: int, nbytes: int, *overrides: tuple[str, object]
               ) -> Callable[[], tuple[float, int]]:
    def run() -> tuple[float, int]:
        from .collective_run import collective_result
        from .config.loader import load_platform

        r = collective_result(load_platform(platform, overrides)[0], "all_reduce", nbytes, nodes=nodes)
        return r.iteration_time_s, r.events
    return run


def _alltoall(platform: str, nodes: int, sizes: Sequence[int]) -> Callable[[], tuple[float, int]]:
    """An all-to-all of each size in ``sizes`` over ``nodes`` nodes, one simulation a size on one
    topology (as ``python -m simgpu.comm`` sweeps sizes); the simulated time is the sum over sizes."""
    def run() -> tuple[float, int]:
        from .collective_run import collective_result
        from .config.loader import load_platform
        from .platform.topology import Topology

        spec = load_platform(platform)[0]
        topo = Topology(spec, nodes)
        rs = [collective_result(spec, "all_to_all", n, nodes=nodes, topology=topo) for n in sizes]
        return sum(r.iteration_time_s for r in rs), sum(r.events for r in rs)
    return run


#: the all-to-all sizes of the scale cases: 64 KiB, 4 MiB, 64 MiB, 1 GiB
A2A_SIZES = (1 << 16, 1 << 22, 1 << 26, 1 << 30)


def _cluster(path: str) -> Callable[[], tuple[float, int]]:
    """Every job of a cluster file together, and each alone; the simulated time is the longest job's
    together, the events those of all the runs."""
    def run() -> tuple[float, int]:
        from .cluster.run import simulate_cluster
        from .cluster.spec import load_cluster

        res = simulate_cluster(load_cluster(ROOT / path))
        events = res.together.events + sum(r.events for r in res.alone.values())
        return max(res.together_s.values()), events
    return run


def _study(path: str) -> Callable[[], tuple[float, int]]:
    """A what-if study on the local process pool (one worker per core), in a scratch folder; the
    'events' column is the number of variants simulated."""
    def run() -> tuple[float, int]:
        import tempfile

        from .whatif.runner import run_study
        from .whatif.study import load_study

        study = load_study(ROOT / path)
        with tempfile.TemporaryDirectory() as tmp:
            rows = run_study(study, Path(tmp))
        if any(r["status"] == "error" for r in rows):
            raise RuntimeError(next(r["why"] for r in rows if r["status"] == "error"))
        return 0.0, len(rows)
    return run


GPT3 = "workloads/gpt3_175b_1024x_a100.yaml"


def _gpt3(dp: int) -> Callable[[], tuple[float, int]]:
    """GPT-3 175B, TP8 PP16 1F1B with 16 micro-batches of 2 per pipeline, on ``128 * dp`` A100s."""
    return _workload(GPT3, f"nodes={16 * dp}", f"parallelism.dp={dp}", f"training.global_batch={32 * dp}")


#: GPT 1.3B on 8 DGX H100 as NeMo runs it (TP2 with sequence parallelism and userbuffers, ZeRO-1 with
#: the parameter all-gathers overlapped with the next forward, fp8), 4 micro-batches: its steady
#: iteration, found from two iterations back to back (simgpu.engine.steady)
STEADY = ("workloads/gpt_2x_dgx_h100.yaml", "nodes=8", "parallelism.tp=2", "parallelism.dp=32", "parallelism.sp=true",
          "parallelism.tp_comm_overlap=true", "parallelism.zero=1", "training.framework=megatron",
          "training.precision=fp8", "parallelism.overlap_param_gather=true", "training.grad_accumulation=4")

#: name -> (GPUs, the case); the GPU count places the case on the scaling plot
CASES: dict[str, tuple[int, Callable[[], tuple[float, int]]]] = {
    "dlrm 8 GPU (dgx_a100, DCNv2)": (8, _workload("workloads/dlrm_dcnv2_dgx_a100.yaml")),
    "dlrm 16 GPU (2x dgx_a100)": (16, _workload("workloads/dlrm_2x_dgx_a100.yaml")),
    "gpt 1.3B 16 GPU (2x dgx_h100)": (16, _workload("workloads/gpt_2x_dgx_h100.yaml")),
    "gpt 1.3B 16 GPU, 32 uncertainty draws": (16, _uncertain("workloads/gpt_2x_dgx_h100.yaml", 32)),
    "gpt 1.3B 64 GPU (TP8 DP8)": (64, _workload("workloads/gpt_2x_dgx_h100.yaml", "nodes=8", "parallelism.tp=8",
                                                "parallelism.dp=8")),
    "gpt-3 175B 128 GPU (TP8 PP16 DP1)": (128, _gpt3(1)),
    "gpt-3 175B 128 GPU, every rank": (128, _workload(GPT3, "nodes=16", "parallelism.dp=1",
                                                      "training.global_batch=32", fold=False)),
    "gpt-3 175B 1024 GPU (TP8 PP16 DP8)": (1024, _workload(GPT3)),
    "gpt-3 175B 1024 GPU, every rank": (1024, _workload(GPT3, fold=False)),
    "gpt-3 175B 1024 GPU, global batch 1536": (1024, _workload(GPT3, "training.global_batch=1536")),
    # MLPerf Training's GPT-3 on 512 H100 (NeMo: TP4 PP8 interleaved over 12 virtual stages, micro-batch
    # 1, global batch 2,048 = 128 micro-batches per pipeline, fp8)
    "mlperf gpt-3 512 H100 (TP4 PP8 VP12, 128 mb)": (512, _workload(
        GPT3, "platform=dgx_h100", "nodes=64", "parallelism.tp=4", "parallelism.pp=8", "parallelism.dp=16",
        "parallelism.pp_schedule=interleaved", "parallelism.virtual_stages=12", "training.micro_batch=1",
        "training.global_batch=2048", "training.precision=fp8")),
    "gpt-3 175B 1024 GPU, 2:1 spine": (1024, _workload(GPT3, "platform.network.oversubscription=2")),
    # real clusters: one GPU of 1,024 slowed (every rank simulated, and the job once more without it),
    # and two 512-GPU jobs on one 2:1 spine (together, then each alone)
    "gpt-3 175B 1024 GPU, one straggler (every rank)": (1024, _workload(
        GPT3, "variability.slow=[{ranks: [5], factor: 1.3}]")),
    "two gpt-3 175B jobs of 512 GPU on a 2:1 spine": (1024, _cluster(
        "workloads/clusters/two_gpt3_512_2to1_spine.yaml")),
    # Perlmutter's dragonfly (4 A100 and 4 NICs a node on one switch): whole nodes do not fold there
    "gpt-3 175B 1024 GPU, dragonfly (Perlmutter, TP4)": (1024, _workload(
        GPT3, "platform=perlmutter_gpu", "nodes=256", "parallelism.tp=4", "parallelism.dp=16")),
    "dlrm-dcnv2 1024 GPU (128x dgx_a100)": (1024, _workload("workloads/dlrm_dcnv2_8x_dgx_a100.yaml", "nodes=128")),
    "mixtral 8x7B 1024 H100 (EP8)": (1024, _workload("workloads/mixtral_8x7b_64x_h100.yaml", "nodes=128",
                                                                         "training.global_batch=2048")),
    # the models of 2026 from their config.json: one serving iteration of DeepSeek-R1 (attention-DP 8,
    # EP 8) and a training iteration of Qwen3-235B-A22B on 256 H100 (TP4 PP2 EP32, 94 blocks)
    "deepseek-r1 serving iteration, 8 H200 (ADP8 EP8)": (8, _workload(
        "workloads/inference/deepseek_r1_fp8_8x_h200_adp8.yaml")),
    "qwen3-235b-a22b 256 H100 (TP4 PP2 EP32, fp8, full recompute)": (256, _workload(
        "workloads/qwen3_30b_a3b_2x_dgx_h100_ep8.yaml", "model.config=models/qwen3-235b-a22b/config.json",
        "nodes=32", "parallelism.tp=4", "parallelism.sp=true", "parallelism.pp=2", "parallelism.virtual_stages=1",
        "parallelism.pp_schedule=1f1b", "parallelism.ep=32", "training.global_batch=256",
        "training.recompute=full")),
    "all-to-all 64 KiB-1 GiB, 1024 GPU": (1024, _alltoall("dgx_a100", 128, A2A_SIZES)),
    "all-to-all 64 KiB-1 GiB, 4096 GPU": (4096, _alltoall("dgx_a100", 512, A2A_SIZES)),
    "gpt-3 175B 4096 GPU (TP8 PP16 DP32)": (4096, _gpt3(32)),
    "gpt-3 175B 4096 GPU, every rank": (4096, _workload(GPT3, "nodes=512", "parallelism.dp=32",
                                                        "training.global_batch=1024", fold=False)),
    "gpt-3 175B 16384 GPU (TP8 PP16 DP128)": (16384, _gpt3(128)),
    "gpt-3 175B 16384 GPU, every rank": (16384, _workload(GPT3, "nodes=2048", "parallelism.dp=128",
                                                          "training.global_batch=4096", fold=False)),
    # an asymmetric network at that scale: whole nodes do not fold over an oversubscribed spine, the
    # ranks inside each node do (a quarter of the ranks simulated)
    "gpt-3 175B 16384 GPU, 2:1 spine": (16384, _workload(GPT3, "nodes=2048", "parallelism.dp=128",
                                                         "training.global_batch=4096",
                                                         "platform.network.oversubscription=2")),
    # the cost of the steady state: the shortened first iteration, both iterations in full, and one
    # isolated iteration of the same job (steady_state: never), the baseline
    "gpt 1.3B 64 GPU steady state (NeMo, 4 mb)": (64, _workload(*STEADY)),
    "gpt 1.3B 64 GPU steady state, both in full": (64, _workload(*STEADY, steady_cut=False)),
    "gpt 1.3B 64 GPU, one isolated iteration": (64, _workload(*STEADY, "training.steady_state=never")),
    "study: 1000 variants of a 64-GPU GPT": (64, _study("workloads/studies/gpt_64gpu_1000.yaml")),
    "all-reduce 1 GB, 16 GPU": (16, _allreduce("dgx_h100", 2, 1 << 30)),
    # the 16 MiB all-reduce over 16 A100s (8 a server, 100 Gb/s NICs) whose simulation time a SimAI
    # fork reports (liecn/SimAI README.md, "Quick Demo"; example/microAllReduce_16gpus.txt)
    "all-reduce 16 MiB, 16 A100 (100 Gb/s NICs)": (16, _allreduce("dgx_a100", 2, 1 << 24,
                                                                 ("network.nic_gbps", 100))),
    "all-reduce 1 GB, 1024 GPU": (1024, _allreduce("dgx_h100", 128, 1 << 30)),
    "all-reduce 1 GB, 4096 GPU": (4096, _allreduce("dgx_h100", 512, 1 << 30)),
}

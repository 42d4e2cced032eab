"""Communication that slows compute by the kernel's bound: a compute-bound kernel beside a collective
pays the op's figure (the SMs NCCL's thread blocks take), a memory-bound one the HBM share of where
the collective runs (gpu.overlap_slowdown_memory); platforms without that key (A100's measured 5%)
apply the op's figure to every kernel (simgpu.kernels.overlap, simgpu.engine.core)."""

from __future__ import annotations

import numpy as np
import pytest

from simgpu.comm.planner import Planner
from simgpu.config.loader import load_job, load_platform
from simgpu.config.platform import PlatformSpec
from simgpu.engine import Engine, EngineOptions
from simgpu.graph import CollectiveCall, KernelSpec, MemoryEstimate, Op, Program, Workload
from simgpu.kernels.overlap import applied, hbm_share, hbm_share_across_nodes, main, memory_bound, memory_slowdown
from simgpu.platform.topology import Topology

#: an elementwise add of 2^26 bf16 elements (memory-bound) and a 4096^3 bf16 GEMM (compute-bound)
ADD = KernelSpec.make("elementwise", "bf16", numel=2**26, reads=2, writes=1)
GEMM = KernelSpec.make("gemm", "bf16", m=4096, n=4096, k=4096)
DERIVED = ("dgx_h100", "dgx_h200", "dgx_b200", "aws_p5", "gcp_a3mega", "h100_ndr_cluster", "h100_ndr_cluster00")


def _beside_all_reduce(p: PlatformSpec, nodes: int, gpn: int, *, bound: bool = True) -> dict[str, float]:
    """Each kernel's time (1 ms alone) when it starts while a 1 GiB all-reduce over two GPUs runs."""
    progs = []
    for r in range(2):
        call = CollectiveCall("ar", "all_reduce", (0, 1), 1 << 30)
        progs.append(Program(r, [Op("ar", "collective", "comm", stream="comm", coll=call, nbytes=1 << 30),
                                 Op("add", "kernel", "elementwise", kernel=0),
                                 Op("gemm", "kernel", "gemm", kernel=1)]))
    kernels = [ADD, GEMM]
    wl = Workload("beside", progs, kernels, [MemoryEstimate()] * 2, samples=1,
                  memory_bound=memory_bound(kernels, p.gpu) if bound else None)
    topo = Topology(p, nodes, gpn)
    # launches of 1 us: both members have arrived (the all-reduce moves bytes) when the kernels start
    opts = EngineOptions(launch_s=1e-6, cpu_threads_per_node=128, overlap_slowdown=p.gpu.overlap_slowdown,
                         sms=p.gpu.sms, overlap_slowdown_by_op=tuple(sorted(p.gpu.overlap_slowdown_by_op.items())),
                         overlap_slowdown_memory=tuple(sorted(p.gpu.overlap_slowdown_memory.items())))
    res = Engine(topo, wl, np.array([1e-4, 1e-4]), ["fixed"] * 2, Planner(topo, p.collectives), opts).run()
    rec = res.records[(res.records["rank"] == 0) & (res.records["kind"] == "kernel")]
    ar = res.records[(res.records["rank"] == 0) & (res.records["name"] == "ar")].iloc[0]
    assert rec["end_s"].max() < ar["end_s"], "both kernels run beside the all-reduce"
    return {str(k["name"]): float(k["end_s"] - k["start_s"]) for _, k in rec.iterrows()}


def test_the_roofline_decides_each_kernels_bound():
    """Bytes at the achievable HBM bandwidth against FLOPs at the achievable FLOP/s (H100: the ridge
    at 989.4 x 0.8 / (3,350 x 0.85) = 278 FLOP/B): elementwise, norms, the optimizer, embeddings,
    decode-size GEMMs and decode attention are memory-bound; a large GEMM and training-size
    attention compute-bound; a family the roofline does not know counts as compute-bound."""
    gpu = load_platform("dgx_h100")[0].gpu
    shapes = {
        "add": (ADD, True),
        "norm": (KernelSpec.make("norm", "bf16", rows=4096, cols=8192), True),
        "adam": (KernelSpec.make("optimizer", "fp32", numel=1e9, states=2), True),
        "lookup": (KernelSpec.make("embedding_fwd", "fp32", batch=4096, tables=8, pooling=20, dim=128, rows=10**6),
                   True),
        "decode gemm": (KernelSpec.make("gemm", "bf16", m=8, n=8192, k=8192), True),
        "gemm": (GEMM, False),
        "attention": (KernelSpec.make("attention_fwd", "bf16", batch=1, heads=32, seq_q=4096, seq_kv=4096,
                                      head_dim=128, causal=1), False),
        "decode attention": (KernelSpec.make("attention_fwd", "bf16", batch=8, heads=32, seq_q=1, seq_kv=4096,
                                             head_dim=128), True),
        "replayed": (KernelSpec.make("trace_kernel", "bf16", id=3), False),
    }
    got = memory_bound([k for k, _ in shapes.values()], gpu)
    assert dict(zip(shapes, got, strict=True)) == {name: want for name, (_, want) in shapes.items()}
    memo: dict[KernelSpec, bool] = {}
    assert memory_bound([ADD, GEMM], gpu, memo) == [True, False] and memo == {ADD: True, GEMM: False}


def test_memory_bound_kernel_pays_the_hbm_share_a_gemm_the_sm_share(dgx_h100):
    """H100 beside an all-reduce of two GPUs in a node: the add loses u / (1 - u) with u = 3 x 450 x
    0.8 / (3,350 x 0.85) (61.1%), the GEMM 16 / (132 - 16) (13.8%, the NVLS all-reduce's 16 thread
    blocks); across two nodes the add loses the NIC's share, u = 3 x 50 x 0.92 / (3,350 x 0.85)
    (5.1%), the GEMM the same 13.8%."""
    u = 3 * 450 * 0.8 / (3350 * 0.85)
    v = 3 * 400 / 8 * 0.92 / (3350 * 0.85)
    assert hbm_share(dgx_h100) == pytest.approx(u) and hbm_share_across_nodes(dgx_h100) == pytest.approx(v)
    inside = _beside_all_reduce(dgx_h100, 1, 2)
    assert inside["add"] == pytest.approx(1e-4 * (1 + u / (1 - u)), rel=2e-3)  # the shipped figure has 3 digits
    assert inside["gemm"] == pytest.approx(1e-4 * (1 + 16 / 116), rel=2e-3)
    across = _beside_all_reduce(dgx_h100, 2, 1)
    assert across["add"] == pytest.approx(1e-4 * (1 + v / (1 - v)), rel=2e-3)
    assert across["gemm"] == pytest.approx(inside["gemm"], rel=1e-12)
    # without the flags (a caller that does not set them) every kernel is compute-bound, as before
    plain = _beside_all_reduce(dgx_h100, 1, 2, bound=False)
    assert plain["add"] == pytest.approx(plain["gemm"], rel=1e-12) == inside["gemm"]


def test_a_memory_bound_kernel_beside_a_waiting_collective_pays_nothing(dgx_h100):
    """Rank 0's all-reduce waits for rank 1, busy with a 1 ms kernel: NCCL's kernel holds its SMs
    while it waits (the GEMM beside it loses 13.8%) but moves no bytes (the add loses nothing)."""
    progs = []
    for r in range(2):
        call = CollectiveCall("ar", "all_reduce", (0, 1), 1 << 20)
        ar = Op("ar", "collective", "comm", stream="comm", coll=call, nbytes=1 << 20)
        ops = ([ar, Op("add", "kernel", "elementwise", kernel=0), Op("gemm", "kernel", "gemm", kernel=1)] if r == 0
               else [Op("long", "kernel", "gemm", kernel=2), Op("ar", "collective", "comm", stream="comm",
                                                                coll=call, nbytes=1 << 20, deps=(0,))])
        progs.append(Program(r, ops))
    kernels = [ADD, GEMM, KernelSpec.make("gemm", "bf16", m=8192, n=8192, k=8192)]
    wl = Workload("waiting", progs, kernels, [MemoryEstimate()] * 2, samples=1,
                  memory_bound=memory_bound(kernels, dgx_h100.gpu))
    topo = Topology(dgx_h100, 1, 2)
    g = dgx_h100.gpu
    opts = EngineOptions(launch_s=0.0, cpu_threads_per_node=128, overlap_slowdown=g.overlap_slowdown, sms=g.sms,
                         overlap_slowdown_by_op=tuple(sorted(g.overlap_slowdown_by_op.items())),
                         overlap_slowdown_memory=tuple(sorted(g.overlap_slowdown_memory.items())))
    res = Engine(topo, wl, np.array([1e-4, 1e-4, 1e-3]), ["fixed"] * 3, Planner(topo, dgx_h100.collectives),
                 opts).run()
    rec = res.records[(res.records["rank"] == 0) & (res.records["kind"] == "kernel")].set_index("name")
    assert rec.loc["gemm", "end_s"] < 1e-3  # both ran while the all-reduce waited for rank 1
    assert rec.loc["add", "end_s"] - rec.loc["add", "start_s"] == pytest.approx(1e-4, rel=1e-12)
    assert rec.loc["gemm", "end_s"] - rec.loc["gemm", "start_s"] == pytest.approx(1e-4 * (1 + g.overlap_slowdown_by_op[
        "all_reduce"]), rel=1e-12)


def test_a_platform_without_memory_figures_keeps_its_one_figure(dgx_a100):
    """A100's 5% (GPUSpec's overlap_slowdown, measured over every kernel beside the collective) holds
    for both bounds, within a node and across nodes."""
    assert not dgx_a100.gpu.overlap_slowdown_memory and not dgx_a100.gpu.overlap_slowdown_by_op
    for nodes, gpn in ((1, 2), (2, 1)):
        t = _beside_all_reduce(dgx_a100, nodes, gpn)
        assert t["add"] == pytest.approx(1.05e-4, rel=1e-12) == t["gemm"]
    assert applied(dgx_a100, "all_reduce") == (0.05, 0.05, 0.05)


@pytest.mark.parametrize("name", DERIVED)
def test_unmeasured_generations_ship_the_derived_memory_figures(name):
    p, _ = load_platform(name)
    shipped = {str(k): v for k, v in p.gpu.overlap_slowdown_memory.items()}
    assert shipped == {k: pytest.approx(v, abs=5e-4) for k, v in memory_slowdown(p).items()}
    op, node, net = applied(p, "all_gather")
    assert (op, node, net) == (p.gpu.overlap_slowdown_by_op["all_gather"], shipped["within_node"],
                               shipped["across_nodes"])


def test_simulate_marks_the_kernels_by_their_bound(monkeypatch):
    """The programs simgpu.simulate hands the engine for an H100 carry each kernel shape's bound
    (norms and elementwise memory-bound, GEMMs compute-bound); an A100's carry none (nothing reads
    them there)."""
    from simgpu.engine import shortcuts
    from simgpu.sim import simulate

    seen: list[Workload] = []

    class Spy(Engine):
        def __init__(self, topo, workload, *args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(workload)
            super().__init__(topo, workload, *args, **kwargs)

    monkeypatch.setattr(shortcuts, "Engine", Spy)
    simulate(load_job("workloads/gpt_2x_dgx_h100.yaml", ["model.layers=1"]))
    w = seen[-1]
    assert w.memory_bound is not None
    fam: dict[str, set[bool]] = {}
    for k, b in zip(w.kernels, w.memory_bound, strict=True):
        fam.setdefault(k.family, set()).add(b)
    assert fam["norm"] == {True} and fam["optimizer"] == {True} and fam["gemm"] == {False}
    seen.clear()
    simulate(load_job("workloads/gpt_2x_dgx_h100.yaml", ["model.layers=1", "platform=dgx_a100"]))
    assert seen[-1].memory_bound is None


def test_command_says_what_applies(capsys):
    assert main(["dgx_h100", "dgx_a100"]) == 0
    out = capsys.readouterr().out
    assert "applied now" in out and "61.1%" in out and "5.1%" in out

"""Small synthetic Kineto traces built in the tests (never copied from real data), and the parser on them.

:class:`Synth` writes one rank's trace event by event with self-consistent times: a kernel starts
when its launch call has returned, its stream is free and the ops it waits for have ended; a
synchronisation returns when the GPU work it waits for has finished. Times are microseconds.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from simgpu.trace import load_rank_trace
from simgpu.trace.kineto import parse_kineto

A100 = "NVIDIA A100-SXM4-80GB"
NCCL_AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
GEMM = "ampere_sgemm_128x64_nn"
ELTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int)"


class Synth:
    """One rank's trace; see the module docstring. ``skew_us`` shifts every timestamp (its clock)."""

    def __init__(self, rank: int = 0, world: int = 1, *, gpu: str = A100, t0: float = 1_000_000.0,
                 pid: int = 4242, tid: int = 11, skew_us: float = 0.0) -> None:
        self.rank, self.world, self.gpu, self.pid, self.tid, self.skew = rank, world, gpu, pid, tid, skew_us
        self.t = t0
        self.events: list[dict[str, Any]] = []
        self.free: dict[int, float] = {}
        self.corr = 1000

    def _span(self, cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid, "ts": ts, "dur": dur, "args": args}
        self.events.append(ev)
        return ev

    def host(self, us: float, name: str = "aten::empty") -> None:
        """CPU work with no GPU effect."""
        self._span("cpu_op", name, self.t, us)
        self.t += us

    def launch(self, name: str, stream: int = 7, dur: float = 10.0, *, cpu: float = 5.0,
               after: Sequence[dict[str, Any]] = (), cat: str = "kernel", call: str = "cudaLaunchKernel",
               args: dict[str, Any] | None = None, op: str | None = None, dims: Any = None,
               types: Any = None, start: float | None = None) -> dict[str, Any]:
        """Launch a GPU op; returns its event. ``after``: ops of other streams it waits for."""
        self.corr += 1
        if op is not None:
            extra: dict[str, Any] = {} if dims is None else {"Input Dims": dims, "Input type": types or ["float"]}
            self._span("cpu_op", op, self.t - 1.0, cpu + 2.0, **extra)
        self._span("cuda_runtime", call, self.t, cpu, correlation=self.corr)
        ready = max([self.t + cpu, self.free.get(stream, 0.0)] + [k["ts"] + k["dur"] for k in after])
        ts = ready if start is None else max(start, ready)
        kernel = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                  "args": {"stream": stream, "correlation": self.corr, "device": 0, **(args or {})}}
        self.events.append(kernel)
        self.free[stream] = ts + dur
        self.t += cpu
        return kernel

    def allreduce(self, nbytes: int, stream: int = 20, dur: float = 100.0, **kw: Any) -> dict[str, Any]:
        args = {"Collective name": "allreduce", "In msg nelems": nbytes // 4, "Out msg nelems": nbytes // 4,
                "Group size": self.world, "dtype": "Float", "Process Group Name": "0",
                "Process Group Ranks": str(list(range(self.world)))}
        return self.launch(NCCL_AR, stream, dur, args=args, **kw)

    def set_end(self, kernel: dict[str, Any], end: float) -> None:
        """Make ``kernel`` end at ``end`` (a collective that waited for its peers)."""
        kernel["dur"] = end - kernel["ts"]
        stream = kernel["args"]["stream"]
        self.free[stream] = max(self.free.get(stream, 0.0), end)

    def sync(self, name: str = "cudaDeviceSynchronize", stream: int | None = None, cpu: float = 3.0) -> None:
        """Block until the GPU (or ``stream``) is idle."""
        busy = [v for s, v in self.free.items() if stream is None or s == stream]
        end = max([self.t + cpu] + [b + 1.0 for b in busy])
        self._span("cuda_runtime", name, self.t, end - self.t, correlation=self._next())
        self.t = end

    def _next(self) -> int:
        self.corr += 1
        return self.corr

    @contextmanager
    def step(self, number: int) -> Iterator[None]:
        start = self.t
        yield
        self._span("user_annotation", f"ProfilerStep#{number}", start, self.t - start)

    def doc(self) -> dict[str, Any]:
        events = [dict(e, ts=e["ts"] + self.skew) for e in self.events]
        return {"schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": self.gpu, "numSms": 108}],
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
                "traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: Path, *, gz: bool = True) -> Path:
        text = json.dumps(self.doc())
        if gz:
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path


def training_step(s: Synth, n: int, *, gemms: int = 4, ar_bytes: int = 0, host_us: float = 30.0) -> None:
    """One step: data copy, forward and backward GEMMs, an all-reduce of gradients, a sync."""
    with s.step(n):
        s.host(host_us, "enumerate(DataLoader)")
        s.launch("Memcpy HtoD (Pinned -> Device)", 7, 20.0, cat="gpu_memcpy", call="cudaMemcpyAsync")
        last = None
        for i in range(gemms):
            s.host(8.0, "aten::linear")
            last = s.launch(GEMM, 7, 80.0 + 10 * i, op="aten::mm", dims=[[1024, 512], [512, 1024]])
            s.launch(ELTWISE, 7, 6.0, op="aten::relu")
        if ar_bytes:
            s.host(5.0, "nccl:all_reduce")
            s.allreduce(ar_bytes, after=[last] if last else ())
        s.host(10.0, "Optimizer.step")
        s.sync()


def simple_trace(rank: int = 0, world: int = 1, steps: int = 3, **kw: Any) -> Synth:
    s = Synth(rank, world)
    for n in range(steps):
        training_step(s, n + 1, **kw)
    return s


# ----------------------------------------------------------------------------- the parser on them


def test_parse_reads_calls_gpu_ops_steps_and_header(tmp_path: Path) -> None:
    s = simple_trace(rank=3, world=8, ar_bytes=1 << 20)
    tr = load_rank_trace(s.write(tmp_path / "r3.json.gz"))
    assert (tr.rank, tr.world_size, tr.gpu) == (3, 8, A100)
    assert [st.number for st in tr.steps] == [1, 2, 3]
    kinds = {g.kind for g in tr.gpu_ops}
    assert kinds == {"kernel", "memcpy"}
    nccl = [g for g in tr.gpu_ops if "nccl" in g.name]
    assert len(nccl) == 3 and nccl[0].coll is not None and nccl[0].coll["In msg nelems"] == (1 << 20) // 4
    assert {c.corr for c in tr.calls} >= {g.corr for g in tr.gpu_ops}  # every op has its launch
    assert not tr.truncated and not tr.warnings
    # times are relative to the first event and keep their spacing
    assert tr.base_us == pytest.approx(s.events[0]["ts"])
    step1 = next(e for e in s.events if e["name"] == "ProfilerStep#1")
    assert tr.steps[0].ts == pytest.approx(step1["ts"] - tr.base_us)
    assert tr.steps[0].dur == pytest.approx(step1["dur"])


def test_plain_json_and_gzip_read_the_same(tmp_path: Path) -> None:
    s = simple_trace()
    a = load_rank_trace(s.write(tmp_path / "a.json", gz=False))
    b = load_rank_trace(s.write(tmp_path / "b.json.gz"))
    assert [(g.name, g.ts, g.dur) for g in a.gpu_ops] == [(g.name, g.ts, g.dur) for g in b.gpu_ops]


def test_flow_events_link_kernels_without_correlation() -> None:
    s = Synth()
    k = s.launch(GEMM, 7, 50.0)
    call = next(e for e in s.events if e["cat"] == "cuda_runtime")
    del k["args"]["correlation"]
    fid = call["args"]["correlation"]
    # flow end before the kernel in the file, as Kineto sometimes writes it
    s.events.insert(0, {"ph": "f", "cat": "ac2g", "id": fid, "pid": 0, "tid": 7, "ts": k["ts"], "bp": "e"})
    s.events.append({"ph": "s", "cat": "ac2g", "id": fid, "pid": s.pid, "tid": s.tid, "ts": call["ts"]})
    tr = parse_kineto(s.doc(), "mem")
    assert tr.gpu_ops[0].corr == fid
    assert not tr.warnings

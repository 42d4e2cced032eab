"""The torch code of each measured case: inputs on the device and the call to time.

:func:`build` turns a :class:`~simgpu.bench.cases.Case` into a :class:`Bench`: ``run`` is the timed
call, ``prepare`` (if any) the untimed work before each call (the forward whose backward is timed),
``features`` the measured index-reuse statistics of an embedding case, and ``cold`` whether the
call is timed from cold caches. Backward ops are timed
through autograd, as a training step runs them. Each op mirrors what the workload builders emit:
``linear`` is ``nn.Linear``'s forward (``m`` rows, ``n`` outputs, ``k`` inputs), ``dgrad`` and
``wgrad`` its two backward GEMMs in autograd's layouts, an embedding case one fused bag over
``tables`` tables whose backward applies SGD to the touched rows (sparse gradients), a ``moe`` case
the local experts' fc1, activation and fc2 as batched GEMMs over the experts that get a token (the
rows spread evenly), or the input- or weight-gradient GEMMs of the same shapes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels.lookups import REUSE, reuse_stats
from .cases import Case
from .indices import draw

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: Parameters of an optimizer case are split over this many tensors, as a model's layers are.
OPTIMIZER_TENSORS = 8


@dataclass
class Bench:
    """A ready-to-time op; see the module docstring."""

    run: Callable[[], object]
    prepare: Callable[[], object] | None = None
    features: dict[str, float] = field(default_factory=dict)
    cold: bool = False  # time from cold caches (the harness flushes them after prepare)


def _divisor_at_most(n: int, limit: int) -> int:
    for c in range(min(n, limit), 0, -1):
        if n % c == 0:
            return c
    return 1


def build(case: Case, device: str, seed: int) -> Bench:
    """The :class:`Bench` of ``case`` on ``device``; inputs drawn from ``seed`` and the case's key."""
    import torch

    salt = zlib.crc32(case.key().encode())
    gen = torch.Generator().manual_seed(seed * 1_000_003 + salt)
    rng = np.random.default_rng([seed, salt])
    dt = getattr(torch, _TORCH_DTYPES[case.dtype])

    def rand(*shape: int, grad: bool = False, dtype: Any = dt) -> Any:
        t = torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    fam, op = case.family, case.op
    g = {k: int(v) for k, v in case.params}
    if fam == "gemm":
        m, n, k = g["m"], g["n"], g["k"]
        if op == "linear":
            x, w, b = rand(m, k), rand(n, k, grad=True), rand(n, grad=True)  # autograd records, as in training
            return Bench(lambda: torch.nn.functional.linear(x, w, b))
        if op == "dgrad":  # grad_input = grad_out[m, out] @ W[out, in]
            a, w = rand(m, k), rand(k, n)
            return Bench(lambda: torch.mm(a, w))
        a, x = rand(k, m), rand(k, n)  # wgrad: grad_W = grad_out^T @ x, reduced over k rows
        return Bench(lambda: torch.mm(a.t(), x))
    if fam == "bmm":
        a, b2 = rand(g["b"], g["m"], g["k"]), rand(g["b"], g["k"], g["n"])
        return Bench(lambda: torch.bmm(a, b2))
    if fam.startswith("attention"):
        return _attention(case, g, rand)
    if fam.startswith("embedding"):
        return _embedding(case, g, device, rng, rand)
    if fam == "elementwise":
        return _elementwise(op, g["numel"], rand)
    if fam in ("norm", "softmax"):
        return _rowwise(case, g, rand)
    if fam == "memcpy":
        n = max(1, g["nbytes"] // 4)
        host = torch.empty(n, dtype=torch.float32, pin_memory=device == "cuda")
        dev = torch.empty(n, dtype=torch.float32, device=device)
        if op == "h2d":
            return Bench(lambda: dev.copy_(host, non_blocking=True))
        return Bench(lambda: host.copy_(dev, non_blocking=True))
    if fam == "optimizer":
        return _optimizer(op, g["numel"], device, rand)
    if fam == "moe":
        return _moe(g, rand)
    raise ValueError(f"the harness has no torch code for family {fam!r}")


def _attention(case: Case, g: dict[str, int], rand: Callable[..., Any]) -> Bench:
    import torch

    shape = (g["batch"], g["heads"], g["seq_q"], g["head_dim"])
    kv_shape = (g["batch"], g["heads"], g["seq_kv"], g["head_dim"])
    causal = bool(g["causal"])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if case.family == "attention_fwd":
        q, k, v = rand(*shape), rand(*kv_shape), rand(*kv_shape)
        return Bench(lambda: sdpa(q, k, v, is_causal=causal))
    q, k, v = rand(*shape, grad=True), rand(*kv_shape, grad=True), rand(*kv_shape, grad=True)
    dy = rand(*shape)
    state: dict[str, Any] = {}

    def prepare() -> None:
        q.grad = k.grad = v.grad = None
        state["y"] = sdpa(q, k, v, is_causal=causal)

    return Bench(lambda: state["y"].backward(dy), prepare)


def _embedding(case: Case, g: dict[str, int], device: str, rng: np.random.Generator,
               rand: Callable[..., Any]) -> Bench:
    import torch

    batch, tables, pooling, dim, rows = g["batch"], g["tables"], g["pooling"], g["dim"], g["rows"]
    bag = torch.nn.EmbeddingBag(tables * rows, dim, mode="sum", sparse=True).to(device)
    ids_np, stats = [], []
    for t in range(tables):
        ids = draw(case.dist, rows, batch * pooling, rng)
        stats.append(reuse_stats(ids, rows))
        ids_np.append(ids + t * rows)
    ids_t = torch.from_numpy(np.concatenate(ids_np)).to(device)
    offsets = torch.arange(0, batch * tables * pooling, pooling, dtype=torch.int64, device=device)
    features = {r: float(np.mean([s[r] for s in stats])) for r in REUSE}
    # In a training step the rest of the step evicts a table's rows between its lookups, so they are
    # timed from cold caches (rows come from memory), not from the last repeat's cache.
    if case.family == "embedding_fwd":
        return Bench(lambda: bag(ids_t, offsets), features=features, cold=True)
    opt = torch.optim.SGD(bag.parameters(), lr=0.01)
    dy = rand(batch * tables, dim, dtype=torch.float32)
    state: dict[str, Any] = {}

    def prepare() -> None:
        bag.weight.grad = None
        state["y"] = bag(ids_t, offsets)

    def run() -> None:
        state["y"].backward(dy)
        opt.step()

    return Bench(run, prepare, features, cold=True)


def _elementwise(op: str, numel: int, rand: Callable[..., Any]) -> Bench:
    import torch

    a, b = rand(numel), rand(numel)
    cols = _divisor_at_most(numel, 1024)
    a2 = a.view(numel // cols, cols)
    aten = torch.ops.aten
    fns: dict[str, Callable[[], object]] = {
        "add": lambda: torch.add(a, b), "mul": lambda: torch.mul(a, b), "relu": lambda: torch.relu(a),
        "gelu": lambda: torch.nn.functional.gelu(a), "copy": lambda: b.copy_(a),
        "transpose": lambda: a2.t().contiguous(),
        "cat": lambda: torch.cat((a[: numel // 2], a[numel // 2:])),
        "relu_bwd": lambda: aten.threshold_backward(b, a, 0.0),
        "gelu_bwd": lambda: aten.gelu_backward(b, a),
        "sum_rows": lambda: a2.sum(0), "zero": lambda: b.zero_(),
    }
    if op not in fns:
        raise ValueError(f"the harness has no elementwise op {op!r}")
    return Bench(fns[op])


def _rowwise(case: Case, g: dict[str, int], rand: Callable[..., Any]) -> Bench:
    import torch.nn.functional as F

    rows, cols, bwd = g["rows"], g["cols"], bool(g["bwd"])
    x, w, b = rand(rows, cols, grad=bwd), rand(cols, grad=True), rand(cols, grad=True)
    fns: dict[str, Callable[[], Any]] = {
        "layernorm": lambda: F.layer_norm(x, (cols,), w, b),
        "rmsnorm": lambda: F.rms_norm(x, (cols,), w),
        "softmax": lambda: F.softmax(x, -1),
        "log_softmax": lambda: F.log_softmax(x, -1),
    }
    fn = fns[case.op]
    if not bwd:
        return Bench(fn)
    dy = rand(rows, cols)
    state: dict[str, Any] = {}

    def prepare() -> None:
        x.grad = w.grad = b.grad = None
        state["y"] = fn()

    return Bench(lambda: state["y"].backward(dy), prepare)


def _moe(g: dict[str, int], rand: Callable[..., Any]) -> Bench:
    import torch
    import torch.nn.functional as F

    rows, hidden, inter, gated = max(g["rows"], 1), g["hidden"], g["inter"], bool(g["gated"])
    active = min(g["experts"], rows)
    m, up = -(-rows // active), inter * (2 if gated else 1)
    x, w1, w2 = rand(active, m, hidden), rand(active, hidden, up), rand(active, inter, hidden)

    def act(h: Any) -> Any:
        return F.silu(h[..., :inter]) * h[..., inter:] if gated else F.gelu(h)

    if g["bwd"] == 0:
        return Bench(lambda: torch.bmm(act(torch.bmm(x, w1)), w2))
    dy, h = rand(active, m, hidden), rand(active, m, up)
    if g["bwd"] == 1:  # input gradients: fc2's, the activation's (its gate and up halves), fc1's
        def dgrad() -> Any:
            da = torch.bmm(dy, w2.transpose(1, 2))
            dh = torch.cat((da * h[..., inter:], da * h[..., :inter]), -1) if gated else da * h
            return torch.bmm(dh, w1.transpose(1, 2))

        return Bench(dgrad)
    a, dh = rand(active, m, inter), rand(active, m, up)
    return Bench(lambda: (torch.bmm(a.transpose(1, 2), dy), torch.bmm(x.transpose(1, 2), dh)))


def _optimizer(op: str, numel: int, device: str, rand: Callable[..., Any]) -> Bench:
    import torch

    sizes = np.diff(np.linspace(0, numel, OPTIMIZER_TENSORS + 1).astype(int))
    params = [torch.nn.Parameter(rand(max(1, int(s)), dtype=torch.float32)) for s in sizes]
    for p in params:
        p.grad = rand(p.numel(), dtype=torch.float32)
    cls = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[op]
    opt = cls(params, lr=1e-3, fused=True)
    return Bench(opt.step)

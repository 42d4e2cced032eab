"""The shape sweeps of the harness: which (family, op, dtype, parameters) cases to measure.

A :class:`Case` names its kernel family and parameters exactly as
:class:`~simgpu.graph.KernelSpec` does (``gemm`` ``m, n, k``; ``embedding_fwd`` ``batch,
tables, pooling, dim, rows``; ...), plus the torch ``op`` that realises it and, for embedding
lookups, the index distribution. Shapes are drawn log-uniformly from one ``numpy.random.Generator``
seeded by the caller, so a seed and a scale give the same list every time. A :class:`Scale` caps
the work of one case (FLOPs, bytes): small on a CPU, large on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from ..errors import ConfigError

#: The op groups ``--ops`` accepts, in the order they are measured.
GROUPS: Final = ("gemm", "bmm", "attention", "embedding", "elementwise", "norm", "softmax", "memcpy",
                 "optimizer", "moe")
#: Elementwise ops: (tensor reads, tensor writes) per output element. Each op's arithmetic per element
#: is not a column of the measurements: the fit takes it from the op's name
#: (:data:`simgpu.elementwise.FLOPS_PER_ELEMENT`, which must know every op here).
ELEMENTWISE: Final = {"add": (2, 1), "mul": (2, 1), "relu": (1, 1), "gelu": (1, 1), "copy": (1, 1),
                      "transpose": (1, 1), "cat": (1, 1), "relu_bwd": (2, 1), "gelu_bwd": (2, 1),
                      "sum_rows": (1, 0), "zero": (0, 1)}
#: Embedding index distributions: ``uniform``, ``zipf<a>`` (P(row i) ~ 1/(i+1)^a over a random
#: permutation of the rows), ``hot<p>_<q>`` (p% of the rows take q% of the lookups).
DISTRIBUTIONS: Final = ("uniform", "zipf0.8", "zipf1.05", "zipf1.2", "hot1_90", "hot10_50")
#: Optimizers: name -> state tensors per parameter.
OPTIMIZERS: Final = {"sgd": 0, "adagrad": 1, "adam": 2}


@dataclass(frozen=True)
class Scale:
    """Limits of one case on a device and how many shapes each group draws."""

    max_flops: float      # FLOPs of one call
    max_bytes: float      # bytes touched by one call
    max_dim: int          # largest GEMM / row edge
    shapes: int           # shapes per group and dtype (groups scale it)


SCALES: Final = {
    "cpu": Scale(max_flops=1.5e9, max_bytes=2.0e8, max_dim=4096, shapes=100),
    "cuda": Scale(max_flops=2.0e12, max_bytes=4.0e9, max_dim=16384, shapes=160),
}


@dataclass(frozen=True)
class Case:
    """One measurement: a kernel family's shape, its dtype and the torch op that realises it."""

    family: str
    op: str
    dtype: str
    params: tuple[tuple[str, float], ...]
    dist: str = ""

    @staticmethod
    def make(family: str, op: str, dtype: str, dist: str = "", **params: float) -> Case:
        return Case.of(family, op, dtype, params, dist)

    @staticmethod
    def of(family: str, op: str, dtype: str, params: Mapping[str, float], dist: str = "") -> Case:
        return Case(family, op, dtype, tuple(sorted((k, float(v)) for k, v in params.items())), dist)

    def get(self, name: str) -> float:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(f"{self.family} case has no parameter {name!r}")

    def key(self) -> str:
        """A stable text key; the harness skips cases whose key is already in its output."""
        ps = ",".join(f"{k}={v:g}" for k, v in self.params)
        return f"{self.family}|{self.op}|{self.dtype}|{self.dist}|{ps}"


def _logint(rng: np.random.Generator, lo: float, hi: float, multiple: int = 1) -> int:
    """A log-uniform integer in [lo, hi], often rounded to ``multiple`` (as real shapes are)."""
    x = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    if multiple > 1 and rng.random() < 0.7:
        x = max(multiple, round(x / multiple) * multiple)
    return max(int(lo), min(int(hi), round(x)))


def _dims(rng: np.random.Generator, flops: float, lo: float, hi: float, multiple: int, n: int,
          balance: float) -> list[int]:
    """``n`` dimensions whose product is about ``flops / 2``, split at random in log space (the
    larger ``balance``, the closer to equal; training GEMMs are rarely more than ~30:1)."""
    shares = rng.dirichlet(np.full(n, balance))
    out = []
    for share in shares:
        x = float(np.clip(np.exp(share * np.log(flops / 2.0)), lo, hi))
        if multiple > 1 and rng.random() < 0.7:
            x = max(multiple, round(x / multiple) * multiple)
        out.append(round(min(x, hi)))
    return out


def _gemm(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    # FLOPs log-uniform, then split over m, n, k: large GEMMs, which dominate training steps, are as
    # common as small ones. In fp32 each shape in the three layouts of nn.Linear (forward, dgrad,
    # wgrad), which a kernel spec does not tell apart: the model learns their typical time.
    # A quarter of the shapes have every edge a multiple of 128, as model widths and token counts
    # usually are (and the edges a tiled kernel runs fastest on).
    for dtype, n_shapes in (("fp32", s.shapes * 4), ("bf16", s.shapes)):
        made = 0
        while made < n_shapes:
            flops = float(np.exp(rng.uniform(np.log(1e5), np.log(s.max_flops))))
            if made % 4 == 3:
                m, n, k = _dims(rng, flops, 128, s.max_dim, 128, 3, 6.0)
                m, n, k = (max(128, 128 * round(x / 128)) for x in (m, n, k))
            else:
                m, n, k = _dims(rng, flops, 8, s.max_dim, 64 if rng.random() < 0.5 else 8, 3, 6.0)
            if 2.0 * m * n * k > s.max_flops:
                continue
            made += 1
            for op in ("linear", "dgrad", "wgrad") if dtype == "fp32" else ("linear",):
                yield Case.make("gemm", op, dtype, m=m, n=n, k=k)


def _bmm(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    for dtype, n_shapes in (("fp32", s.shapes * 4), ("bf16", s.shapes)):
        made = 0
        while made < n_shapes:
            flops = float(np.exp(rng.uniform(np.log(1e4), np.log(s.max_flops))))
            b, m, n, k = _dims(rng, flops, 1, s.max_dim // 2, 8, 4, 1.5)
            if 2.0 * b * m * n * k > s.max_flops or b * (m * k + k * n + m * n) * 4 > s.max_bytes:
                continue
            made += 1
            yield Case.make("bmm", "bmm", dtype, b=b, m=m, n=n, k=k)


def _attention(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    made = 0
    while made < s.shapes:
        batch, heads = _logint(rng, 1, 32, 2), _logint(rng, 1, 32, 2)
        seq = _logint(rng, 16, 2048 if s.max_dim <= 4096 else 8192, 64)
        d = int(rng.choice([32, 64, 128]))
        causal = int(rng.random() < 0.6)
        if 4.0 * batch * heads * seq * seq * d * 3.5 > s.max_flops * 2:
            continue
        made += 1
        for fam in ("attention_fwd", "attention_bwd"):
            yield Case.make(fam, "sdpa", "fp32", batch=batch, heads=heads, seq_q=seq, seq_kv=seq, head_dim=d,
                            causal=causal)


def _embedding(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    made = 0
    while made < s.shapes * 4:
        rows = _logint(rng, 1_000, 2_000_000 if s.max_bytes < 1e9 else 20_000_000)
        dim = int(rng.choice([4, 8, 16, 32, 64, 128, 256]))
        tables = _logint(rng, 1, 16)
        batch = _logint(rng, 16, 8192, 16)
        pooling = _logint(rng, 1, 64)
        lookups = batch * tables * pooling
        if rows * tables * dim * 4 > s.max_bytes * 2 or lookups * dim * 4 > s.max_bytes / 2:
            continue
        made += 1
        dist = DISTRIBUTIONS[int(rng.integers(len(DISTRIBUTIONS)))]
        for fam in ("embedding_fwd", "embedding_bwd"):
            yield Case.make(fam, "embedding_bag", "fp32", dist, batch=batch, tables=tables, pooling=pooling,
                            dim=dim, rows=rows)


def _elementwise(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    for dtype, n_sizes in (("fp32", s.shapes // 3), ("bf16", s.shapes // 10)):
        for _ in range(n_sizes):
            numel = _logint(rng, 1, s.max_bytes / 16, 1024)
            for op, (reads, writes) in ELEMENTWISE.items():
                yield Case.make("elementwise", op, dtype, numel=numel, reads=reads, writes=writes)


def _rowwise(rng: np.random.Generator, s: Scale, family: str, ops: tuple[str, ...]) -> Iterator[Case]:
    for dtype, n_shapes in (("fp32", s.shapes), ("bf16", s.shapes // 5)):
        made = 0
        while made < n_shapes:
            rows = _logint(rng, 1, 65536, 64)
            cols = _logint(rng, 16, 65536 if family == "softmax" else 16384, 64)
            if rows * cols * 4 * 3 > s.max_bytes:
                continue
            made += 1
            for op in ops:
                for bwd in (0, 1):
                    params: dict[str, float] = {"rows": rows, "cols": cols, "bwd": bwd}
                    if family == "norm":
                        params["rms"] = float(op == "rmsnorm")
                    yield Case.of(family, op, dtype, params)


def _memcpy(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    for _ in range(s.shapes // 4):
        nbytes = _logint(rng, 256, s.max_bytes / 2, 4096)
        for to_device in (1, 0):
            yield Case.make("memcpy", "h2d" if to_device else "d2h", "fp32", nbytes=nbytes, to_device=to_device)


def _optimizer(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    for _ in range(s.shapes // 4):
        numel = _logint(rng, 256, s.max_bytes / 32, 1024)
        for op, states in OPTIMIZERS.items():
            yield Case.make("optimizer", op, "fp32", numel=numel, states=states)


def _moe(rng: np.random.Generator, s: Scale) -> Iterator[Case]:
    # One rank's expert FFNs: token copies spread evenly over the local experts, each shape in its
    # three passes (forward, input gradients, weight gradients), as the MoE builders emit them.
    for dtype, n_shapes in (("fp32", s.shapes // 2), ("bf16", s.shapes // 4)):
        made = 0
        while made < n_shapes:
            experts = int(rng.choice([1, 2, 4, 8, 16]))
            hidden, inter = _logint(rng, 64, s.max_dim, 64), _logint(rng, 32, s.max_dim, 32)
            rows = _logint(rng, 1, 65536, 16)
            gated = int(rng.random() < 0.7)
            active = min(experts, rows)
            per = -(-rows // active)
            if 2.0 * active * per * hidden * inter * (2 + gated) > s.max_flops or \
                    active * hidden * inter * (2 + gated) * 4 > s.max_bytes:
                continue
            made += 1
            topk = int(rng.choice([1, 2, 8]))
            for bwd in (0, 1, 2):
                yield Case.make("moe", "grouped", dtype, rows=rows, experts=experts, hidden=hidden, inter=inter,
                                topk=topk, gated=gated, skew=0, bwd=bwd)


_GENERATORS: Final[dict[str, Callable[[np.random.Generator, Scale], Iterator[Case]]]] = {
    "gemm": _gemm, "bmm": _bmm, "attention": _attention, "embedding": _embedding,
    "elementwise": _elementwise,
    "norm": lambda r, s: _rowwise(r, s, "norm", ("layernorm", "rmsnorm")),
    "softmax": lambda r, s: _rowwise(r, s, "softmax", ("softmax", "log_softmax")),
    "memcpy": _memcpy, "optimizer": _optimizer, "moe": _moe,
}


def parse_groups(text: str) -> list[str]:
    """``gemm,bmm`` or ``all`` -> the groups, validated."""
    names = list(GROUPS) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in _GENERATORS]
    if bad or not names:
        raise ConfigError(f"unknown op group(s) {', '.join(bad) or '(none)'}; expected 'all' or a comma list of: "
                          f"{', '.join(GROUPS)}", key="--ops")
    return names


def sweep(groups: list[str], scale: Scale, seed: int, dtypes: frozenset[str] | None = None) -> list[Case]:
    """The cases of ``groups`` in order; each group draws from its own stream of the seed."""
    out: dict[str, Case] = {}  # by key: a shape drawn twice is measured once
    for g in groups:
        rng = np.random.default_rng([seed, GROUPS.index(g)])
        for c in _GENERATORS[g](rng, scale):
            if dtypes is None or c.dtype in dtypes:
                out.setdefault(c.key(), c)
    return list(out.values())

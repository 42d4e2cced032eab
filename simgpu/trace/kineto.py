"""Reading PyTorch profiler (Kineto) traces: one JSON or gzip-compressed JSON file per rank.

This module owns the file format. It turns a trace into a :class:`RankTrace`: the CUDA runtime
calls of every CPU thread, the GPU activities (kernels, memcpys, memsets) with their stream and
correlation id, the CPU ops and annotations (for names, input shapes and collective arguments),
the ``ProfilerStep#N`` spans, and the job facts of the header (rank, world size, GPU name, process
groups). It knows nothing of the simulator.

Real traces are not always clean: a truncated file (cut JSON or gzip stream) is read up to the
last whole event; events that lack a field they need are dropped; kernels without a correlation
id are linked through the ``ac2g`` flow events where possible. Each such repair is counted in
``RankTrace.warnings`` (message -> count). A file that is not a Kineto trace raises
:class:`~simgpu.errors.ConfigError` naming the file.

Units: microseconds as in the file; every ``ts`` is relative to ``RankTrace.base_us`` (the first
event's timestamp on the rank's own clock), which keeps sub-microsecond precision in floats.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset",
            "memset": "memset"}
SPAN_CATS = frozenset({"cpu_op", "user_annotation", "operator"})
#: Kernel / CPU-op arguments that describe a collective (kept as they are).
COLL_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
             "Process Group Ranks", "Global rank start", "Global rank stride", "In split size", "Out split size")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Call:
    """A CUDA runtime or driver call on a CPU thread."""

    name: str
    tid: int
    ts: float
    dur: float
    corr: int

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True, slots=True, eq=False)
class GpuOp:
    """A kernel, memcpy or memset on a stream; ``coll`` holds collective arguments when recorded."""

    kind: str
    name: str
    stream: int
    ts: float
    dur: float
    corr: int
    nbytes: int = 0
    coll: Mapping[str, Any] | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True, slots=True, eq=False)
class Span:
    """A CPU op or user annotation; ``dims`` / ``types`` are its inputs' shapes and element types."""

    name: str
    tid: int
    ts: float
    end: float
    dims: tuple[Any, ...] | None = None
    types: tuple[Any, ...] | None = None
    ids: tuple[int, ...] = ()
    coll: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One ``ProfilerStep#number`` span on the CPU."""

    number: int
    ts: float
    end: float

    @property
    def dur(self) -> float:
        return self.end - self.ts


@dataclass
class RankTrace:
    """What one rank's trace file holds; see the module docstring."""

    file: str
    rank: int
    world_size: int | None
    gpu: str | None
    pid: int | None
    pg_config: list[dict[str, Any]]
    calls: list[Call]
    gpu_ops: list[GpuOp]
    spans: list[Span]
    steps: list[Step]
    stream_syncs: dict[int, int]
    base_us: float = 0.0
    truncated: bool = False
    warnings: Counter[str] = field(default_factory=Counter)

    @property
    def last_ts(self) -> float:
        """The end of the last runtime call or GPU activity, for completeness checks."""
        return max(max((g.end for g in self.gpu_ops), default=0.0), max((c.end for c in self.calls), default=0.0))


# ------------------------------------------------------------------------------- file reading


def read_document(path: str | Path) -> tuple[Any, bool]:
    """The JSON document in ``path`` (plain or gzip) and whether it had to be recovered from a cut.

    Raises :class:`ConfigError` when the file is missing, empty or not JSON at all.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the trace: {e.strerror or e}; expected a readable PyTorch profiler "
                          "(Kineto) JSON trace", file=str(path)) from None
    cut = False
    if raw[:2] == b"\x1f\x8b":
        raw, cut, bad = _gunzip(raw)
        if bad is not None and not raw.strip():
            raise ConfigError(f"corrupt gzip data ({bad}); expected a gzip-compressed PyTorch profiler (Kineto) "
                              "JSON trace", file=str(path))
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise ConfigError("the file is empty; expected a PyTorch profiler (Kineto) JSON trace", file=str(path))
    try:
        return json.loads(text), cut
    except json.JSONDecodeError:
        pass
    doc = _recover(text)
    if doc is None:
        raise ConfigError("not a JSON document; expected a PyTorch profiler (Kineto) JSON trace", file=str(path))
    return doc, True


def _gunzip(raw: bytes) -> tuple[bytes, bool, str | None]:
    """Decompress gzip data (every member); a cut or corrupt stream gives what precedes the damage,
    True, and for corrupt data what zlib found wrong."""
    out: list[bytes] = []
    data = raw
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out.append(d.decompress(data))
        except zlib.error as e:
            return b"".join(out), True, str(e).removeprefix("Error -3 while decompressing data: ")
        if not d.eof:
            return b"".join(out), True, None
        data = d.unused_data.lstrip(b"\x00")
    return b"".join(out), False, None


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


def _recover(text: str) -> dict[str, Any] | None:
    """Parse a cut JSON object key by key, and its ``traceEvents`` list event by event."""
    dec = json.JSONDecoder()
    i = _skip(text, 0)
    if i >= len(text) or text[i] != "{":
        return None
    out: dict[str, Any] = {}
    i += 1
    while True:
        i = _skip(text, i)
        if i >= len(text) or text[i] == "}":
            return out
        if text[i] == ",":
            i += 1
            continue
        try:
            key, i = dec.raw_decode(text, i)
            i = _skip(text, i)
            if i >= len(text) or text[i] != ":" or not isinstance(key, str):
                return out
            i = _skip(text, i + 1)
            if key == "traceEvents" and i < len(text) and text[i] == "[":
                events, i, whole = _recover_list(dec, text, i + 1)
                out[key] = events
                if not whole:
                    return out
                continue
            out[key], i = dec.raw_decode(text, i)
        except ValueError:
            return out


def _recover_list(dec: json.JSONDecoder, text: str, i: int) -> tuple[list[Any], int, bool]:
    items: list[Any] = []
    while True:
        i = _skip(text, i)
        if i >= len(text):
            return items, i, False
        if text[i] == "]":
            return items, i + 1, True
        if text[i] == ",":
            i += 1
            continue
        try:
            item, i = dec.raw_decode(text, i)
        except ValueError:
            return items, i, False
        items.append(item)


def is_execution_trace(doc: Any) -> bool:
    """Whether ``doc`` is a PyTorch Execution Trace (``nodes`` with ids and parents)."""
    return isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc


# ------------------------------------------------------------------------------- parsing


def load_rank_trace(path: str | Path) -> RankTrace:
    """Read and parse one rank's Kineto trace file."""
    doc, cut = read_document(path)
    return parse_kineto(doc, str(path), truncated=cut)


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _int(v: Any, default: int = -1) -> int:
    x = _num(v)
    return int(x) if x is not None else default


def parse_kineto(doc: Any, file: str, *, truncated: bool = False) -> RankTrace:
    """The :class:`RankTrace` of a parsed JSON document (see :func:`read_document`)."""
    if is_execution_trace(doc):
        raise ConfigError("this is a PyTorch Execution Trace, not a profiler (Kineto) trace; pass it beside "
                          "its Kineto trace (simgpu replay TRACE ET) or with --et", file=file)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list) or (events and not any(isinstance(e, dict) and "ph" in e for e in events[:200])):
        raise ConfigError("not a PyTorch profiler (Kineto) trace: no traceEvents list of trace events; expected a "
                          "trace written by torch.profiler", file=file)
    header: dict[str, Any] = doc if isinstance(doc, dict) else {}
    warn: Counter[str] = Counter()
    if truncated:
        warn["file is truncated; read up to the last whole event"] += 1
    calls: list[Call] = []
    gpu: list[GpuOp] = []
    spans: list[Span] = []
    steps: dict[int, Step] = {}
    syncs: dict[int, int] = {}
    flows_s: dict[int, tuple[Any, Any, float]] = {}
    flows_f: dict[tuple[Any, Any, float], int] = {}
    unlinked: list[tuple[int, tuple[Any, Any, float]]] = []
    unlinked_calls: list[tuple[int, tuple[Any, Any, float]]] = []
    base: float | None = None
    pids: Counter[int] = Counter()
    devices: Counter[int] = Counter()
    for e in events:
        if not isinstance(e, dict):
            warn["non-object entries in traceEvents ignored"] += 1
            continue
        ph = e.get("ph")
        cat = str(e.get("cat", "")).lower()
        if ph in ("s", "f") and cat in ("ac2g", "async_cpu_to_gpu"):
            ts = _num(e.get("ts"))
            fid = _int(e.get("id"))
            if ts is not None and fid >= 0:
                if base is None:
                    base = ts
                ts -= base
                if ph == "s":
                    flows_s[fid] = (e.get("pid"), e.get("tid"), ts)
                else:
                    flows_f[(e.get("pid"), e.get("tid"), ts)] = fid
            continue
        if ph != "X":
            continue
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if ts is None or dur is None or dur < 0:
            if cat in RUNTIME_CATS or cat in GPU_CATS or cat in SPAN_CATS:
                warn["events without a valid ts / dur dropped"] += 1
            continue
        if base is None and (cat in RUNTIME_CATS or cat in GPU_CATS or cat in SPAN_CATS):
            base = ts
        ts -= base if base is not None else 0.0
        raw_args = e.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        name = str(e.get("name", ""))
        if cat in RUNTIME_CATS:
            corr = _int(args.get("correlation"))
            if corr < 0:
                unlinked_calls.append((len(calls), (e.get("pid"), e.get("tid"), ts)))
            calls.append(Call(name, _int(e.get("tid"), 0), ts, dur, corr))
            if isinstance(e.get("pid"), int):
                pids[e["pid"]] += 1
        elif cat in GPU_CATS:
            stream = _int(args.get("stream"), _int(e.get("tid"), 0))
            if "stream" not in args:
                warn["GPU activities without a stream id (thread id used)"] += 1
            coll = {k: args[k] for k in COLL_ARGS if k in args} or None
            nb = _int(args.get("bytes"), 0)
            corr = _int(args.get("correlation"))
            if corr < 0:
                unlinked.append((len(gpu), (e.get("pid"), e.get("tid"), ts)))
            gpu.append(GpuOp(GPU_CATS[cat], name, stream, ts, dur, corr, nb, coll))
            devices[_int(args.get("device"), _int(e.get("pid"), 0))] += 1
        elif cat in SPAN_CATS:
            m = _STEP.match(name)
            if m:
                steps.setdefault(int(m.group(1)), Step(int(m.group(1)), ts, ts + dur))
                continue
            dims, types = args.get("Input Dims"), args.get("Input type")
            ids = tuple(_int(args[k]) for k in ("Record function id", "External id") if k in args)
            coll = {k: args[k] for k in COLL_ARGS if k in args} or None
            spans.append(Span(name, _int(e.get("tid"), 0), ts, ts + dur,
                              tuple(dims) if isinstance(dims, list) else None,
                              tuple(types) if isinstance(types, list) else None, ids, coll))
        elif cat == "cuda_sync":
            stream = _int(args.get("stream"))
            corr = _int(args.get("correlation"))
            if stream >= 0 and corr >= 0:
                syncs[corr] = stream
    _link_flows(gpu, calls, unlinked, unlinked_calls, flows_s, flows_f, warn)
    raw_info = header.get("distributedInfo")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    rank = _int(info.get("rank"))
    if rank < 0:
        m = _RANK_IN_NAME.search(Path(file).name)
        rank = int(m.group(1)) if m else 0
        warn["no rank in distributedInfo; rank taken from the file name or 0"] += 1
    world = _int(info.get("world_size"))
    raw_pgs = info.get("pg_config")
    pgs = [pg for pg in raw_pgs if isinstance(pg, dict)] if isinstance(raw_pgs, list) else []
    gpu_name = _gpu_name(header.get("deviceProperties"), devices.most_common(1)[0][0] if devices else 0)
    if not gpu and not calls:
        raise ConfigError("the trace holds no CUDA runtime calls and no GPU activities to replay; expected a trace "
                          "of a program that ran on a GPU", file=file)
    calls.sort(key=lambda c: (c.ts, c.end))
    gpu.sort(key=lambda g: (g.ts, g.end))
    spans.sort(key=lambda s: (s.tid, s.ts, -s.end))
    return RankTrace(file, rank, world if world > 0 else None, gpu_name, pids.most_common(1)[0][0] if pids else None,
                     pgs, calls, gpu, spans, [steps[k] for k in sorted(steps)], syncs, base or 0.0, truncated, warn)


def _link_flows(gpu: list[GpuOp], calls: list[Call], unlinked: list[tuple[int, tuple[Any, Any, float]]],
                unlinked_calls: list[tuple[int, tuple[Any, Any, float]]],
                flows_s: dict[int, tuple[Any, Any, float]], flows_f: dict[tuple[Any, Any, float], int],
                warn: Counter[str]) -> None:
    """Give correlation ids from ``ac2g`` flow events to calls and activities that lack them.

    A flow's id is the launching call's correlation id; its start sits on the call, its end on the
    GPU activity (same pid, tid and ts). What stays unlinked gets a unique negative id.
    """
    at_start = {key: fid for fid, key in flows_s.items()}
    for i, key in unlinked_calls:
        c = calls[i]
        calls[i] = Call(c.name, c.tid, c.ts, c.dur, at_start.get(key, -1))
    for i, key in unlinked:
        g = gpu[i]
        corr = flows_f.get(key, -2 - i)
        gpu[i] = GpuOp(g.kind, g.name, g.stream, g.ts, g.dur, corr, g.nbytes, g.coll)
    known = {c.corr for c in calls if c.corr >= 0}
    orphans = sum(1 for g in gpu if g.corr not in known)
    if orphans:
        warn["GPU activities without their launching runtime call (issued at their start)"] += orphans


def _gpu_name(props: Any, device: int) -> str | None:
    if not isinstance(props, list):
        return None
    named = [p for p in props if isinstance(p, dict) and isinstance(p.get("name"), str)]
    for p in named:
        if _int(p.get("id")) == device:
            return str(p["name"])
    return str(named[0]["name"]) if named else None

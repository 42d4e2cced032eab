"""Calibrating a platform's link parameters from the user's own nccl-tests measurements.

``python -m simgpu.comm.calibrate --platform P --nodes N results.log`` reads nccl-tests output
(the data rows: size, count, type, redop, root, time, algbw, busbw, ...), finds which class of link
bounds the measured collective (the network across nodes, else NVLink, else PCIe), fits that
class's achievable bandwidth fraction and one-way latency and the fixed cost of a collective (with,
for point-to-point traffic, NCCL's per-channel bound, and for all-reduce across nodes, how far trees
fall short at mid sizes) to the measured times (least absolute log error), prints the error before
and after, and writes the platform file with the fitted values (``--out``; the original is left
alone unless ``--out`` names it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..cli import ArgParser, Progress, check_input_file, check_out_file, entry, int_at_least, run_command
from ..collective_run import simulate_collective
from ..config.loader import load_platform, platform_overrides, platform_path
from ..config.platform import PlatformSpec
from ..config.yamlio import read_text, read_yaml
from ..errors import ConfigError
from ..platform.topology import Topology
from .__main__ import parse_op
from .collective import layout, request
from .planner import Planner

SEARCH_SIZES = 32
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def parse_nccl_tests(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(sizes in bytes, out-of-place times in us) of the data rows of nccl-tests output."""
    sizes, times = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = ROW.match(line)
        if m and float(m.group(6)) > 0:
            sizes.append(int(m.group(1)))
            times.append(float(m.group(6)))
    return np.array(sizes, dtype=np.int64), np.array(times)


#: A line that starts as a data row does (size, count, type): a row, whole or cut short.
ROW_START = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z]\w*")


def _signature(m: re.Match[str]) -> tuple[bool, bool]:
    return m.group(4) != "none", int(m.group(5)) >= 0


_OPS = {(True, False): ("all_reduce", "reduce_scatter", "send_recv"), (True, True): ("reduce",),
        (False, False): ("all_gather", "all_to_all"), (False, True): ("broadcast",)}


@dataclass(frozen=True)
class Measurements:
    """The rows of an nccl-tests log a calibration fits, and the lines it left out, with why."""

    sizes: np.ndarray
    times_us: np.ndarray
    ops: tuple[str, ...]
    dropped: tuple[str, ...]

    def note(self) -> str | None:
        """One line saying what was left out (None when nothing was)."""
        if not self.dropped:
            return None
        shown = "; ".join(self.dropped[:3]) + (f"; and {len(self.dropped) - 3} more" if len(self.dropped) > 3 else "")
        return f"note: left out {len(self.dropped)} row(s) of the log: {shown}"


def read_measurements(text: str, file: str) -> Measurements:
    """The data rows of nccl-tests output, refused in one line where they cannot be fitted: fewer than
    3 distinct sizes above 0, or rows of more than one kind of collective. Rows cut short (a log
    truncated mid-row: fewer columns than most rows have), of size 0 or of time 0 are left out and
    listed in ``dropped``."""
    from collections import Counter

    sizes, times, dropped = [], [], []
    first: tuple[int, tuple[bool, bool]] | None = None
    data = [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#") and ROW_START.match(line)]
    counts = Counter(len(line.split()) for _, line in data).most_common()
    whole = max((c for c, k in counts if k == counts[0][1]), default=0)  # the columns most rows have
    for n, line in data:
        m = ROW.match(line)
        columns = len(line.split())
        if m is None or columns < whole:
            dropped.append(f"line {n} cut short ({columns} of {max(whole, 13 if m is None else whole)} columns)")
            continue
        sig = _signature(m)
        if first is None:
            first = (n, sig)
        elif sig != first[1]:
            raise ConfigError(
                f"line {n} is a row of {' or '.join(_OPS[sig])} but line {first[0]} one of "
                f"{' or '.join(_OPS[first[1]])} (by their redop and root columns); expected the rows of one "
                "collective (one *_perf run per log)", file=file)
        size, time_us = int(m.group(1)), float(m.group(6))
        if size == 0 or time_us <= 0:
            dropped.append(f"line {n} of {'size 0' if size == 0 else 'time 0'}")
            continue
        sizes.append(size)
        times.append(time_us)
    distinct = len(set(sizes))
    if distinct < 3:
        left = f" ({len(dropped)} left out: {dropped[0]}{', ...' if len(dropped) > 1 else ''})" if dropped else ""
        raise ConfigError(f"{distinct} distinct size(s) above 0 in {len(sizes)} data row(s){left}; expected at least "
                          "3 nccl-tests data rows (size count type redop root time ...) of distinct sizes > 0",
                          file=file)
    return Measurements(np.array(sizes, dtype=np.int64), np.array(times), _OPS[first[1]] if first else (),
                        tuple(dropped))


def ops_of_rows(text: str) -> tuple[str, ...]:
    """The collectives whose nccl-tests rows look like the first data row of ``text``: with a reduction
    (``redop`` sum, max, ...) or without (``none``), and with a root (``root`` >= 0) or not."""
    for line in text.splitlines():
        m = ROW.match(line)
        if m and not line.lstrip().startswith("#"):
            reduces, rooted = m.group(4) != "none", int(m.group(5)) >= 0
            return {(True, False): ("all_reduce", "reduce_scatter", "send_recv"), (True, True): ("reduce",),
                    (False, False): ("all_gather", "all_to_all"), (False, True): ("broadcast",)}[(reduces, rooted)]
    return ()


@dataclass(frozen=True)
class Fit:
    """The fitted parameters (dotted platform keys -> values) and the errors before and after."""

    params: dict[str, Any]
    error_before: float
    error_after: float


@dataclass(frozen=True)
class Knob:
    """One platform figure the calibration may move: ``kind`` says how (a fraction or a rate moves
    by factors, a latency by microseconds down to 0)."""

    key: str
    kind: str  # "fraction", "rate" or "latency"


def bottleneck_keys(platform: PlatformSpec, nodes: int) -> tuple[str, str]:
    """The (efficiency, latency) keys of the link class that bounds a collective."""
    if nodes > 1:
        return "network.efficiency", "network.latency_us"
    if platform.node.nvlink is not None:
        return "node.nvlink.efficiency", "node.nvlink.latency_us"
    return "node.pcie.efficiency", "node.pcie.latency_us"


def knobs(platform: PlatformSpec, nodes: int, op: str) -> list[Knob]:
    """What a fit moves: the bounding link class's achievable fraction and latency, the fixed cost
    of a collective (``collectives.launch_us``, which sets the small-message plateau), for
    point-to-point traffic the most one channel moves (``collectives.channel_gbytes_per_s``), and
    for all-reduce across nodes how far trees fall short at mid sizes
    (``collectives.tree_efficiency_power``)."""
    eff, lat = bottleneck_keys(platform, nodes)
    out = [Knob(eff, "fraction"), Knob(lat, "latency"), Knob("collectives.launch_us", "latency")]
    if op in ("send_recv", "all_to_all") and platform.collectives.channel_gbytes_per_s is not None:
        out.append(Knob("collectives.channel_gbytes_per_s", "rate"))
    if op == "all_reduce" and nodes > 1:
        out.append(Knob("collectives.tree_efficiency_power", "rate"))
    return out


def _error(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.exp(np.mean(np.abs(np.log(pred / meas)))) - 1)


def fit(platform_ref: str, op: str, sizes: np.ndarray, times_us: np.ndarray, *, nodes: int = 1,
        gpus_per_node: int | None = None, overrides: Sequence[tuple[str, Any]] = ()) -> Fit:
    """Fit the :func:`knobs` of a platform (with ``overrides`` applied) to measured ``times_us``
    (:func:`fit_knobs`). An all-reduce across nodes is fitted under both tuners, NCCL's own model
    and the fastest in isolation (the choice a tuner plugin makes, approximately), and the one whose
    fit comes closer on the sizes given is kept (``collectives.tuner`` among the parameters where it
    differs from the platform's)."""
    first = fit_knobs(platform_ref, op, sizes, times_us, nodes=nodes, gpus_per_node=gpus_per_node,
                      overrides=overrides)
    if nodes < 2 or op != "all_reduce":
        return first
    base, _ = load_platform(platform_ref, list(overrides))
    other = "isolated" if base.collectives.tuner == "nccl" else "nccl"
    second = fit_knobs(platform_ref, op, sizes, times_us, nodes=nodes, gpus_per_node=gpus_per_node,
                       overrides=[*overrides, ("collectives.tuner", other)])
    if second.error_after < first.error_after - 1e-9:
        return Fit({"collectives.tuner": other, **second.params}, first.error_before, second.error_after)
    return first


def fit_knobs(platform_ref: str, op: str, sizes: np.ndarray, times_us: np.ndarray, *, nodes: int = 1,
              gpus_per_node: int | None = None, overrides: Sequence[tuple[str, Any]] = ()) -> Fit:
    """Fit the :func:`knobs` of a platform (with ``overrides`` applied) to measured ``times_us``.

    The loss is the mean absolute log error over up to SEARCH_SIZES sizes spread evenly in log
    size, each plan timed alone on the topology. A coarse grid over the link's fraction and
    latency starts a pattern search over every knob (fractions and rates by factors, latencies
    by microseconds), whose steps halve when no move helps. The result is checked by full
    simulation of every size; where it is not better than the platform as given, the platform's
    own figures are kept.
    """
    base, _ = load_platform(platform_ref, list(overrides))
    ks = knobs(base, nodes, op)
    start = np.array([_get(base, k.key) for k in ks])

    def values(x: np.ndarray) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for k, v in zip(ks, x, strict=True):
            v = float(v)
            if k.kind == "fraction":
                v = min(v, 1.0)
            out.append((k.key, round(max(v, 0.0), 4)))
        return out

    def predict(x: np.ndarray, exact: bool = False, subset: np.ndarray | None = None) -> np.ndarray:
        p, _ = load_platform(platform_ref, list(overrides) + values(x))
        topo = Topology(p, nodes, gpus_per_node)
        if exact:
            return np.array([simulate_collective(p, op, int(s), topology=topo) for s in sizes]) * 1e6  # type: ignore[arg-type]
        planner = Planner(topo, p.collectives)
        chosen = sizes if subset is None else sizes[subset]
        return np.array([planner.plan(request(op, int(s), topo)).isolated_time(topo) for s in chosen]) * 1e6

    pick = np.unique(np.linspace(0, len(sizes) - 1, min(len(sizes), SEARCH_SIZES)).round().astype(int))
    memo: dict[tuple[float, ...], float] = {}

    def loss(x: np.ndarray) -> float:
        key = tuple(np.round(x, 6))
        if key not in memo:
            memo[key] = float(np.mean(np.abs(np.log(predict(x, subset=pick) / times_us[pick]))))
        return memo[key]

    before = _error(predict(start, exact=True), times_us)
    # a coarse grid over the link's fraction (geometric) and latency (linear)
    grid = [start]
    for e in np.geomspace(0.25, 1.0, 7):
        for la in np.linspace(0.0, max(4 * start[1], 40.0), 7):
            x = start.copy()
            x[0], x[1] = e, la
            grid.append(x)
    x = min(grid, key=loss)
    # then a pattern search over every knob: fractions and rates by factors, latencies by us
    factor = np.array([1.0 if k.kind == "latency" else 1.25 for k in ks])
    step = np.array([max(start[i], 10.0) / 2 if k.kind == "latency" else 0.0 for i, k in enumerate(ks)])
    for _ in range(8):
        moved = True
        while moved:
            moved = False
            for i, k in enumerate(ks):
                for sign in (1, -1):
                    y = x.copy()
                    if k.kind == "latency":
                        y[i] = max(0.0, y[i] + sign * step[i])
                    else:
                        y[i] = y[i] * factor[i] ** sign
                        if k.kind == "fraction":
                            y[i] = min(y[i], 1.0)
                    if loss(y) < loss(x) - 1e-9:
                        x, moved = y, True
        step /= 2
        factor = np.sqrt(factor)
    after = _error(predict(x, exact=True), times_us)
    if after > before:  # the search's shortcut misled it: keep what the platform had
        x, after = start, before
    return Fit(dict(values(x)), before, after)


def _get(spec: PlatformSpec, dotted: str) -> float:
    cur: Any = spec
    for part in dotted.split("."):
        cur = getattr(cur, part)
    return float(cur)


def write_platform(platform_ref: str, params: dict[str, Any], out: Path) -> None:
    """The platform's YAML with ``params`` set, written to ``out``."""
    data, _ = read_yaml(platform_path(platform_ref), "platform")
    for dotted, value in params.items():
        cur = data
        *head, last = dotted.split(".")
        for h in head:
            cur = cur.setdefault(h, {})
        cur[last] = value
    out.write_text("# calibrated by python -m simgpu.comm.calibrate from nccl-tests measurements\n"
                   + yaml.safe_dump(data, sort_keys=False))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("measurements", help="nccl-tests output (text)")
    ap.add_argument("--platform", required=True)
    ap.add_argument("--op", default="all_reduce", help="the collective measured; nccl-tests' names (alltoall, "
                    "sendrecv, all_reduce_perf, ...) are accepted too")
    ap.add_argument("--nodes", type=int_at_least(1), default=1)
    ap.add_argument("--gpus-per-node", type=int_at_least(1))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="set a platform key before fitting (and in the written file), e.g. network.nic_gbps=200")
    ap.add_argument("--out", type=Path, help="write the calibrated platform here")
    args = ap.parse_args(argv)
    args.op = parse_op(args.op)
    if args.out:
        check_out_file(args.out, "--out")
    path = check_input_file(args.measurements, "measurements")
    text = read_text(path, "measurements")
    over = platform_overrides(args.overrides)
    layout(load_platform(args.platform, over)[0], args.nodes, args.gpus_per_node)
    got = read_measurements(text, str(path))
    sizes, times, ops = got.sizes, got.times_us, got.ops
    if ops and args.op not in ops:
        raise ConfigError(f"--op {args.op} does not match the rows, which are of {' or '.join(ops)} (by their "
                          f"redop and root columns); expected --op {ops[0]}", file=str(path), key="--op")
    with Progress() as progress:
        progress.set(f"fitting {args.platform} to {len(sizes)} sizes of {args.op}")
        result = fit(args.platform, args.op, sizes, times, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                     overrides=over)
    if args.out:
        write_platform(args.platform, {**dict(over), **result.params}, args.out)
    print(f"{len(sizes)} sizes, {args.op} on {args.platform} ({args.nodes} node(s))")
    if got.note():
        print(got.note())
    for k, v in result.params.items():
        print(f"  {k} = {v}")
    print(f"geomean error before {result.error_before:.1%}, after {result.error_after:.1%}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    entry(main)

"""Tests of the report stage on small SimResults built by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.report.chrome_trace import chrome_trace
from simgpu.report.gantt import category_color, merge_close_intervals
from simgpu.report.outputs import records_table, summary_json, write_outputs
from simgpu.report.summary import (
    grouped_union_measure,
    rank_breakdown,
    summarize,
    union_measure,
)
from simgpu.report.table import format_summary
from simgpu.result import LINK_RECORD_COLUMNS, LINK_STAT_COLUMNS, RECORD_COLUMNS, SimResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rec(
    rank: int,
    stream: str,
    start_ms: float,
    end_ms: float,
    *,
    category: str = "gemm",
    kind: str | None = None,
    nbytes: int = 0,
    name: str = "op",
) -> dict[str, Any]:
    """One record row; times given in ms for readability."""
    if kind is None:
        kind = {"comm": "collective", "cpu": "launch", "copy": "memcpy"}.get(stream, "kernel")
    return {
        "rank": rank,
        "stream": stream,
        "name": name,
        "category": category,
        "phase": "fwd",
        "kind": kind,
        "start_s": start_ms / 1e3,
        "end_s": end_ms / 1e3,
        "nbytes": nbytes,
        "model": "network" if stream == "comm" else "analytical",
    }


def make_result(
    rows: list[dict[str, Any]],
    iteration_ms: float,
    *,
    gpus: int | None = None,
    with_links: bool = False,
    **meta: Any,
) -> SimResult:
    records = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    n = gpus if gpus is not None else (int(records["rank"].max()) + 1 if len(records) else 1)
    link_stats = pd.DataFrame(
        [
            ("nvlink0->1", "nvlink", 450.0, 4e9, 0.008),
            ("nic0->sw", "nic", 50.0, 1e9, 0.02),
            ("pcie0", "pcie", 32.0, 0.0, 0.0),
        ],
        columns=list(LINK_STAT_COLUMNS),
    )
    link_records = None
    if with_links:
        link_records = pd.DataFrame(
            [
                ("nvlink0->1", "nvlink", 0.001, 0.009, "dp.ar"),
                ("nic0->sw", "nic", 0.0, 0.02, "dp.ar"),
                ("nic0->sw", "nic", 0.005, 0.012, "pp.send"),  # beside dp.ar on the link: one stretch
                ("nic0->sw", "nic", 0.021, 0.022, "dp.ar"),
            ],
            columns=list(LINK_RECORD_COLUMNS),
        )
    base_meta: dict[str, Any] = {
        "workload": "toy",
        "platform": "testbox",
        "nodes": 1,
        "gpus": n,
        "samples": 64,
        "tokens": 64 * 128,
        "model_flops": 1e12,
        "peak_flops_per_gpu": 1e15,
        "memory_gib": [{"weights": 1.5, "activations": 2.0, "total": 3.5}] * n,
        "gpu_memory_gib": 80.0,
        "kernel_model_share": {"analytical": 0.3, "lightgbm": 0.9},
        "seed": 7,
    }
    base_meta.update(meta)
    return SimResult(
        records=records,
        link_stats=link_stats,
        iteration_time_s=iteration_ms / 1e3,
        events=1234,
        meta=base_meta,
        link_records=link_records,
    )


# --------------------------------------------------------------------------- interval unions


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0.0),
        ([(0, 10)], 10.0),
        ([(0, 10), (5, 15)], 15.0),  # overlap
        ([(0, 10), (2, 3), (4, 8)], 10.0),  # nesting
        ([(0, 5), (5, 10)], 10.0),  # touching
        ([(0, 2), (4, 6)], 4.0),  # disjoint
        ([(5, 15), (0, 10), (20, 21), (14, 16)], 17.0),  # unsorted chain
        ([(3, 3), (4, 2)], 0.0),  # empty and reversed
        ([(0, 10), (0, 10)], 10.0),  # duplicates
    ],
)
def test_union_measure_hand_cases(intervals: list[tuple[float, float]], expected: float) -> None:
    starts = [a for a, _ in intervals]
    ends = [b for _, b in intervals]
    assert union_measure(starts, ends) == pytest.approx(expected)


def test_grouped_union_matches_per_group() -> None:
    groups = np.array([1, 0, 1, 0, 2, 1])
    starts = np.array([0.0, 0.0, 5.0, 20.0, 1.0, 30.0])
    ends = np.array([10.0, 10.0, 15.0, 25.0, 2.0, 31.0])
    got = grouped_union_measure(groups, starts, ends, 4)
    assert got.tolist() == pytest.approx([15.0, 16.0, 1.0, 0.0])
    # a group's frontier must not leak into the next group
    got = grouped_union_measure(np.array([0, 1]), np.array([0.0, 1.0]), np.array([100.0, 2.0]), 2)
    assert got.tolist() == pytest.approx([100.0, 1.0])


def test_grouped_union_rejects_bad_codes() -> None:
    with pytest.raises(ValueError):
        grouped_union_measure(np.array([3]), np.array([0.0]), np.array([1.0]), 2)


interval_lists = st.lists(
    st.tuples(st.floats(0, 1000, allow_nan=False), st.floats(0, 100, allow_nan=False)).map(
        lambda t: (t[0], t[0] + t[1])
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(interval_lists, st.randoms(use_true_random=False))
def test_union_measure_properties(intervals: list[tuple[float, float]], rnd: random.Random) -> None:
    starts = np.array([a for a, _ in intervals])
    ends = np.array([b for _, b in intervals])
    durations = ends - starts
    m = union_measure(starts, ends)
    assert m <= durations.sum() + 1e-9 * max(1.0, durations.sum())
    assert m >= durations.max() - 1e-9
    perm = list(range(len(intervals)))
    rnd.shuffle(perm)
    assert union_measure(starts[perm], ends[perm]) == pytest.approx(m, rel=1e-12, abs=1e-9)
    # the grouped version agrees when everything is one group
    grouped = grouped_union_measure(np.zeros(len(perm), dtype=np.int64), starts[perm], ends[perm], 1)
    assert grouped[0] == pytest.approx(m, rel=1e-12, abs=1e-9)


# --------------------------------------------------------------------------- summary


def test_exposed_communication_hand_case() -> None:
    result = make_result(
        [
            rec(0, "compute", 0, 10),
            rec(0, "comm", 5, 15, category="all_reduce", nbytes=1 << 20),
            rec(0, "cpu", 0, 1),
        ],
        iteration_ms=20,
    )
    bd = rank_breakdown(result).loc[0]
    assert bd["compute_s"] == pytest.approx(0.010)
    assert bd["communication_s"] == pytest.approx(0.010)
    assert bd["exposed_communication_s"] == pytest.approx(0.005)
    assert bd["idle_s"] == pytest.approx(0.020 - 0.015)
    assert bd["cpu_busy_s"] == pytest.approx(0.001)

    s = summarize(result)
    expected = {"compute": 10.0, "communication": 10.0, "exposed_communication": 5.0, "idle": 5.0}
    assert s["breakdown_ms"] == expected
    assert s["per_rank"][0]["exposed_communication_ms"] == pytest.approx(5.0)
    assert s["iteration_time_ms"] == pytest.approx(20.0)


def test_summary_fields() -> None:
    result = make_result(
        [
            rec(0, "compute", 0, 4, category="gemm"),
            rec(0, "compute", 4, 6, category="softmax"),
            rec(0, "copy", 2, 8, category="memcpy"),  # overlaps compute: union, not sum
            rec(1, "compute", 0, 6, category="gemm"),
            rec(1, "comm", 6, 9, category="all_reduce"),
        ],
        iteration_ms=10,
    )
    s = summarize(result)
    assert list(s) == [
        "workload",
        "platform",
        "nodes",
        "gpus",
        "iteration_time_ms",
        "throughput",
        "mfu",
        "breakdown_ms",
        "exposed_communication_by_kind_ms",
        "per_rank",
        "categories_ms",
        "busiest_links",
        "memory_gib",
        "kernel_models",
        "seed",
        "events",
    ]
    assert s["throughput"]["samples_per_s"] == pytest.approx(6400.0)
    assert s["throughput"]["tokens_per_s"] == pytest.approx(6400.0 * 128)
    assert s["mfu"] == pytest.approx(1e12 / (0.01 * 2 * 1e15))
    assert s["per_rank"][0]["compute_ms"] == pytest.approx(8.0)
    assert s["per_rank"][1]["exposed_communication_ms"] == pytest.approx(3.0)
    assert s["per_rank"][1]["idle_ms"] == pytest.approx(1.0)
    assert s["exposed_communication_by_kind_ms"] == {"all_reduce": pytest.approx(1.5)}  # mean of 0 and 3
    # gemm: rank 0 4 ms, rank 1 6 ms -> mean 5; memcpy 6/2 = 3; all_reduce 3/2; softmax 2/2
    expected = [("gemm", 5.0), ("memcpy", 3.0), ("all_reduce", 1.5), ("softmax", 1.0)]
    assert list(s["categories_ms"].items()) == expected
    top = s["busiest_links"][0]
    assert top["link"] == "nic0->sw"  # 1 GB on 50 GB/s in 10 ms beats 4 GB on 450 GB/s
    assert top["utilisation"] == pytest.approx(1e9 / (50e9 * 0.01))
    assert top["gbytes"] == pytest.approx(1.0)
    assert top["busy_ms"] == pytest.approx(20.0)
    assert s["memory_gib"]["total"] == pytest.approx(3.5)
    assert s["memory_gib"]["capacity"] == pytest.approx(80.0)
    assert sum(s["kernel_models"].values()) == pytest.approx(1.0)
    assert list(s["kernel_models"]) == ["lightgbm", "analytical"]
    assert s["seed"] == 7 and s["events"] == 1234


def test_summary_unknowns_are_null() -> None:
    result = make_result([rec(0, "compute", 0, 1)], iteration_ms=2, peak_flops_per_gpu=None, tokens=0)
    s = summarize(result)
    assert s["mfu"] is None
    assert "tokens_per_s" not in s["throughput"]
    json.loads(summary_json(s))  # no NaN sneaks in


def test_summary_json_is_byte_identical() -> None:
    rows = [rec(r, "compute", 0.1 * r, 3.3333333 + r) for r in range(4)]
    rows += [rec(r, "comm", 2.0, 7.123456789, category="all_gather") for r in range(4)]
    a = summary_json(summarize(make_result(rows, iteration_ms=9.87654321)))
    b = summary_json(summarize(make_result(list(reversed(rows)), iteration_ms=9.87654321)))
    assert a == b
    assert a.encode() == summary_json(summarize(make_result(rows, iteration_ms=9.87654321))).encode()


def test_rank_without_records_is_idle() -> None:
    s = summarize(make_result([rec(0, "compute", 0, 5)], iteration_ms=10, gpus=2))
    assert [r["rank"] for r in s["per_rank"]] == [0, 1]
    assert s["per_rank"][1]["idle_ms"] == pytest.approx(10.0)


def test_format_summary_small_and_many_ranks() -> None:
    few = format_summary(summarize(make_result([rec(0, "compute", 0, 5)], iteration_ms=10)))
    assert "toy" in few and "iteration" in few and "exposed comm" in few and "nic0->sw" in few
    many_rows = [rec(r, "compute", 0, 1 + r % 3) for r in range(40)]
    many = format_summary(summarize(make_result(many_rows, iteration_ms=10)))
    assert "mean" in many and "(40 ranks)" in many
    assert "\n  39 " not in many


# --------------------------------------------------------------------------- files


def _rows_two_ranks() -> list[dict[str, Any]]:
    return [
        rec(0, "cpu", 0, 0.5, category="launch"),
        rec(0, "compute", 0.5, 4, category="gemm"),
        rec(0, "compute", 4, 5, category="mystery_op"),
        rec(0, "comm", 3, 8, category="all_reduce", nbytes=1 << 24),
        rec(1, "compute", 0.5, 4.5, category="attention"),
        rec(1, "copy", 1, 2, category="memcpy", nbytes=1 << 20),
        rec(1, "comm", 3, 8, category="all_reduce", nbytes=1 << 24),
    ]


@pytest.mark.parametrize("records_format", ["csv", "parquet"])
def test_write_outputs(tmp_path: Path, records_format: str) -> None:
    result = make_result(_rows_two_ranks(), iteration_ms=9, with_links=True)
    out = tmp_path / "nested" / "run"
    paths = write_outputs(result, out, links=True, records_format=records_format)  # type: ignore[arg-type]
    assert set(paths) == {"summary", "timeline", "trace", "records"}
    for p in paths.values():
        assert p.parent == out and p.is_file() and p.stat().st_size > 0
    assert paths["records"].name == f"records.{records_format}"

    png = paths["timeline"].read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1000

    summary = json.loads(paths["summary"].read_text())
    assert summary["workload"] == "toy"

    trace = json.loads(paths["trace"].read_text())
    assert trace["displayTimeUnit"] == "ms"
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(result.records) + 3  # plus three link busy intervals
    assert all(e["dur"] >= 0 for e in xs)

    read = pd.read_parquet if records_format == "parquet" else pd.read_csv
    table = read(paths["records"])
    assert {"start_us", "end_us", "dur_us"} <= set(table.columns)
    assert "start_s" not in table.columns
    assert (table["dur_us"] >= 0).all()
    keys = list(zip(table["rank"], table["stream"], table["start_us"], strict=True))
    assert keys[0] == (0, "cpu", 0.0)
    assert [k[0] for k in keys] == sorted(k[0] for k in keys)


def test_write_outputs_is_deterministic(tmp_path: Path) -> None:
    result = make_result(_rows_two_ranks(), iteration_ms=9)
    a = write_outputs(result, tmp_path / "a")
    b = write_outputs(result, tmp_path / "b")
    for key in ("summary", "trace", "records"):
        assert a[key].read_bytes() == b[key].read_bytes()


def test_write_outputs_rejects_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="records_format"):
        write_outputs(make_result(_rows_two_ranks(), iteration_ms=9), tmp_path, records_format="xlsx")  # type: ignore[arg-type]


def test_chrome_trace_structure() -> None:
    result = make_result(_rows_two_ranks(), iteration_ms=9, with_links=True)
    trace = chrome_trace(result)
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1"), (2, "links")}
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {(0, 0, "cpu"), (0, 1, "compute"), (0, 2, "comm"), (1, 3, "copy")} <= threads
    gemm = next(e for e in events if e["ph"] == "X" and e.get("cat") == "gemm")
    assert gemm["ts"] == pytest.approx(500.0) and gemm["dur"] == pytest.approx(3500.0)
    assert gemm["args"] == {"phase": "fwd", "kind": "kernel", "nbytes": 0, "model": "analytical"}
    # a link's records merged where they overlap, one event per busy stretch, with its owners
    nic = [(e["ts"], e["dur"], e["args"]) for e in events if e["ph"] == "X" and e["name"] == "nic0->sw"]
    assert nic == [(0.0, pytest.approx(20000.0), {"owners": ["dp.ar", "pp.send"]}),
                   (pytest.approx(21000.0), pytest.approx(1000.0), {"owners": ["dp.ar"]})]
    json.dumps(trace, allow_nan=False)


def test_records_table_sorted_by_stream_order() -> None:
    table = records_table(make_result(_rows_two_ranks(), iteration_ms=9))
    assert list(table.loc[table["rank"] == 0, "stream"]) == ["cpu", "compute", "compute", "comm"]
    assert list(table.loc[table["rank"] == 1, "stream"]) == ["compute", "comm", "copy"]


def test_timeline_many_ranks_and_empty(tmp_path: Path) -> None:
    from simgpu.report.gantt import build_timeline_figure, plot_timeline

    rows = [
        rec(r, s, 0.1 * r, 1 + 0.1 * r, category=c)
        for r in range(40)
        for s, c in (("compute", "gemm"), ("comm", "all_to_all"))
    ]
    fig = build_timeline_figure(make_result(rows, iteration_ms=6), show_cpu=True)
    ax = fig.axes[0]
    assert "24 of 40 ranks shown: 0, 2, 3, 5, ..., 39" in ax.get_title()
    assert len(ax.get_yticks()) == 48  # 24 ranks x compute, comm
    assert ax.get_yticklabels()[0].get_text() == "r0 compute"
    assert ax.get_yticklabels()[-1].get_text() == "r39 comm"

    empty = make_result([], iteration_ms=1, gpus=1)
    plot_timeline(empty, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG_MAGIC)
    summarize(empty)
    chrome_trace(empty)


def test_category_colors_are_stable_and_distinct() -> None:
    known = [
        "gemm",
        "bmm",
        "attention",
        "embedding",
        "elementwise",
        "norm",
        "softmax",
        "optimizer",
        "memcpy",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "reduce",
        "send_recv",
    ]
    colors = [category_color(c) for c in known]
    assert len(set(colors)) == len(colors)
    assert category_color("mystery_op") == category_color("mystery_op")
    assert category_color("embedding_fwd") == category_color("embedding")


def test_merge_close_intervals_per_row() -> None:
    rows = np.array([0, 0, 0, 1, 1, 0])
    starts = np.array([0.0, 1.05, 5.0, 0.0, 3.0, 0.5])
    ends = np.array([1.0, 2.0, 6.0, 2.5, 4.0, 0.7])
    r, s, e = merge_close_intervals(rows, starts, ends, gap=0.1)
    assert r.tolist() == [0, 0, 1, 1]
    assert s.tolist() == [0.0, 5.0, 0.0, 3.0]
    assert e.tolist() == [2.0, 6.0, 2.5, 4.0]
    # row 0 ending late must not swallow row 1's separate bars
    r, s, e = merge_close_intervals(
        np.array([0, 1, 1]), np.array([0.0, 0.0, 5.0]), np.array([9.0, 1.0, 6.0]), 0.1
    )
    assert list(zip(r.tolist(), s.tolist(), e.tolist(), strict=True)) == [
        (0, 0.0, 9.0),
        (1, 0.0, 1.0),
        (1, 5.0, 6.0),
    ]


@pytest.mark.parametrize("ranks", [1, 8, 64, 1024])
def test_timeline_stays_legible_at_every_size(ranks: int) -> None:
    from simgpu.report.gantt import DPI, LABEL_PT, build_timeline_figure

    rows = [rec(r, s, 0.001 * (r % 7), 1 + 0.001 * (r % 5), category=c)
            for r in range(ranks) for s, c in (("compute", "gemm"), ("comm", "all_reduce"), ("copy", "memcpy"))]
    fig = build_timeline_figure(make_result(rows, iteration_ms=3, gpus=ranks))
    width, height = fig.get_size_inches() * DPI
    assert width <= 1600 and height <= 2400
    labels = fig.axes[0].get_yticklabels()
    assert 1 <= len(labels) <= 48 and all(t.get_fontsize() >= LABEL_PT for t in labels)
    assert labels[0].get_text() == "r0 compute" and labels[-1].get_text() == f"r{ranks - 1} copy"

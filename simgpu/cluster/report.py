"""The cluster's figures: the summary written to ``summary.json`` and the printed tables (the
neighbour noise per job, the busiest links between switches with each job's bytes and the share of
the run each job was on them)."""

from __future__ import annotations

from typing import Any

from .run import ClusterResult, link_table, shared_links

#: what the per-job bytes on a link are
BYTES_NOTE = ("bytes per job: each job's run alone on the same nodes (its collectives are planned from the "
              "topology and their sizes, not from the load, so they cross the same links beside neighbours)")


#: what the per-job busy seconds on a link are
BUSY_NOTE = ("busy_s per job: the seconds of the shared run during which the link carried at least one of the "
             "job's transfers (two jobs' overlap where they shared it at once); shared_s: the seconds more than "
             "one job did")


def summarize(res: ClusterResult, top: int = 8) -> dict[str, Any]:
    """The figures of a cluster run, as plain values."""
    c = res.cluster
    jobs = []
    for m in res.meta["jobs"]:
        name = m["name"]
        alone = res.alone_s.get(name)
        jobs.append(m | {"together_s": res.together_s[name], "alone_s": alone,
                         "slowdown": res.slowdown(name) if alone is not None else None})
    links = link_table(res, top, fabric=res.fabric)
    return {
        "name": c.spec.name, "cluster_file": c.file, "platform": c.platform.name, "platform_file": c.platform_file,
        "platform_set": dict(c.spec.platform_set), "nodes": c.spec.nodes, "gpus_per_node": c.gpus_per_node,
        "placement": c.spec.placement, "jobs": jobs,
        "links": links.to_dict(orient="records"), "links_shared": shared_links(res, res.fabric),
        "links_note": "the busiest links between switches (a job holds whole nodes, so only these can be "
                      "shared); " + BYTES_NOTE + "; " + BUSY_NOTE,
        "events": res.together.events,
    }


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def _nodes(ids: list[int]) -> str:
    return ",".join(map(str, ids)) if len(ids) <= 6 else f"{ids[0]}..{ids[-1]} ({len(ids)})"


def table(summary: dict[str, Any]) -> str:
    """The summary as text: a header line, the neighbour noise table and the busiest links."""
    s = summary
    head = (f"cluster {s['name']}: {s['nodes']} nodes of {s['platform']} ({s['nodes'] * s['gpus_per_node']} GPUs), "
            f"{len(s['jobs'])} jobs, placement {s['placement']}")
    rows = [[j["name"], j["workload"], _nodes(j["nodes"]), str(j["gpus"]), _ms(j["alone_s"]), _ms(j["together_s"]),
             "-" if j["slowdown"] is None else f"{j['slowdown']:.3f}x"] for j in s["jobs"]]
    out = [head, "", "neighbour noise (one iteration each, the jobs starting together)",
           _grid(["job", "workload", "nodes", "GPUs", "alone ms", "together ms", "slowdown"], rows, 3)]
    if s["links"]:
        names = [j["name"] for j in s["jobs"]]
        span = max((j["together_s"] for j in s["jobs"]), default=0.0) or 1.0
        timed = "shared_s" in s["links"][0]
        lrows = [[lk["link"], lk["link_kind"], f"{lk['capacity_gbytes_per_s']:.0f}", f"{lk['busy_share'] * 100:.0f}%",
                  f"{lk['nbytes'] / 1e9:.3f}"] + [f"{lk.get(f'bytes:{n}', 0.0) / 1e9:.3f}" for n in names]
                 + ([f"{lk[f'busy_s:{n}'] / span * 100:.0f}%" for n in names] + [f"{lk['shared_s'] / span * 100:.0f}%"]
                    if timed else [])
                 for lk in s["links"]]
        cols = (["link", "kind", "GB/s", "busy", "GB"] + [f"{n} GB" for n in names]
                + ([f"{n} busy" for n in names] + ["shared"] if timed else []))
        out += ["", f"busiest links between switches ({s['links_shared']} carry more than one job's bytes"
                + ("; busy: share of the run a job was on the link, shared: more than one job at once)" if timed
                   else ")"),
                _grid(cols, lrows, 2)]
    else:
        out += ["", "no bytes crossed a link between switches (every job inside its nodes)"]
    return "\n".join(out)


def _grid(header: list[str], rows: list[list[str]], left: int) -> str:
    """Columns padded to their widest cell, the first ``left`` to the left, the others to the right."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    return "\n".join("  ".join(v.ljust(w) if i < left else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths,
                                                                                                    strict=True)))
                     for r in [header, *rows])

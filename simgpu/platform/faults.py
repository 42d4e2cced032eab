"""The platform's ``faults:`` on the links of a topology: which links lose bandwidth, which are down,
and the NIC each GPU of a node with a NIC down sends through.

:func:`resolve` reads the entries against the links the topology built (it knows the node count,
which the platform file does not) and raises a :class:`~simgpu.errors.ConfigError` keyed
``faults.<i>`` for a part the job's nodes do not have. The topology applies what it returns: a
factor multiplies a link's capacity; a down link is left out of every route (:meth:`Topology.route`
tries the other paths the platform offers), and a GPU whose NIC is down uses another of its node
(one on its own PCIe switch first), as NCCL's rings and trees of that node run over the NICs that
remain.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.faults import FaultSpec
from ..config.platform import PlatformSpec
from ..errors import ConfigError
from .links import Link


class NoPath(ConfigError):
    """Two GPUs with no path left between them: the faults cut a group off."""


@dataclass
class Faults:
    """What the faults do to a topology's links (empty: nothing)."""

    #: each link's capacity multiplier, where it is not 1
    scale: dict[int, float] = field(default_factory=dict)
    #: links that are down
    dead: set[int] = field(default_factory=set)
    #: per link, the entries (indices into ``faults``) that touch it
    blame: dict[int, list[int]] = field(default_factory=dict)
    #: per node with a NIC (port) down, the port each local GPU uses instead of its own
    nic_of: dict[int, list[int]] = field(default_factory=dict)
    #: per node, the ports down, where some are
    ports_down: dict[int, set[int]] = field(default_factory=dict)
    #: one line per entry, e.g. "nic 1 of node 3 down"
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.scale or self.dead)

    def culprit(self, links: Sequence[int]) -> int:
        """The entry to name for ``links`` being unusable: the last that touched one of them."""
        found = [i for lk in links for i in self.blame.get(lk, [])]
        return max(found) if found else 0


def _touching(name: str, links: list[Link]) -> list[int]:
    """Ids of the links to or from the switch ``name``."""
    return [lk.id for lk in links if name in lk.name.split("->")]


def _part_links(i: int, f: FaultSpec, p: PlatformSpec, nodes: int, gpn: int, ids: dict[str, int],
                links: list[Link], leaf_of: Callable[[int, int], str]) -> list[tuple[int, float]]:
    """(link id, share of the link the entry takes: 1, or on a multi-rail port one NIC's share)."""
    key = f"faults.{i}"

    def node_ok(n: int) -> None:
        if n >= nodes:
            raise ConfigError(f"node {n} is not among the job's {nodes} node{'s' * (nodes > 1)}; "
                              f"expected a node 0..{nodes - 1}", key=key)

    if f.nic is not None:
        net = p.network
        node_ok(f.nic.node)
        if f.nic.index >= net.nics_per_node:
            raise ConfigError(f"nic {f.nic.index} does not exist; expected a NIC 0..{net.nics_per_node - 1} "
                              f"(network.nics_per_node is {net.nics_per_node})", key=key)
        if nodes == 1:
            return []  # a single node sends nothing through its NICs
        n, port = f.nic.node, f.nic.index // net.nics_per_gpu
        leaf = leaf_of(n, port)
        share = 1.0 / net.nics_per_gpu
        return [(ids[f"n{n}.nic{port}->{leaf}"], share), (ids[f"{leaf}->n{n}.nic{port}"], share)]
    if f.nvlink is not None:
        nv, ref = p.node.nvlink, f.nvlink
        node_ok(ref.node)
        if nv is None:
            raise ConfigError("this platform has no NVLink (node.nvlink is null); expected a nic, switch or link",
                              key=key)
        n = ref.node
        gpus = [ref.gpu] if ref.gpu is not None else list(ref.gpus or ())
        for g in gpus:
            if g >= gpn:
                raise ConfigError(f"gpu {g} does not exist; expected a GPU 0..{gpn - 1} of the job's {gpn} a node",
                                  key=key)
        if ref.gpu is not None:
            g = ref.gpu
            if nv.kind == "nvswitch":
                return [(ids[f"n{n}.gpu{g}->n{n}.nvsw"], 1.0), (ids[f"n{n}.nvsw->n{n}.gpu{g}"], 1.0)]
            return [(lid, 1.0) for name, lid in ids.items()
                    if any(name == f"n{n}.gpu{g}->n{n}.gpu{h}" or name == f"n{n}.gpu{h}->n{n}.gpu{g}"
                           for h in range(gpn))]
        a, b = gpus
        if nv.kind == "nvswitch":
            raise ConfigError("an NVSwitch node has a port per GPU, not links between pairs; expected "
                              f"nvlink: {{node: {n}, gpu: {a}}}", key=key)
        names = (f"n{n}.gpu{a}->n{n}.gpu{b}", f"n{n}.gpu{b}->n{n}.gpu{a}")
        if names[0] not in ids:
            raise ConfigError(f"GPUs {a} and {b} have no NVLink between them; expected a pair node.nvlink.links "
                              "wires", key=key)
        return [(ids[x], 1.0) for x in names]
    if f.switch is not None:
        found = _touching(f.switch, links)
        if not found:
            switches = sorted({end for lk in links if lk.kind in ("nic", "spine", "local", "global")
                               for end in lk.name.split("->") if not end.startswith("n")})
            raise ConfigError(f"no switch {f.switch} on this job's topology; expected one of: "
                              f"{', '.join(switches) or 'none (one node)'}", key=key)
        return [(lid, 1.0) for lid in found]
    assert f.link is not None
    if f.link not in ids:
        close = difflib.get_close_matches(f.link, list(ids), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"no link {f.link} on this job's topology; {hint}expected a link name as simgpu run --links "
                          "writes it", key=key)
    return [(ids[f.link], 1.0)]


def resolve(p: PlatformSpec, nodes: int, gpn: int, links: list[Link], ids: dict[str, int],
            leaf_of: Callable[[int, int], str], nic_of: Sequence[int], gpu_switch: Sequence[int],
            nic_switch: Sequence[int]) -> Faults:
    """The platform's faults on a topology of ``nodes`` nodes of ``gpn`` GPUs (``links`` and ``ids``
    its links; ``nic_of``, ``gpu_switch``, ``nic_switch`` per local GPU and port, as without faults)."""
    out = Faults()
    if not p.faults:
        return out
    # a multi-rail port keeps the share of its NICs that remain: each entry takes its NIC's share
    lost: dict[int, float] = {}
    for i, f in enumerate(p.faults):
        touched = _part_links(i, f, p, nodes, gpn, ids, links, leaf_of)
        out.notes.append(f"{f.part()} {f.effect()}")
        for lid, share in touched:
            out.blame.setdefault(lid, []).append(i)
            take = share * (1.0 if f.down else 1.0 - (f.factor or 1.0))
            if share == 1.0 and f.down:
                out.dead.add(lid)
            elif share == 1.0:
                out.scale[lid] = out.scale.get(lid, 1.0) * (f.factor or 1.0)
            else:
                lost[lid] = lost.get(lid, 0.0) + take
    for lid, gone in lost.items():
        if gone >= 1.0 - 1e-12:
            out.dead.add(lid)
        else:
            out.scale[lid] = out.scale.get(lid, 1.0) * (1.0 - gone)
    for lid in out.dead:
        out.scale.pop(lid, None)
    if nodes > 1:
        ports = len(nic_switch)
        for n in range(nodes):
            down = {k for k in range(ports)
                    if ids[f"n{n}.nic{k}->{leaf_of(n, k)}"] in out.dead or ids[f"{leaf_of(n, k)}->n{n}.nic{k}"]
                    in out.dead or ids[f"n{n}.pcisw{nic_switch[k]}->n{n}.nic{k}"] in out.dead}
            if not down:
                continue
            out.ports_down[n] = down
            alive = [k for k in range(ports) if k not in down]
            if not alive:
                lids = [ids[f"n{n}.nic{k}->{leaf_of(n, k)}"] for k in range(ports)]
                raise NoPath(f"node {n} is cut off from the other nodes: every NIC of it is down; expected one "
                             "left up", key=f"faults."
                             f"{out.culprit(lids)}")

            def instead(g: int, k: int, alive: list[int] = alive) -> int:
                """Another NIC for local GPU ``g``: on its own PCIe switch first, then the nearest."""
                return min(alive, key=lambda a: (nic_switch[a] != gpu_switch[g], abs(a - k), a))

            out.nic_of[n] = [k if k not in down else instead(g, k) for g, k in enumerate(nic_of)]
    return out


def check_paths(topo: Any) -> None:
    """Raise :class:`NoPath` where the links down leave two GPUs of ``topo`` (a
    :class:`~simgpu.platform.topology.Topology`) without a path: inside every node a link down
    touches, between each of its GPUs and the same GPU of the next node (both ways), and, where a
    link between switches is down, between the first node of every two pods or switches."""
    f: Faults = topo.faults
    gpn, nodes, lpn = topo.gpus_per_node, topo.nodes, topo.links_per_node
    touched = sorted({lid // lpn for lid in f.dead if lid < nodes * lpn})
    for n in touched:
        base = n * gpn
        for a in range(gpn):
            for b in range(gpn):
                if a != b:
                    topo.route(base + a, base + b)
            if nodes > 1:
                other = ((n + 1) % nodes) * gpn + a
                topo.route(base + a, other)
                topo.route(other, base + a)
    if nodes > 1 and any(lid >= nodes * lpn for lid in f.dead):
        firsts = sorted({min(m for m in range(nodes) if topo.leaf_of(m, 0) == topo.leaf_of(n, 0))
                         for n in range(nodes)} | {0, nodes - 1})
        for x in firsts:
            for y in firsts:
                if x != y:
                    for g in range(gpn):
                        topo.route(x * gpn + g, y * gpn + g)

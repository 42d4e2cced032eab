"""A mixed platform: nodes of different kinds (each a platform file) on one network.

A platform file with a ``mix`` key lists its kinds in node order::

    name: mixed_h100_a100
    mix:
      - {platform: dgx_h100, nodes: 2}
      - {platform: dgx_a100, nodes: 2, overrides: {gpu.memory_gib: 40}}
    network: {nodes_per_leaf: 16}      # over the first entry's network section; optional

It loads as a :class:`MixedPlatform`: a :class:`~simgpu.config.platform.PlatformSpec` (the first
kind's, with the mix's name, network and collectives, so every stage that reads one platform reads
it unchanged) that also carries every node's kind (``kinds``). What is per kind: the GPU (its kernel
models, memory, peaks), the node's NVLink and PCIe links and its NICs (``nics_per_node``,
``nics_per_gpu``, ``nic_gbps``, ``efficiency``); what is the mix's: the fabric between the nodes
(topology, leaves, spine, latencies), NCCL's settings (``collectives``), the host's launch cost and
the engine's overlap figures (the first kind's). For now every kind has the same GPUs per node and
the same layout of links in a node (NVLink kind, PCIe switches, NICs per node); NVLink SHARP is used
only where every kind has it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt

from ..errors import ConfigError
from .base import Spec
from .platform import CollectiveSpec, NetworkSpec, PlatformSpec

#: the network keys each node keeps from its own kind (its NICs); the rest are the mix's fabric
NIC_KEYS = ("nics_per_node", "nics_per_gpu", "nic_gbps", "efficiency", "stripe_messages")


class MixEntry(Spec):
    """One kind of node of a mixed platform and how many of it, in node order."""

    platform: str = Field(description="a platform name (platforms/<name>.yaml) or a path to a platform file, "
                                      "relative to the mixed file")
    nodes: PositiveInt = Field(description="nodes of this kind")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="dotted keys of that platform set for these nodes, e.g. "
                                          "{gpu.memory_gib: 40}")


class MixFile(Spec):
    """A mixed platform file: nodes of several kinds on one network (docs/mixed.md)."""

    name: str = Field(description="short name, e.g. mixed_h100_a100")
    description: str = Field("", description="one line for people")
    mix: list[MixEntry] = Field(min_length=1, description="the kinds of node in node order: {platform, nodes, "
                                                         "overrides}")
    network: dict[str, Any] | None = Field(
        None, description="keys of a network section over the first entry's: the fabric between the nodes "
                          "(topology, nodes_per_leaf, oversubscription, latencies); each node keeps its own "
                          "kind's NICs")
    collectives: dict[str, Any] | None = Field(
        None, description="keys of a collectives section over the first entry's (NCCL's settings for the job)")


class NodeKind(Spec):
    """One entry of a mix, loaded."""

    platform: PlatformSpec = Field(description="the kind's platform (its overrides applied; the mix's fabric)")
    nodes: PositiveInt = Field(description="nodes of this kind")
    file: str = Field(description="the platform file it was read from")


class MixedPlatform(PlatformSpec):
    """A platform whose nodes are of several kinds: the first kind's spec with the mix's name, network
    and collectives, and ``kinds`` in node order."""

    kinds: list[NodeKind] = Field(description="the kinds of node, in node order")

    @property
    def total_nodes(self) -> int:
        return sum(k.nodes for k in self.kinds)

    def node_kinds(self) -> list[int]:
        """Per node, the index of its kind among :meth:`distinct` (equal kinds are one kind)."""
        specs = self.distinct()
        return [specs.index(k.platform) for k in self.kinds for _ in range(k.nodes)]

    def distinct(self) -> list[PlatformSpec]:
        """The distinct kinds' platforms, in the order they first appear."""
        out: list[PlatformSpec] = []
        for k in self.kinds:
            if k.platform not in out:
                out.append(k.platform)
        return out

    def labels(self) -> list[str]:
        """A name per distinct kind: its platform's name, numbered where two share one."""
        names = [p.name for p in self.distinct()]
        return [n if names.count(n) == 1 else f"{n}#{names[:i + 1].count(n)}" for i, n in enumerate(names)]


def is_mixed(platform: PlatformSpec) -> bool:
    """Whether ``platform`` has nodes of more than one distinct kind."""
    return isinstance(platform, MixedPlatform) and len(platform.distinct()) > 1


#: what a node's layout of links is made of: kinds that differ in these are refused for now
def _layout(p: PlatformSpec) -> tuple[object, ...]:
    nv = p.node.nvlink
    return (nv.kind if nv else None, tuple(nv.links) if nv else (), p.node.pcie.switches, p.node.pcie.p2p,
            p.network.nics_per_node, p.network.nics_per_gpu)


Load = Callable[[str, Sequence[tuple[str, Any]], Path | None], tuple[PlatformSpec, str]]
Validate = Callable[..., Any]


def load_mixed(data: dict[str, Any], lines: dict[tuple[str, ...], int], file: str, load: Load,
               validate: Validate) -> MixedPlatform:
    """The mixed platform of the file ``file`` (read as ``data``), its entries read with ``load`` (the
    loader's ``load_platform``) and sections checked with ``validate``; refuses in one line an entry
    that is missing, mixed itself or has faults, kinds whose GPUs per node or links in a node differ."""
    mf = validate(MixFile, data, file, lines)
    kinds: list[NodeKind] = []
    for i, e in enumerate(mf.mix):
        at = f"mix.{i}.platform"
        try:
            spec, pfile = load(e.platform, list(e.overrides.items()), Path(file).parent)
        except ConfigError as err:
            if "not found" in err.message or "is a folder" in err.message:
                raise ConfigError(err.message, file=file, key=at, line=lines.get(("mix", str(i), "platform"))) from None
            raise
        if isinstance(spec, MixedPlatform):
            raise ConfigError(f"{pfile} is a mixed platform itself; expected a platform of one kind of node",
                              file=file, key=at)
        if spec.faults:
            raise ConfigError(f"{pfile} has faults; expected a platform without faults in a mix (not modelled yet)",
                              file=file, key=at)
        if kinds and spec.node.gpus != kinds[0].platform.node.gpus:
            raise ConfigError(f"{spec.name} has {spec.node.gpus} GPUs per node but {kinds[0].platform.name} has "
                              f"{kinds[0].platform.node.gpus}; expected the same GPUs per node in every entry "
                              "(not modelled yet)", file=file, key=at)
        if kinds and _layout(spec) != _layout(kinds[0].platform):
            raise ConfigError(f"{spec.name}'s node is laid out unlike {kinds[0].platform.name}'s (NVLink kind, PCIe "
                              "switches, NICs per node); expected the same layout in every entry (not modelled yet)",
                              file=file, key=at)
        kinds.append(NodeKind(platform=spec, nodes=e.nodes, file=pfile))
    first = kinds[0].platform
    net = first.network.model_dump()
    if mf.network:
        net.update(mf.network)
    own = sorted(set(mf.network or ()) & set(NIC_KEYS))
    if own:  # keys the mix gives that are each node's own are refused rather than ignored
        raise ConfigError(f"network.{own[0]} is each kind's own (its NICs); expected it in an entry's "
                          f"overrides (network.{own[0]})", file=file, key=f"network.{own[0]}")
    network = validate(NetworkSpec, net, file, None) if mf.network else first.network
    coll = first.collectives
    if mf.collectives:
        coll = validate(CollectiveSpec, {**first.collectives.model_dump(), **mf.collectives}, file, None)
    # every kind on the mix's fabric, its own NICs kept
    fabric = {k: v for k, v in network.model_dump().items() if k not in NIC_KEYS}
    kinds = [k.model_copy(update={"platform": k.platform.model_copy(update={
        "network": NetworkSpec.model_validate({**k.platform.network.model_dump(), **fabric})})}) for k in kinds]
    nvls = all(k.platform.node.nvlink is not None and k.platform.node.nvlink.nvls for k in kinds)
    node = first.node
    if node.nvlink is not None and node.nvlink.nvls and not nvls:
        node = node.model_copy(update={"nvlink": node.nvlink.model_copy(update={"nvls": False})})
    base = kinds[0].platform
    return MixedPlatform(
        name=mf.name, description=mf.description, gpu=base.gpu, host=base.host, node=node,
        network=base.network, collectives=coll, faults=[], kinds=kinds)


def check_nodes(platform: PlatformSpec, nodes: int, file: str, line: int | None = None) -> None:
    """Refuse a workload whose node count is not its mixed platform's."""
    if isinstance(platform, MixedPlatform) and nodes != platform.total_nodes:
        parts = " + ".join(f"{k.nodes} {k.platform.name}" for k in platform.kinds)
        raise ConfigError(f"the mixed platform {platform.name} has {platform.total_nodes} nodes ({parts}); "
                          f"expected nodes: {platform.total_nodes}, got {nodes}", file=file, key="nodes", line=line)


def check_memory_by_kind(platform: MixedPlatform, totals: Sequence[float], gpus_per_node: int, file: str) -> None:
    """Refuse a job one of whose ranks needs more memory (bytes, ``totals`` per rank) than its own
    kind's GPU has."""
    kinds, per_node = platform.distinct(), platform.node_kinds()
    for r, need in enumerate(totals):
        gpu = kinds[per_node[r // gpus_per_node]].gpu
        if need > gpu.memory_gib * 2**30:
            raise ConfigError(f"does not fit in GPU memory: rank {r} (node {r // gpus_per_node}) needs "
                              f"{need / 2**30:.1f} GiB but a {gpu.name} has {gpu.memory_gib:g} GiB; expected a "
                              "smaller model.*, less memory per GPU (micro-batch, recompute, zero) or more GPUs",
                              file=file, key="model")

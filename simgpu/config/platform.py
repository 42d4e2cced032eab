"""The platform file: one kind of node (GPUs, host, PCIe, NVLink) and the network between nodes.

How many nodes a job uses is the workload's choice; a platform describes any number of them.
Bandwidths in GB/s are 1e9 bytes per second per direction; ``nic_gbps`` is in Gb/s (bits), as
NICs are sold. ``efficiency`` fields are the achievable fraction of a datasheet peak.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from .base import Spec
from .faults import FaultSpec

Fraction = Annotated[float, Field(gt=0, le=1)]
NonNegFloat = Annotated[float, Field(ge=0)]


class GPUSpec(Spec):
    """One GPU model, from its datasheet."""

    name: str = Field(description="marketing name, e.g. A100-SXM4-80GB")
    memory_gib: PositiveFloat = Field(description="device memory, GiB")
    hbm_gbytes_per_s: PositiveFloat = Field(description="peak memory bandwidth, GB/s")
    sms: PositiveInt = Field(description="streaming multiprocessors")
    peak_tflops: dict[Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"], PositiveFloat] = Field(
        description="dense peak TFLOP/s per dtype (tensor cores where they apply)")
    l2_mib: PositiveFloat | None = Field(None, description="L2 cache, MiB (a feature of the kernel models)")
    boost_clock_mhz: PositiveFloat | None = Field(
        None, description="maximum SM clock, MHz (a feature of the kernel models)")
    kernel_models: str | None = Field(
        None, description="the platform whose fitted kernel models time this GPU (the same GPU model); "
                          "default: this platform's own, else the models fitted across measured GPUs")
    matmul_efficiency: Fraction = Field(0.8, description="achievable fraction of peak for large GEMMs")
    memory_efficiency: Fraction = Field(0.85, description="achievable fraction of peak HBM bandwidth")
    kernel_min_us: NonNegFloat = Field(2.5, description="shortest kernel duration, us")
    overlap_slowdown: Annotated[float, Field(ge=0, le=1)] = Field(
        0.05, description="fractional slowdown of a kernel that starts while a communication kernel "
                          "runs on the same GPU (SMs and HBM bandwidth taken by the collective)")
    overlap_slowdown_by_op: dict[Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
                                         "broadcast", "reduce"], Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict, description="the same per collective op, where it differs from overlap_slowdown "
                                          "(the largest of the collectives running applies); measured with "
                                          "python -m simgpu.trace.overlap")
    overlap_slowdown_memory: dict[Literal["within_node", "across_nodes"], Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="the slowdown of a memory-bound kernel (its bytes outlast its FLOPs on "
                                          "the roofline) beside a collective moving bytes within a node or across "
                                          "nodes: the HBM bandwidth the collective's bytes take (derived by python "
                                          "-m simgpu.kernels.overlap), instead of the op's figure; absent: the op's "
                                          "figure for every kernel")


class HostSpec(Spec):
    """The CPU side of one node."""

    cpu_threads: PositiveInt = Field(description="CPU threads that can issue work (physical cores), per node")
    launch_us: NonNegFloat = Field(5.0, description="CPU time to dispatch and launch one GPU op, us")


class NVLinkSpec(Spec):
    """GPU-to-GPU links inside a node.

    ``nvswitch``: every GPU has one port of ``gbytes_per_s`` to a non-blocking switch. ``mesh``:
    GPUs are wired point to point (NVLink bridges, DGX-1's hybrid cube-mesh); ``links`` lists
    ``[gpu_a, gpu_b, count]`` and each of the ``count`` links carries ``gbytes_per_s``.
    """

    kind: Literal["nvswitch", "mesh"] = Field(description="nvswitch or mesh")
    gbytes_per_s: PositiveFloat = Field(description="nvswitch: per GPU port; mesh: per link; per direction, GB/s")
    efficiency: Fraction = Field(0.8, description="achievable fraction of gbytes_per_s")
    latency_us: NonNegFloat = Field(0.7, description="one-way latency GPU to GPU, us")
    links: list[tuple[int, int, PositiveInt]] = Field(
        default_factory=list, description="mesh only: [gpu_a, gpu_b, number of links] for each wired pair")
    nvls: bool = Field(False, description="the switch can reduce in the network (NVLink SHARP, H100 and later)")
    nvls_efficiency: Fraction = Field(
        0.7, description="achievable fraction of the port bandwidth for in-switch reductions")

    @model_validator(mode="after")
    def _mesh_has_links(self) -> NVLinkSpec:
        if self.kind == "mesh" and not self.links:
            raise ValueError("a mesh needs links: [[gpu_a, gpu_b, count], ...]")
        if self.kind == "nvswitch" and self.links:
            raise ValueError("links are for kind: mesh; an nvswitch connects every GPU")
        if self.nvls and self.kind != "nvswitch":
            raise ValueError("nvls needs kind: nvswitch")
        return self


class PCIeSpec(Spec):
    """PCIe inside a node: GPUs and NICs hang off ``switches`` switches below the CPU."""

    gbytes_per_s: PositiveFloat = Field(description="x16 link, per direction, GB/s")
    efficiency: Fraction = Field(0.8, description="achievable fraction of gbytes_per_s")
    latency_us: NonNegFloat = Field(1.0, description="one-way latency through one switch, us")
    switches: PositiveInt = Field(1, description="PCIe switches (or root ports) sharing GPUs and NICs evenly")
    p2p: bool = Field(True, description="GPUs reach each other directly over PCIe; false: through host memory")
    staged_gbytes_per_s: PositiveFloat | None = Field(
        None, description="when p2p is false: bandwidth of the host-memory staging area that all GPU-to-GPU "
                          "copies of a node share, both directions together, GB/s; default the PCIe rate")


class NodeSpec(Spec):
    """One node."""

    gpus: PositiveInt = Field(description="GPUs per node")
    nvlink: NVLinkSpec | None = Field(None, description="NVLink fabric; null for PCIe-only nodes")
    pcie: PCIeSpec


#: The most ports a dragonfly switch is taken to have: every count of nodes, switches or links that
#: hangs off one switch is at most this (today's switches have 64 to 512).
SWITCH_PORTS = 1024


class DragonflySpec(Spec):
    """A dragonfly network (Slingshot, Aries): nodes on switches, switches in groups joined all to all by
    local links, groups joined all to all by global links. Paths are minimal: at most one local hop in
    the source group, one global link, one local hop in the destination group."""

    nodes_per_switch: PositiveInt = Field(le=SWITCH_PORTS, description="nodes whose NICs all attach to one switch")
    switches_per_group: PositiveInt = Field(
        le=SWITCH_PORTS, description="switches of a group, joined all to all by local links")
    local_link_gbps: PositiveFloat = Field(
        description="one local (switch to switch, in a group) link, per direction, Gb/s")
    local_links_per_switch_pair: PositiveInt = Field(
        1, le=SWITCH_PORTS, description="parallel local links between two switches of a group")
    global_link_gbps: PositiveFloat = Field(description="one global (group to group) link, per direction, Gb/s")
    global_links_per_group_pair: PositiveInt = Field(
        le=SWITCH_PORTS, description="global links between two groups; each sits on its own switch of either group "
                                     "(spread round the switches), and a flow between the groups takes one of them, "
                                     "chosen by its end nodes")
    routing: Literal["minimal", "adaptive"] = Field(
        "minimal", description="minimal: a flow pinned to one path, its global link picked by its end nodes (static "
                               "routing); adaptive: a switch spreads its packets over every path (Slingshot's "
                               "adaptive routing), so a switch's local links and the global links between two "
                               "groups each serve as one pool")
    local_latency_us: NonNegFloat = Field(0.3, description="extra one-way latency of a local hop, us")
    global_latency_us: NonNegFloat = Field(0.5, description="extra one-way latency of a global hop, us")


class SharpSpec(Spec):
    """How the switches aggregate where the network reduces (InfiniBand SHARP streaming aggregation).

    Defaults from public figures: ``level_us`` from the 2.83 us 8-byte MPI_Allreduce over 128 hosts
    on a two-level Switch-IB 2 tree (Graham et al., "Scalable Hierarchical Aggregation Protocol
    (SHArP)", COMHPC 2016), less about 1.4 us of the hosts' injection and delivery, over its two
    levels; ``reduction_efficiency`` from streaming aggregation's all-reduce at about 95% of the
    network bandwidth on HDR Quantum (Graham et al., "SHARP Streaming-Aggregation Hardware Design and
    Evaluation", ISC 2020); ``trees`` from the SHARP documentation (Rev 3.13, General Information):
    Quantum (HDR) runs one streaming-aggregation tree at a time per switch, Quantum-2 (NDR) and later
    one per port.
    """

    level_us: NonNegFloat = Field(
        0.7, description="one switch level's aggregation on the way up and its multicast on the way down, us")
    reduction_efficiency: Fraction = Field(
        0.95, description="the rate a switch reduces one aggregation tree's stream at, as a fraction of its "
                          "port's line rate (nic_gbps)")
    trees: Literal["per_port", "per_switch"] = Field(
        "per_port", description="per_port: every port runs its own aggregation tree (Quantum-2 and later), so each "
                                "channel reduces at the full rate; per_switch: one tree at a time per switch "
                                "(Quantum HDR), so the channels through one switch share its rate")

    @field_validator("trees", mode="before")
    @classmethod
    def _trees_known(cls, given: object) -> object:
        if given not in ("per_port", "per_switch"):
            raise ValueError(f"expected per_port (Quantum-2 and later) or per_switch (Quantum HDR); got {given!r}")
        return given


class NetworkSpec(Spec):
    """NICs and the network between nodes."""

    nics_per_node: PositiveInt = Field(description="NICs per node (GPU-facing, for collectives)")
    nics_per_gpu: PositiveInt = Field(
        1, description="NICs each GPU has to itself (multi-rail: NCCL spreads a GPU's channels over them, so its "
                       "traffic is striped evenly over its NICs, each on its own rail's leaf); above 1, "
                       "nics_per_node must be node.gpus x nics_per_gpu")
    in_network_reduction: bool = Field(
        False, description="the switches reduce data in the network (InfiniBand SHARP) and NCCL uses it (CollNet: the "
                           "SHARP plugin and NCCL_COLLNET_ENABLE=1): all-reduce across nodes may run as CollNet, each "
                           "node sending its data up once and getting the result back")
    sharp: SharpSpec = Field(
        default_factory=SharpSpec, description="the switches' aggregation where in_network_reduction is set")
    stripe_messages: bool = Field(
        False, description="with several NICs per GPU: the network layer stripes every message over all of them "
                           "(aws-ofi-nccl's rails on EFA), so one channel reaches the GPU's whole rate; false: "
                           "NCCL spreads a GPU's channels over its NICs, a channel on one NIC")
    nic_gbps: PositiveFloat = Field(description="per NIC, per direction, Gb/s")
    efficiency: Fraction = Field(0.9, description="achievable fraction of nic_gbps")
    latency_us: NonNegFloat = Field(2.0, description="one-way latency NIC to NIC through one switch, us")
    topology: Literal["rail_optimized", "fat_tree", "dragonfly"] = Field(
        "rail_optimized",
        description="rail_optimized: NIC i of every node on leaf switch i; fat_tree: all NICs of a node on one "
                    "leaf; dragonfly: groups of switches (the dragonfly keys)")
    dragonfly: DragonflySpec | None = Field(None, description="the dragonfly's shape, where topology is dragonfly")
    nodes_per_leaf: PositiveInt = Field(32, description="nodes under one leaf switch (per rail when rail_optimized)")
    oversubscription: Annotated[float, Field(ge=1)] = Field(
        1.0, description="leaf downlink to uplink bandwidth ratio (1 = non-blocking)")
    spine_latency_us: NonNegFloat = Field(1.0, description="extra one-way latency through the spine, us")
    many_peer_efficiency: Fraction = Field(
        1.0, description="fraction of a NIC's achievable rate reached while it exchanges with the NICs of several "
                         "other nodes at once (an all-to-all over more than two nodes: incast and head-of-line "
                         "blocking on the fabric); 1: as with one peer node")


    @field_validator("topology", mode="before")
    @classmethod
    def _topology_known(cls, given: object) -> object:
        if given not in ("rail_optimized", "fat_tree", "dragonfly"):
            raise ValueError(f"expected rail_optimized, fat_tree or dragonfly; got {given!r}")
        return given

    @model_validator(mode="after")
    def _dragonfly_given(self) -> NetworkSpec:
        if self.topology == "dragonfly" and self.dragonfly is None:
            raise ValueError("topology dragonfly expected a dragonfly section (nodes_per_switch, switches_per_group, "
                             "local_link_gbps, global_link_gbps, global_links_per_group_pair)")
        if self.topology != "dragonfly" and self.dragonfly is not None:
            raise ValueError(f"a dragonfly section expected topology dragonfly; got topology {self.topology}")
        return self


class ProtocolSpec(Spec):
    """One collective protocol: its fixed cost, its cost per algorithm step, its bandwidth."""

    base_us: NonNegFloat = Field(description="fixed cost of a collective with this protocol, us")
    step_nvlink_us: NonNegFloat = Field(description="cost of one algorithm step over NVLink, us")
    step_pcie_us: NonNegFloat = Field(description="cost of one algorithm step over PCIe, us")
    step_net_us: NonNegFloat = Field(description="cost of one algorithm step over the network, us")
    bandwidth: Fraction = Field(description="fraction of link bandwidth that carries payload")
    net_round_trip: bool = Field(
        False, description="a step over the network waits a round trip (buffer credits), not one way")
    chunk_kib: PositiveFloat = Field(
        512, description="largest piece a step forwards; a pipeline of D steps fills in D chunk times, KiB")
    tree_efficiency: list[Fraction] = Field(
        default_factory=list,
        description="fraction of its bandwidth a tree all-reduce reaches by message size, one figure per power "
                    "of two from 64 B (a size's figure is that of the power of two at or below it; 1 beyond)")


#: NCCL's own derating of tree all-reduce bandwidth at medium sizes, per protocol, by power of two
#: from 64 B to 256 MB: "trees are not perfectly sticking to the model for medium sizes"
#: (treeCorrectionFactor in NCCL's src/graph/tuning.cc).
_NCCL_TREE = {
    "ll": [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0],
    "ll128": [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0],
    "simple": [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9],
}


def _default_protocols() -> dict[Literal["ll", "ll128", "simple"], ProtocolSpec]:
    # LL: 8-byte stores of 4 bytes of data and a flag, no synchronisation: lowest latency, half
    # the bandwidth. LL128: 128-byte lines with 8 bytes of flags, NVLink-class latency. Simple:
    # bulk copies with a fence per step: the highest latency, the full bandwidth.
    return {
        "ll": ProtocolSpec(base_us=5.0, step_nvlink_us=0.6, step_pcie_us=1.0, step_net_us=3.0, bandwidth=0.5,
                          chunk_kib=32, tree_efficiency=_NCCL_TREE["ll"]),
        "ll128": ProtocolSpec(base_us=7.0, step_nvlink_us=1.2, step_pcie_us=2.0, step_net_us=6.0,
                              bandwidth=120 / 128, tree_efficiency=_NCCL_TREE["ll128"]),
        "simple": ProtocolSpec(base_us=9.0, step_nvlink_us=3.0, step_pcie_us=4.0, step_net_us=10.0,
                               bandwidth=1.0, net_round_trip=True, tree_efficiency=_NCCL_TREE["simple"]),
    }


class CollectiveSpec(Spec):
    """Software costs of the collective library (NCCL) on this platform."""

    launch_us: NonNegFloat = Field(8.0, description="fixed cost of one collective on top of its protocol's, us")
    channel_gbytes_per_s: PositiveFloat | None = Field(
        None, description="the most one channel (one thread block of NCCL's kernel) moves, sends and "
                          "receives together, GB/s: it bounds point-to-point transfers, which NCCL spreads "
                          "over a few channels by size; null: no bound")
    channels: PositiveInt | None = Field(
        None, description="parallel rings/trees across nodes; default one per NIC")
    min_channels: PositiveInt | None = Field(
        None, description="NCCL_MIN_NCHANNELS: the fewest channels a communicator's collectives run on; "
                          "default NCCL's search decides (simgpu/comm/channels.py)")
    max_channels: PositiveInt | None = Field(
        None, description="NCCL_MAX_NCHANNELS: the most channels a communicator's collectives run on; "
                          "default NCCL's MAXCHANNELS (32)")
    net_peer_channels: PositiveInt | None = Field(
        None, description="NCCL_NCHANNELS_PER_NET_PEER: channels one peer across the network gets; default "
                          "NCCL's rule of the platform's release (simgpu/comm/channels.py)")
    net_channel_gbytes_per_s: PositiveFloat | None = Field(
        None, description="the most one channel moves to one peer across the network, per direction, GB/s (NCCL "
                          "gives a network peer two channels on a small communicator and one on a large one, "
                          "src/graph/paths.cc): it holds a cross-node send/recv below the NIC's rate; null: no bound")
    net_peer_share: Fraction = Field(
        1.0, description="fraction of a NIC's achievable rate that the connection of one send/recv pair (one peer, "
                         "one direction) reaches across the network, whatever its channels; 1: the whole NIC")
    p2p_net_peer_us: NonNegFloat = Field(
        0.0, description="cost a grouped point-to-point operation (all-to-all) pays per peer across the network "
                         "(its setup, the message's latency, the proxy's progress over the peers), us; the peers "
                         "are served one after another, so a small all-to-all grows with the ranks")
    p2p_local_peer_us: NonNegFloat = Field(
        0.0, description="the same per peer inside the node (NVLink or PCIe), us")
    single_process: bool = Field(
        False, description="one process drives every GPU of a node (nccl-tests -g N): NCCL hands the GPUs "
                           "direct pointers to each other's buffers, so a ring's loop inside the node has "
                           "no step that only copies locally; false: a process per GPU, as training runs")
    nccl_version: str = Field(
        "2.23", pattern=r"^2\.\d+(\.\d+)?$",
        description="the NCCL release this machine runs, e.g. 2.21.5: it chooses the rules of NCCL's tuning "
                    "model (simgpu/comm/tuning.py) the tuner follows; default the newest modelled")
    tuner: Literal["nccl", "isolated"] = Field(
        "nccl", description="how the algorithm of a collective across nodes is chosen: nccl, as NCCL's own "
                            "tuning model picks it by node count (then the fastest protocol for it); isolated, "
                            "the fastest algorithm in isolation on this topology")
    tree_efficiency_power: PositiveFloat = Field(
        1.0, description="the protocols' tree_efficiency (NCCL's derating of trees by message size) is "
                         "raised to this power: above 1 trees fall further short at mid sizes than NCCL's "
                         "own model says, as on some fabrics behind a network plugin; set by calibration")
    slow_all_reduce_bytes: PositiveInt | None = Field(
        None, description="all-reduces of at least this many bytes take slow_all_reduce times as long to move "
                          "their bytes (a stack whose large all-reduces take a slower path; a measured property "
                          "of that stack, fitted to its times); null: none")
    slow_all_reduce: Annotated[float, Field(ge=1)] = Field(
        1.0, description="how many times as long an all-reduce of slow_all_reduce_bytes or more takes to move its "
                         "bytes alone on the network (its latency as before; its transfers' rates capped to match)")
    protocols: dict[Literal["ll", "ll128", "simple"], ProtocolSpec] = Field(
        default_factory=_default_protocols,
        description="the protocols' costs; what a platform gives for a protocol replaces those keys of its "
                    "defaults, the rest stay")
    enabled_protocols: list[Literal["ll", "ll128", "simple"]] | None = Field(
        None, min_length=1,
        description="the protocols this machine's NCCL may use (NCCL_PROTO; e.g. [simple] where the network "
                    "plugin forces it); default: every protocol listed")

    @field_validator("nccl_version", mode="before")
    @classmethod
    def _version_text(cls, given: object) -> object:
        if not isinstance(given, str) or not re.fullmatch(r"2\.\d+(\.\d+)?", given.strip()):
            raise ValueError(f"expected an NCCL release as quoted text, such as \"2.21.5\" or \"2.18\"; got {given!r}")
        return given.strip()

    @field_validator("tuner", mode="before")
    @classmethod
    def _tuner_known(cls, given: object) -> object:
        if given not in ("nccl", "isolated"):
            raise ValueError(f"expected nccl (NCCL's tuning model) or isolated (fastest in isolation); got {given!r}")
        return given

    @field_validator("protocols", mode="before")
    @classmethod
    def _over_defaults(cls, given: object) -> object:
        if not isinstance(given, dict):
            return given
        merged: dict[object, object] = {k: v.model_dump() for k, v in _default_protocols().items()}
        for name, keys in given.items():
            base = merged.get(name)
            merged[name] = {**base, **keys} if isinstance(base, dict) and isinstance(keys, dict) else keys
        return merged

    @model_validator(mode="after")
    def _enabled_known(self) -> CollectiveSpec:
        unknown = [p for p in self.enabled_protocols or () if p not in self.protocols]
        if unknown:
            raise ValueError(f"enabled_protocols names {', '.join(unknown)}, not among protocols "
                             f"({', '.join(self.protocols)})")
        for key in ("min_channels", "max_channels"):
            value = getattr(self, key)
            if value is not None and value > 32:
                raise ValueError(f"{key} is {value}; expected at most 32 (NCCL's MAXCHANNELS)")
        if self.min_channels and self.max_channels and self.min_channels > self.max_channels:
            raise ValueError(f"min_channels ({self.min_channels}) is above max_channels ({self.max_channels}); "
                             "expected min_channels <= max_channels")
        return self

    def usable_protocols(self) -> list[str]:
        """The protocols the tuner chooses among."""
        return list(self.enabled_protocols) if self.enabled_protocols is not None else list(self.protocols)


class PlatformSpec(Spec):
    """A platform file."""

    name: str = Field(description="short name, e.g. dgx_a100")
    description: str = Field("", description="one line for people")
    gpu: GPUSpec
    host: HostSpec
    node: NodeSpec
    network: NetworkSpec
    collectives: CollectiveSpec = Field(default_factory=lambda: CollectiveSpec())
    faults: list[FaultSpec] = Field(
        default_factory=list,
        description="degraded or failed parts for the iteration (docs/faults.md): each a nic, nvlink, switch or link "
                    "with a factor on its bandwidth or down: true; empty: every part as specified")

    @model_validator(mode="after")
    def _switches_fit(self) -> PlatformSpec:
        if self.node.pcie.switches > self.node.gpus:
            raise ValueError(
                f"node.pcie.switches ({self.node.pcie.switches}) cannot exceed node.gpus ({self.node.gpus})")
        net = self.network
        if net.nics_per_gpu > 1 and net.nics_per_node != self.node.gpus * net.nics_per_gpu:
            raise ValueError(f"network.nics_per_node: expected node.gpus x nics_per_gpu = "
                             f"{self.node.gpus * net.nics_per_gpu}; got {net.nics_per_node}")
        return self

"""Degraded and failed parts of a platform: the ``faults:`` section of a platform file.

Each entry names one part (a NIC, an NVLink port or wired pair, a switch, or any link by the name
the topology gives it) and either a ``factor`` its bandwidth is multiplied by or ``down: true``
(the part is gone for the iteration: routes avoid it, NCCL's channels replan over what remains).
Whether the part exists on the job's nodes, and whether every GPU still has a path where a part is
down, is checked by the topology (:mod:`simgpu.platform.faults`), which knows the node count.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, NonNegativeInt, model_validator

from .base import Spec


class NicRef(Spec):
    """One NIC of one node."""

    node: NonNegativeInt = Field(description="the node, 0-based, among the job's nodes")
    index: NonNegativeInt = Field(description="the NIC within its node, 0-based, below network.nics_per_node")


class NVLinkRef(Spec):
    """NVLink of one node: a GPU's port to the NVSwitch (``gpu``), or the links wired between two GPUs
    of a mesh (``gpus``)."""

    node: NonNegativeInt = Field(description="the node, 0-based, among the job's nodes")
    gpu: NonNegativeInt | None = Field(
        None, description="a GPU's NVLink port, both directions: to the NVSwitch, or on a mesh every link it has")
    gpus: tuple[NonNegativeInt, NonNegativeInt] | None = Field(
        None, description="[gpu_a, gpu_b]: the NVLink links wired between two GPUs of a mesh, both directions")

    @model_validator(mode="after")
    def _one_of(self) -> NVLinkRef:
        if (self.gpu is None) == (self.gpus is None):
            raise ValueError("expected one of gpu (a GPU's port) or gpus ([gpu_a, gpu_b], a wired pair of a mesh)")
        if self.gpus is not None and self.gpus[0] == self.gpus[1]:
            raise ValueError(f"gpus names GPU {self.gpus[0]} twice; expected two different GPUs")
        return self


class FaultSpec(Spec):
    """One degraded or failed part: exactly one of ``nic``, ``nvlink``, ``switch``, ``link``, with
    exactly one of ``factor`` or ``down: true``."""

    nic: NicRef | None = Field(
        None, description="a NIC: its port to the leaf switch, both directions (on a multi-rail node, one of the "
                          "NICs a GPU stripes over: the GPU keeps the others)")
    nvlink: NVLinkRef | None = Field(None, description="a GPU's NVLink port, or a wired pair of a mesh")
    switch: str | None = Field(
        None, pattern=r"^(leaf\d+(\.\d+)?|sw\d+\.\d+|spine)$",
        description="a switch as the topology names it: leaf<pod> (fat tree), leaf<rail>.<pod> (rail-optimised), "
                    "sw<group>.<switch> (dragonfly), or spine (the core as one: factor (S-1)/S stands for one of S "
                    "spines down); every link to and from it")
    link: str | None = Field(
        None, min_length=1,
        description="one directed link by the topology's name, e.g. n0.nic1->leaf1.0 or leaf1.0->spine (the names "
                    "simgpu run --links writes)")
    factor: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="the part's bandwidth is multiplied by this (0 < factor <= 1): a link trained down, a "
                          "degraded cable")
    down: bool = Field(False, description="the part is gone for the iteration: routes avoid it and NCCL's channels "
                                          "replan over what remains; where nothing remains the run stops")

    @model_validator(mode="after")
    def _one_part_one_effect(self) -> FaultSpec:
        parts = [k for k in ("nic", "nvlink", "switch", "link") if getattr(self, k) is not None]
        if len(parts) != 1:
            raise ValueError("expected exactly one part, one of nic, nvlink, switch, link; got "
                             + (", ".join(parts) if parts else "none"))
        if (self.factor is None) == (not self.down):
            raise ValueError("expected exactly one of factor (reduced bandwidth) or down: true")
        return self

    def part(self) -> str:
        """The part in words, e.g. ``nic 1 of node 3``."""
        if self.nic is not None:
            return f"nic {self.nic.index} of node {self.nic.node}"
        if self.nvlink is not None:
            nv = self.nvlink
            what = f"gpu {nv.gpu}'s NVLink port" if nv.gpu is not None else \
                f"NVLink gpu {nv.gpus[0]}-gpu {nv.gpus[1]}"  # type: ignore[index]
            return f"{what} of node {nv.node}"
        return f"switch {self.switch}" if self.switch is not None else f"link {self.link}"

    def effect(self) -> str:
        return "down" if self.down else f"x{self.factor:g}"

"""PyTorch Execution Traces (ET): the input shapes and types of the CPU ops of a Kineto trace.

An ET lists every operator the program ran, with ``input_shapes`` and ``input_types``; Kineto
traces often lack them (``record_shapes`` off). An ET node's ``rf_id`` is the ``Record function id``
of the Kineto CPU op (in older traces its ``External id``), which is how the two are joined. This
module owns reading an ET and that join; it has no units (shapes are element counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .kineto import is_execution_trace, read_document


@dataclass
class ExecutionTrace:
    """Shapes and types of the ops of one rank's ET, by record-function id."""

    file: str
    pid: int | None
    shapes: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    types: dict[int, tuple[Any, ...]] = field(default_factory=dict)

    def lookup(self, ids: tuple[int, ...]) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
        """``(input_shapes, input_types)`` of the first of ``ids`` the ET knows, else ``(None, None)``."""
        for i in ids:
            if i in self.shapes:
                return self.shapes[i], self.types.get(i)
        return None, None


def parse_et(doc: Any, file: str) -> ExecutionTrace:
    """The :class:`ExecutionTrace` of a parsed ET document."""
    if not is_execution_trace(doc):
        raise ConfigError("not a PyTorch Execution Trace (no 'schema' and 'nodes'); expected an Execution Trace "
                          "JSON", file=file)
    pid = doc.get("pid")
    et = ExecutionTrace(file, pid if isinstance(pid, int) else None)
    for node in doc["nodes"]:
        if not isinstance(node, dict):
            continue
        rf = node.get("rf_id")
        shapes = node.get("input_shapes")
        if isinstance(rf, int) and rf > 0 and isinstance(shapes, list):
            et.shapes[rf] = tuple(shapes)
            types = node.get("input_types")
            if isinstance(types, list):
                et.types[rf] = tuple(types)
    return et


def load_et(path: str | Path) -> ExecutionTrace:
    """Read one Execution Trace file (JSON or JSON.gz)."""
    doc, _ = read_document(path)
    return parse_et(doc, str(path))

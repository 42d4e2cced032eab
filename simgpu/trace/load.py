"""Loading a job's trace files and finding the platform a trace was taken on.

Files given together are one job: Kineto traces (one per rank) and, optionally, Execution Traces,
recognised by their content. An ET is paired with the Kineto trace of the same process id, or with
the only trace when there is one. The traced GPU's name (``deviceProperties``) picks the platform
file whose GPU is the same model (exact name first, then the same model and form factor, then the
same model; ``dgx_*`` platforms first among equals).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..config.loader import known_platforms, load_platform
from ..config.platform import PlatformSpec
from ..errors import ConfigError
from .et import ExecutionTrace, parse_et
from .kineto import RankTrace, is_execution_trace, parse_kineto, read_document

_MODEL = re.compile(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b")


def load_traces(paths: Sequence[str | Path], et_paths: Sequence[str | Path] = ()
                ) -> list[tuple[RankTrace, ExecutionTrace | None]]:
    """Read ``paths`` (Kineto traces and ETs, told apart by content) and ``et_paths``; pair them."""
    traces: list[RankTrace] = []
    ets: list[ExecutionTrace] = []
    for path in list(paths) + list(et_paths):
        doc, cut = read_document(path)
        if is_execution_trace(doc):
            ets.append(parse_et(doc, str(path)))
        elif str(path) in {str(e) for e in et_paths}:
            raise ConfigError("not a PyTorch Execution Trace (no 'schema' and 'nodes'); expected an Execution "
                              "Trace JSON after --et", file=str(path))
        else:
            traces.append(parse_kineto(doc, str(path), truncated=cut))
    if not traces:
        raise ConfigError("no Kineto trace among the files given (only Execution Traces); expected a PyTorch "
                          "profiler trace per rank",
                          file=str(paths[0]) if paths else None)
    paired: dict[int, ExecutionTrace] = {}
    for et in ets:
        match = [i for i, t in enumerate(traces) if et.pid is not None and t.pid == et.pid]
        if not match and len(traces) == 1:
            match = [0]
        if len(match) != 1 or match[0] in paired:
            raise ConfigError("cannot tell which Kineto trace this Execution Trace belongs to "
                              "(no trace with its process id)", file=et.file)
        paired[match[0]] = et
    return [(t, paired.get(i)) for i, t in enumerate(traces)]


def gpu_tokens(name: str) -> tuple[str | None, set[str]]:
    """The GPU model (``A100``) and the other upper-case tokens (``SXM4``, ``80GB``) of a GPU name."""
    up = name.upper().replace("_", "-")
    m = _MODEL.search(up.replace("-", " "))
    return (m.group(1) if m else None), set(re.split(r"[\s\-]+", up))


def platform_for_gpu(gpu: str | None) -> tuple[PlatformSpec, str] | None:
    """The shipped platform whose GPU is the traced one (see the module docstring), or None."""
    if not gpu:
        return None
    model, tokens = gpu_tokens(gpu)
    if model is None:
        return None
    best: tuple[tuple[int, int, str], PlatformSpec, str] | None = None
    for name in known_platforms():
        try:
            spec, path = load_platform(name)
        except ConfigError:
            continue
        pmodel, ptokens = gpu_tokens(spec.gpu.name)
        if pmodel != model:
            continue
        exact = spec.gpu.name.upper() in gpu.upper()
        form = len((ptokens & tokens) - {model})
        score = (3 if exact else 1 + (1 if form else 0), 1 if name.startswith("dgx") else 0, name)
        if best is None or score[:2] > best[0][:2] or (score[:2] == best[0][:2] and name < best[0][2]):
            best = (score, spec, path)
    return (best[1], best[2]) if best is not None else None

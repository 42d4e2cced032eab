"""A corpus of bad inputs to every command: each is refused with exit status 2 and one line on stderr
naming the file, the key (or the argument) and what was expected, with no traceback, nothing on
stdout and nothing written. Every case but the trace windows (known wrong only once the iteration is
simulated, a small one) fails before any simulation, so the corpus is fast."""

from __future__ import annotations

import gzip
import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, edit_keys
from test_trace_synthetic import simple_trace

GPT_FILE = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
DLRM_FILE = ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml"
PLATFORM_FILE = ROOT / "platforms" / "dgx_h100.yaml"

COMMANDS = {"run": "simgpu.run", "whatif": "simgpu.whatif.__main__", "comm": "simgpu.comm.__main__",
            "replay": "simgpu.replay", "search": "simgpu.search", "calibrate": "simgpu.comm.calibrate",
            "fit": "simgpu.fit", "simgpu": "simgpu.__main__", "serve": "simgpu.serve.__main__",
            "validate-dlrm": "simgpu.validate.dlrm", "validate-sharding": "simgpu.validate.sharding",
            "cluster": "simgpu.cluster.__main__", "validate-silicon-serving": "simgpu.validate.silicon_serving"}


def _edit(path: Path, changes: dict[str, Any]) -> str:
    """The YAML of ``path`` with dotted keys set (None deletes the key)."""
    data = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        cur = data
        *head, last = dotted.split(".")
        for h in head:
            cur = cur[int(h)] if isinstance(cur, list) else cur.setdefault(h, {})
        if value is None:
            cur.pop(last, None)
        elif isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value
    return yaml.safe_dump(data, sort_keys=False)


def gpt(**changes: Any) -> str:
    return _edit(GPT_FILE, {k.replace("__", "."): v for k, v in changes.items()})


def dlrm(**changes: Any) -> str:
    return _edit(DLRM_FILE, {k.replace("__", "."): v for k, v in changes.items()})


def platform(**changes: Any) -> str:
    return _edit(PLATFORM_FILE, {k.replace("__", "."): v for k, v in changes.items()})


def mixed(*entries: tuple[str, int], **extra: Any) -> str:
    """A mixed platform file of ``(platform, nodes)`` entries."""
    data = {"name": "mix", "mix": [{"platform": p, "nodes": n} for p, n in entries]} | extra
    return yaml.safe_dump(data, sort_keys=False)


GPT_TEXT = GPT_FILE.read_text()


def laughs(levels: int = 8, width: int = 9) -> str:
    """A "billion laughs" document: each anchor a list of ``width`` aliases of the one before."""
    rows = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(rows) + "\n"


LAUGHS = laughs()
#: The same as one flow value for --set: [&l0 [lol, ...], &l1 [*l0, ...], ...]
FLOW_LAUGHS = "[" + ",".join([f"&l0 [{','.join(['lol'] * 9)}]"]
                             + [f"&l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]) + "]"
ON_PLATFORM = gpt(platform="p.yaml")  # a workload on the platform file p.yaml beside it


def study(**extra: Any) -> str:
    data = {"name": "s", "base": str(GPT_FILE), "set": {"model.layers": 2}} | extra
    return yaml.safe_dump({k: v for k, v in data.items() if v is not None}, sort_keys=False)


def nccl_log(redop: str = "sum", root: int = -1, rows: int = 8, size: int | None = None) -> str:
    lines = ["# nccl-tests", "#       size         count      type   redop    root     time   algbw   busbw #wrong"]
    for i in range(rows):
        size_i = 1024 * 4**i if size is None else size
        lines.append(f"{size_i:>12} {size_i // 4:>12}     float {redop:>7} {root:>7} {20.0 + i * 30:8.1f}   1.00   "
                     f"1.00      0 {20.0 + i * 30:8.1f}   1.00   1.00      0")
    return "\n".join(lines) + "\n"


def trace_doc() -> dict[str, Any]:
    return simple_trace(steps=3).doc()


def trace_gz() -> bytes:
    return gzip.compress(json.dumps(trace_doc()).encode())


def trace_json() -> str:
    return json.dumps(trace_doc())


@dataclass(frozen=True)
class Case:
    """``argv`` may name ``{tmp}`` (the case's folder); ``files`` are written there first (bytes or
    text; a name ending in / is a folder); ``expect`` must all appear in the error line."""

    id: str
    command: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    files: dict[str, Any] = field(default_factory=dict)


def case(id: str, command: str, argv: str, *expect: str, **files: Any) -> Case:
    return Case(id, command, tuple(argv.split()), expect, {k.replace("__", "."): v for k, v in files.items()})


W = "{tmp}/w.yaml"
RUN = [
    # encodings and file kinds
    case("latin1", "run", W, "w.yaml:1", "not UTF-8", "expected", w__yaml=("# caf\xe9\n" + GPT_TEXT).encode("latin-1")),
    case("utf16", "run", W, "w.yaml", "UTF-16", "expected", w__yaml=GPT_TEXT.encode("utf-16")),
    case("utf16-le-nobom", "run", W, "w.yaml", "UTF-16", w__yaml=GPT_TEXT.encode("utf-16-le")),
    case("binary", "run", W, "w.yaml", "UTF-8", w__yaml=b"\x89PNG\r\n\x1a\n\xff\xfe\x00"),
    case("empty", "run", W, "w.yaml", "expected a mapping", w__yaml=""),
    case("a-list", "run", W, "w.yaml", "expected a mapping", w__yaml="- 1\n- 2\n"),
    case("a-scalar", "run", W, "w.yaml", "expected a mapping", w__yaml="hello\n"),
    case("malformed", "run", W, "w.yaml:2", "malformed YAML", w__yaml="name: x\n  bad: [1, 2\n"),
    case("tabs", "run", W, "w.yaml", "malformed YAML", w__yaml="name: x\n\tnodes: 2\n"),
    case("folder", "run", "{tmp}/wdir", "wdir", "is a folder", "expected a workload YAML file", wdir=None),
    case("missing-file", "run", "{tmp}/none.yaml", "none.yaml", "not found"),
    case("duplicate-top", "run", W, "w.yaml:6", "nodes: given twice", "expected each key once",
         w__yaml=GPT_TEXT.replace("nodes: 2", "nodes: 2\nnodes: 4")),
    case("duplicate-nested", "run", W, "w.yaml", "layers: given twice",
         w__yaml=GPT_TEXT.replace("  layers: 24", "  layers: 24\n  layers: 12")),
    # hostile YAML: aliases that expand past any real input
    case("alias-bomb", "run", W, "w.yaml", "aliases expand", "expected at most 1,000,000 values", w__yaml=LAUGHS),
    case("alias-bomb-in-workload", "run", W, "w.yaml", "expected at most 1,000,000 values",
         w__yaml=GPT_TEXT + "x-" + LAUGHS.replace("\nl", "\nx-l")),
    case("alias-bomb-platform", "run", W, "p.yaml", "aliases expand", "expected at most", w__yaml=ON_PLATFORM,
         p__yaml=LAUGHS),
    Case("alias-bomb-set", "run", (str(GPT_FILE), "--set", f"model.x={FLOW_LAUGHS}"),
         ("--set", "model.x", "aliases expand", "expected at most")),
    # booleans, strings and other wrong kinds of numbers
    case("nodes-true", "run", W, "w.yaml:3", "nodes: expected a number, got a boolean", w__yaml=gpt(nodes=True)),
    case("nodes-false", "run", W, "nodes: expected a number", w__yaml=gpt(nodes=False)),
    case("nodes-string", "run", W, "nodes: expected a number, got a string '2'", w__yaml=gpt(nodes="2")),
    case("nodes-zero", "run", W, "w.yaml", "nodes:", "greater than 0", w__yaml=gpt(nodes=0)),
    case("nodes-negative", "run", W, "nodes:", "greater than 0", w__yaml=gpt(nodes=-2)),
    case("nodes-fraction", "run", W, "nodes:", "fractional", w__yaml=gpt(nodes=1.5)),
    case("nodes-list", "run", W, "nodes:", "integer", w__yaml=gpt(nodes=[2])),
    case("nodes-missing", "run", W, "w.yaml", "nodes: missing required key", "expected", w__yaml=gpt(nodes=None)),
    case("nodes-huge", "run", W, "w.yaml", "nodes:", "800,000 GPUs", "GiB", "expected at most",
         w__yaml=gpt(nodes=100000)),
    case("seq-len-string", "run", W, "model.seq_len: expected a number, got a string '1024'",
         w__yaml=gpt(model__seq_len="1024")),
    case("layers-string", "run", W, "model.layers: expected a number", w__yaml=gpt(model__layers="many")),
    case("layers-true", "run", W, "model.layers: expected a number, got a boolean", w__yaml=gpt(model__layers=True)),
    case("layers-zero", "run", W, "model.layers", "greater than 0", w__yaml=gpt(model__layers=0)),
    case("layers-fraction", "run", W, "model.layers", "fractional", w__yaml=gpt(model__layers=2.5)),
    case("layers-nan", "run", W, "model.layers", w__yaml=GPT_TEXT.replace("layers: 24", "layers: .nan")),
    case("layers-1e20", "run", W, "model.layers", "GiB of memory", "expected a smaller model.layers",
         w__yaml=GPT_TEXT.replace("layers: 24", "layers: 1e20")),
    case("layers-1e20-int", "run", W, "model.layers", "GiB of memory", "expected a smaller model.layers",
         w__yaml=GPT_TEXT.replace("layers: 24", "layers: 100000000000000000000")),
    case("layers-1e12", "run", W, "model.layers", "GiB of memory", w__yaml=gpt(model__layers=10**12)),
    case("accumulation-huge", "run", W, "training.grad_accumulation", "GiB of memory", "expected a smaller",
         w__yaml=gpt(training__grad_accumulation=10**6)),
    case("hidden-true", "run", W, "model.hidden: expected a number", w__yaml=gpt(model__hidden=True)),
    case("vocab-list", "run", W, "model.vocab", w__yaml=gpt(model__vocab=[1, 2])),
    case("dropout-one", "run", W, "model.dropout", "less than 1", w__yaml=gpt(model__dropout=1.0)),
    case("dropout-string", "run", W, "model.dropout: expected a number", w__yaml=gpt(model__dropout="0.1")),
    case("batch-zero", "run", W, "training.batch_per_gpu", "greater than 0", w__yaml=gpt(training__batch_per_gpu=0)),
    case("batch-true", "run", W, "training.batch_per_gpu: expected a number",
         w__yaml=gpt(training__batch_per_gpu=True)),
    case("batch-string", "run", W, "training.batch_per_gpu: expected a number",
         w__yaml=gpt(training__batch_per_gpu="2")),
    case("host-overhead-inf", "run", W, "training.host_overhead_us", "finite",
         w__yaml=GPT_TEXT.replace("  optimizer: adam", "  optimizer: adam\n  host_overhead_us: .inf")),
    case("bucket-zero", "run", W, "comm.bucket_mib", "greater than 0", w__yaml=gpt(comm__bucket_mib=0)),
    case("bucket-inf", "run", W, "comm.bucket_mib", "finite", w__yaml=GPT_TEXT.replace("bucket_mib: 25",
         "bucket_mib: .inf")),
    case("bucket-nan", "run", W, "comm.bucket_mib", "finite", w__yaml=GPT_TEXT.replace("bucket_mib: 25",
         "bucket_mib: .nan")),
    case("first-bucket-megatron", "run", W, "first_bucket_mib", "expected no first_bucket_mib",
         w__yaml=gpt(training__framework="megatron", comm__first_bucket_mib=2)),
    case("seed-string", "run", W, "seed: expected a number", w__yaml=gpt(seed="x")),
    case("seed-fraction", "run", W, "seed", "fractional", w__yaml=gpt(seed=0.5)),
    case("sp-int", "run", W, "parallelism.sp: expected true or false", w__yaml=gpt(parallelism__sp=1)),
    case("sp-string", "run", W, "parallelism.sp: expected true or false", w__yaml=gpt(parallelism__sp="yes please")),
    case("dp-overlap-string", "run", W, "parallelism.dp_overlap: expected true or false",
         w__yaml=gpt(parallelism__dp_overlap="false")),
    case("tp-comm-overlap-no-sp", "run", W, "parallelism", "expected sp: true and tp > 1",
         w__yaml=gpt(parallelism__tp_comm_overlap=True)),
    case("overlap-grad-reduce-both", "run", W, "parallelism", "overlap_grad_reduce", "expected one of them",
         w__yaml=gpt(parallelism__overlap_grad_reduce=False, parallelism__dp_overlap=True)),
    case("param-gather-zero0", "run", W, "parallelism", "expected zero: 1 or 2",
         w__yaml=gpt(parallelism__overlap_param_gather=True)),
    case("fsdp-key-zero1", "run", W, "parallelism", "backward_prefetch is FSDP's", "expected zero: 3",
         w__yaml=gpt(parallelism__zero=1, parallelism__backward_prefetch="none")),
    case("backward-prefetch-typo", "run", W, "parallelism.backward_prefetch", "backward_pre",
         w__yaml=gpt(parallelism__zero=3, parallelism__backward_prefetch="BACKWARD_PRE")),
    case("p2p-overlap-1f1b", "run", W, "parallelism", "expected pp_schedule: interleaved",
         w__yaml=gpt(parallelism__overlap_p2p_comm=True)),
    case("steady-state-typo", "run", W, "training.steady_state", "'auto', 'always', 'never' or 'check'",
         w__yaml=gpt(training__steady_state="sometimes")),
    # keys: typos, missing, discriminator
    case("typo-hiddn", "run", W, "w.yaml", "model.hiddn: unknown key; did you mean 'hidden'?", "expected one of",
         w__yaml=GPT_TEXT.replace("hidden:", "hiddn:")),
    case("typo-top", "run", W, "nodess: unknown key; did you mean 'nodes'?", w__yaml=GPT_TEXT + "nodess: 2\n"),
    case("typo-training", "run", W, "training.optimiser: unknown key; did you mean 'optimizer'?",
         w__yaml=GPT_TEXT.replace("optimizer: adam", "optimiser: adam")),
    case("typo-parallelism", "run", W, "parallelism.tensor_parallel: unknown key",
         w__yaml=gpt(parallelism__tensor_parallel=2)),
    case("kind-missing", "run", W, "w.yaml", "model.kind: missing required key", "dlrm, transformer",
         w__yaml=gpt(model__kind=None)),
    case("kind-unknown", "run", W, "model.kind: expected one of: 'dlrm', 'transformer', 'transformer_inference', "
         "'dlrm_inference'; got 'lstm'",
         w__yaml=gpt(model__kind="lstm")),
    case("model-missing", "run", W, "model: missing required key", w__yaml=gpt(model=None)),
    case("training-missing", "run", W, "training: missing required key", w__yaml=gpt(training=None)),
    case("name-missing", "run", W, "name: missing required key", w__yaml=gpt(name=None)),
    case("hidden-missing", "run", W, "model.hidden: missing required key", w__yaml=gpt(model__hidden=None)),
    case("name-path", "run", W, "w.yaml", "name: expected a short name", "not a path", w__yaml=gpt(name="../../..")),
    case("name-absolute", "run", W, "name: expected a short name", w__yaml=gpt(name="/etc/x")),
    case("name-dots", "run", W, "name: expected a short name", w__yaml=gpt(name="..")),
    case("name-empty", "run", W, "name: expected a short name", w__yaml=gpt(name="")),
    case("name-number", "run", W, "name", w__yaml=gpt(name=5)),
    # values out of range and rules that tie keys together
    case("precision-fp4", "run", W, "training.precision", "'fp32', 'tf32', 'bf16', 'fp16' or 'fp8'",
         w__yaml=gpt(training__precision="fp4")),
    case("optimizer-bogus", "run", W, "training.optimizer", "'sgd', 'adam' or 'adagrad'",
         w__yaml=gpt(training__optimizer="lion")),
    case("recompute-bogus", "run", W, "training.recompute", w__yaml=gpt(training__recompute="some")),
    case("dp-mismatch", "run", W, "parallelism.dp", "expected dp=16", w__yaml=gpt(parallelism__dp=12)),
    case("tp-three", "run", W, "parallelism.tp", "does not divide", w__yaml=gpt(parallelism__tp=3,
         parallelism__dp=None)),
    case("tp-zero", "run", W, "parallelism.tp", "greater than 0", w__yaml=gpt(parallelism__tp=0)),
    case("pp-five", "run", W, "model.layers", "expected a multiple of 5",
         w__yaml=gpt(parallelism__pp=5, parallelism__dp=None, nodes=5)),
    case("sp-without-tp", "run", W, "parallelism.sp", "expected tp > 1", w__yaml=gpt(parallelism__sp=True)),
    case("zero-four", "run", W, "parallelism.zero", w__yaml=gpt(parallelism__zero=4)),
    case("fsdp-and-zero", "run", W, "parallelism", "contradicts", w__yaml=gpt(parallelism__fsdp=True,
         parallelism__zero=1)),
    case("interleaved-no-stages", "run", W, "parallelism.pp_schedule", "virtual_stages",
         w__yaml=gpt(parallelism__pp_schedule="interleaved")),
    case("stage-layers-length", "run", W, "parallelism.stage_layers", "3 entries for pp=2 stages",
         "expected 2 entries", w__yaml=gpt(parallelism__pp=2, parallelism__dp=None,
                                           parallelism__stage_layers=[8, 8, 8])),
    case("stage-layers-zero", "run", W, "parallelism.stage_layers", "entry 1 is 0", "expected at least one block",
         w__yaml=gpt(parallelism__pp=2, parallelism__dp=None, parallelism__stage_layers=[24, 0])),
    case("stage-layers-sum", "run", W, "parallelism.stage_layers", "= 23 blocks", "expected entries summing to 24",
         w__yaml=gpt(parallelism__pp=2, parallelism__dp=None, parallelism__stage_layers=[12, 11])),
    case("stage-layers-interleaved", "run", W, "parallelism.stage_layers", "2 x 2 model chunks",
         "expected 4 entries", w__yaml=gpt(parallelism__pp=2, parallelism__dp=None, parallelism__virtual_stages=2,
                                           parallelism__pp_schedule="interleaved", training__grad_accumulation=2,
                                           parallelism__stage_layers=[14, 10])),
    case("stage-layers-and-embedding", "run", W, "parallelism.stage_layers", "account_for_embedding_and_loss",
         w__yaml=gpt(parallelism__pp=2, parallelism__dp=None, parallelism__account_for_embedding_and_loss=True,
                     parallelism__stage_layers=[12, 12])),
    case("stage-layers-word", "run", W, "parallelism.stage_layers", "expected a number",
         w__yaml=gpt(parallelism__stage_layers=["many"])),
    case("stage-layers-dlrm", "run", W, "parallelism.stage_layers", "transformer",
         w__yaml=dlrm(parallelism__stage_layers=[2])),
    case("heads-seven", "run", W, "model", "divisible by heads", w__yaml=gpt(model__heads=7)),
    case("ep-without-moe", "run", W, "parallelism.ep", "model.moe", w__yaml=gpt(parallelism__ep=2)),
    case("micro-and-batch", "run", W, "training", "name the same number", w__yaml=gpt(training__micro_batch=4)),
    case("global-not-multiple", "run", W, "training.global_batch", "not a multiple",
         w__yaml=gpt(training__global_batch=33)),
    case("global-and-accumulation", "run", W, "training", "not both",
         w__yaml=gpt(training__global_batch=32, training__grad_accumulation=2)),
    case("algorithm-bogus", "run", W, "comm.algorithm", w__yaml=gpt(comm__algorithm="butterfly")),
    case("gpus-per-node-nine", "run", W, "gpus_per_node", "node has 8", w__yaml=gpt(gpus_per_node=9)),
    case("gpus-per-node-zero", "run", W, "gpus_per_node", "greater than 0", w__yaml=gpt(gpus_per_node=0)),
    case("too-big-for-memory", "run", W, "model", "does not fit in GPU memory", "80 GiB",
         w__yaml=gpt(model__layers=4, model__hidden=65536, model__heads=64)),
    case("platform-missing-key", "run", W, "platform", "expected a platform name", w__yaml=gpt(platform=None)),
    case("platform-unknown", "run", W, "platform 'dgx_z100' not found", "expected", w__yaml=gpt(platform="dgx_z100")),
    case("platform-number", "run", W, "platform", w__yaml=gpt(platform=5)),
    case("platform-folder", "run", W, "is a folder", "expected a platform YAML", w__yaml=gpt(platform="pdir/"),
         pdir=None),
    # DLRM
    case("dlrm-rows-zero", "run", W, "model.tables.0.rows", "greater than 0", w__yaml=dlrm(model__tables__0__rows=0)),
    case("dlrm-rows-string", "run", W, "model.tables.0.rows: expected a number",
         w__yaml=dlrm(model__tables__0__rows="1000")),
    case("dlrm-pooling-negative", "run", W, "model.tables.0.pooling_factor",
         w__yaml=dlrm(model__tables__0__pooling_factor=-1)),
    case("dlrm-no-tables", "run", W, "model", "at least one embedding table", w__yaml=dlrm(model__tables=[],
         model__generate=None)),
    case("dlrm-planner-bogus", "run", W, "parallelism.sharding.planner",
         w__yaml=dlrm(parallelism__sharding={"planner": "best"})),
    case("dlrm-table-index", "run", W, "parallelism.sharding.tables.999", "does not exist",
         w__yaml=dlrm(parallelism__sharding={"tables": {999: {"type": "table_wise"}}})),
    case("dlrm-rank-99", "run", W, "parallelism.sharding.tables.0.ranks", "do not exist",
         w__yaml=dlrm(parallelism__sharding={"tables": {0: {"type": "table_wise", "ranks": [99]}}})),
    case("dlrm-tp", "run", W, "parallelism.tp", "transformer", w__yaml=dlrm(parallelism__tp=2)),
    case("dlrm-nodes-huge", "run", W, "nodes", "GPUs", "expected at most", w__yaml=dlrm(nodes=100000)),
    case("dlrm-interaction", "run", W, "model.interaction", w__yaml=dlrm(model__interaction="sum")),
    # the platform file the workload names
    case("platform-latin1", "run", W, "p.yaml", "not UTF-8", w__yaml=ON_PLATFORM,
         p__yaml=("# \xe9\n" + PLATFORM_FILE.read_text()).encode("latin-1")),
    case("platform-duplicate", "run", W, "p.yaml", "name: given twice", w__yaml=ON_PLATFORM,
         p__yaml=PLATFORM_FILE.read_text().replace("name: dgx_h100", "name: dgx_h100\nname: again", 1)),
    case("platform-hbm-inf", "run", W, "p.yaml", "gpu.hbm_gbytes_per_s", "finite", w__yaml=ON_PLATFORM,
         p__yaml=platform(gpu__hbm_gbytes_per_s=float("inf"))),
    case("platform-nic-true", "run", W, "p.yaml", "network.nic_gbps: expected a number", w__yaml=ON_PLATFORM,
         p__yaml=platform(network__nic_gbps=True)),
    case("platform-gpus-string", "run", W, "p.yaml", "node.gpus: expected a number", w__yaml=ON_PLATFORM,
         p__yaml=platform(node__gpus="8")),
    case("platform-typo", "run", W, "p.yaml", "gpu.memory_gb: unknown key; did you mean 'memory_gib'?",
         w__yaml=ON_PLATFORM, p__yaml=platform(gpu__memory_gb=80)),
    case("platform-name-missing", "run", W, "p.yaml", "gpu.name: missing required key", w__yaml=ON_PLATFORM,
         p__yaml=platform(gpu__name=None)),
    # a mixed platform (docs/mixed.md)
    case("mix-missing-platform", "run", W, "p.yaml", "mix.1.platform", "'dgx_z100' not found", w__yaml=ON_PLATFORM,
         p__yaml=mixed(("dgx_h100", 1), ("dgx_z100", 1))),
    case("mix-gpus-per-node", "run", W, "p.yaml", "mix.1.platform", "expected the same GPUs per node",
         w__yaml=ON_PLATFORM, p__yaml=mixed(("dgx_h100", 1), ("pcie_4gpu", 1))),
    case("mix-nodes", "run", W, "w.yaml", "nodes", "has 3 nodes", "expected nodes: 3, got 2", w__yaml=ON_PLATFORM,
         p__yaml=mixed(("dgx_h100", 1), ("dgx_a100", 2))),
    case("mix-network-nic", "run", W, "p.yaml", "network.nic_gbps", "each kind's own", w__yaml=ON_PLATFORM,
         p__yaml=mixed(("dgx_h100", 1), ("dgx_a100", 1), network={"nic_gbps": 800})),
    case("platform-tflops-string", "run", W, "p.yaml", "gpu.peak_tflops", "expected a number", w__yaml=ON_PLATFORM,
         p__yaml=platform(gpu__peak_tflops={"bf16": "989"})),
    case("platform-max-channels-64", "run", W, "p.yaml", "collectives", "max_channels", "expected at most 32",
         w__yaml=ON_PLATFORM, p__yaml=platform(collectives__max_channels=64)),
    case("platform-min-above-max-channels", "run", W, "p.yaml", "collectives", "expected min_channels <= max_channels",
         w__yaml=ON_PLATFORM, p__yaml=platform(collectives__min_channels=8, collectives__max_channels=4)),
    case("platform-sharp-trees", "run", W, "p.yaml", "network.sharp.trees", "expected",
         w__yaml=ON_PLATFORM, p__yaml=platform(network__sharp={"trees": "per_rack"})),
    case("platform-sharp-unknown", "run", W, "p.yaml", "network.sharp.levels_us: unknown key",
         w__yaml=ON_PLATFORM, p__yaml=platform(network__sharp={"levels_us": 1.5})),
    # platform faults (docs/faults.md): parts the job's nodes lack, a cut, a malformed entry
    case("fault-node-missing", "run", W, "p.yaml", "faults.0", "node 5 is not among the job's 2 nodes",
         w__yaml=ON_PLATFORM, p__yaml=platform(faults=[{"nic": {"node": 5, "index": 1}, "down": True}])),
    case("fault-nic-missing", "run", W, "p.yaml", "faults.0", "nic 9 does not exist", w__yaml=ON_PLATFORM,
         p__yaml=platform(faults=[{"nic": {"node": 0, "index": 9}, "factor": 0.5}])),
    case("fault-cut-off", "run", W, "p.yaml", "faults.0", "node 1 is cut off", w__yaml=ON_PLATFORM,
         p__yaml=platform(network__nics_per_node=1, faults=[{"nic": {"node": 1, "index": 0}, "down": True}])),
    case("fault-nvswitch-pair", "run", W, "p.yaml", "faults.0", "expected nvlink: {node: 0, gpu: 2}",
         w__yaml=ON_PLATFORM, p__yaml=platform(faults=[{"nvlink": {"node": 0, "gpus": [2, 5]}, "down": True}])),
    case("fault-two-parts", "run", W, "p.yaml", "faults.0", "exactly one part", w__yaml=ON_PLATFORM,
         p__yaml=platform(faults=[{"switch": "spine", "link": "leaf0.0->spine", "down": True}])),
    case("fault-no-effect", "run", W, "p.yaml", "faults.0", "exactly one of factor", w__yaml=ON_PLATFORM,
         p__yaml=platform(faults=[{"switch": "spine"}])),
    case("fault-link-unknown", "run", W, "p.yaml", "faults.0", "no link n0.nic1->leaf9.0", w__yaml=ON_PLATFORM,
         p__yaml=platform(faults=[{"link": "n0.nic1->leaf9.0", "factor": 0.5}])),
    case("fault-unknown-key", "run", W, "p.yaml", "faults.0.nic.idx: unknown key", w__yaml=ON_PLATFORM,
         p__yaml=platform(faults=[{"nic": {"node": 0, "idx": 1}, "down": True}])),
    # --set overrides
    case("set-novalue", "run", f"{GPT_FILE} --set novalue", "--set: expected key.path=value"),
    case("set-nokey", "run", f"{GPT_FILE} --set =3", "--set: expected key.path=value"),
    case("set-nodes-true", "run", f"{GPT_FILE} --set nodes=true", "nodes: expected a number, got a boolean"),
    case("set-seq-len-string", "run", f"{GPT_FILE} --set model.seq_len='1024'", "model.seq_len: expected a number"),
    case("set-unknown", "run", f"{GPT_FILE} --set model.nope=1", "model.nope: unknown key"),
    case("set-nic-inf", "run", f"{GPT_FILE} --set platform.network.nic_gbps=.inf", "dgx_h100.yaml", "network.nic_gbps",
         "finite"),
    case("set-hbm-inf", "run", f"{GPT_FILE} --set platform.gpu.hbm_gbytes_per_s=.inf", "gpu.hbm_gbytes_per_s",
         "finite"),
    case("set-hbm-nan", "run", f"{GPT_FILE} --set platform.gpu.hbm_gbytes_per_s=.nan", "gpu.hbm_gbytes_per_s",
         "finite"),
    case("set-nic-fast", "run", f"{GPT_FILE} --set platform.network.nic_gbps=fast", "network.nic_gbps",
         "expected a number"),
    case("set-nic-negative", "run", f"{GPT_FILE} --set platform.network.nic_gbps=-400", "network.nic_gbps",
         "greater than 0"),
    case("set-platform-unknown", "run", f"{GPT_FILE} --set platform.gpu.tensor_cores=1",
         "gpu.tensor_cores: unknown key"),
    case("set-gpus-zero", "run", f"{GPT_FILE} --set platform.node.gpus=0", "node.gpus", "greater than 0"),
    case("set-gpus-huge", "run", f"{GPT_FILE} --set platform.node.gpus=100000 --set parallelism.dp=200000",
         "200,000 GPUs", "expected at most"),
    case("set-nodes-huge", "run", f"{GPT_FILE} --set nodes=100000", "nodes", "800,000 GPUs", "GiB"),
    Case("dragonfly-links", "run", (str(GPT_FILE), "--set", "nodes=2000", "--set", "parallelism.dp=null", "--set",
                                    "platform.network.topology=dragonfly", "--set", "platform.network.dragonfly="
                                    "{nodes_per_switch: 1, switches_per_group: 1000, local_link_gbps: 100, "
                                    "global_link_gbps: 100, global_links_per_group_pair: 8}"),
         ("dgx_h100.yaml", "network.dragonfly.switches_per_group", "1,998,016 links", "expected at most 1,000,000")),
    case("set-inside-scalar", "run", f"{GPT_FILE} --set nodes.x=1", "nodes", "cannot set a key inside"),
    case("set-bad-index", "run", f"{DLRM_FILE} --set model.tables.99.rows=5", "model.tables.99", "not an item"),
    case("set-layers-1e20", "run", f"{GPT_FILE} --set model.layers=1e20", "model.layers", "GiB of memory"),
    # variability: stragglers on GPUs that do not exist, factors and fractions out of range, speeds files
    case("slow-rank-missing", "run", W, "w.yaml", "variability.slow.0.ranks", "ranks [16] do not exist",
         w__yaml=gpt(variability={"slow": [{"ranks": [16], "factor": 1.3}]})),
    case("slow-node-missing", "run", W, "w.yaml", "variability.slow.0.nodes", "nodes [2] do not exist",
         w__yaml=gpt(variability={"slow": [{"nodes": [2], "factor": 1.3}]})),
    case("slow-factor-zero", "run", W, "w.yaml", "variability.slow.0.factor", "greater than 0",
         w__yaml=gpt(variability={"slow": [{"ranks": [1], "factor": 0}]})),
    case("slow-factor-negative", "run", W, "w.yaml", "variability.slow.0.factor", "greater than 0",
         w__yaml=gpt(variability={"slow": [{"ranks": [1], "factor": -1.5}]})),
    case("slow-fraction-zero", "run", W, "w.yaml", "variability.slow.0.fraction", "greater than 0",
         w__yaml=gpt(variability={"slow": [{"fraction": 0, "factor": 1.3}]})),
    case("slow-fraction-over-one", "run", W, "w.yaml", "variability.slow.0.fraction", "less than or equal to 1",
         w__yaml=gpt(variability={"slow": [{"fraction": 1.5, "factor": 1.3}]})),
    case("slow-no-pick", "run", W, "w.yaml", "variability.slow.0", "give one of ranks, nodes or fraction",
         w__yaml=gpt(variability={"slow": [{"factor": 1.3}]})),
    case("slow-unknown-key", "run", W, "w.yaml", "variability.slow.0.speed", w__yaml=gpt(
        variability={"slow": [{"ranks": [1], "factor": 1.3, "speed": 2}]})),
    case("jitter-per-bogus", "run", W, "w.yaml", "variability.jitter.per", w__yaml=gpt(
        variability={"jitter": {"cv": 0.05, "per": "node"}})),
    case("speeds-missing", "run", W, "w.yaml", "variability.speeds_csv", "cannot read",
         w__yaml=gpt(variability={"speeds_csv": "none.csv"})),
    case("speeds-columns", "run", W, "w.yaml", "variability.speeds_csv", "expected columns rank and factor",
         w__yaml=gpt(variability={"speeds_csv": "s.csv"}), s__csv="gpu,speed\n0,1.2\n"),
    case("speeds-rank-missing", "run", W, "w.yaml", "variability.speeds_csv", "ranks [40] do not exist",
         w__yaml=gpt(variability={"speeds_csv": "s.csv"}), s__csv="rank,factor\n40,1.2\n"),
    case("speeds-factor-zero", "run", W, "w.yaml", "variability.speeds_csv", "a factor > 0",
         w__yaml=gpt(variability={"speeds_csv": "s.csv"}), s__csv="rank,factor\n3,0\n"),
    # command-line arguments
    case("seed-abc", "run", f"{GPT_FILE} --seed abc", "--seed", "expected an integer"),
    case("out-is-file", "run", f"{GPT_FILE} --out {{tmp}}/taken", "--out", "is a file", "expected a folder", taken="x"),
    case("out-under-file", "run", f"{GPT_FILE} --out {{tmp}}/taken/sub", "--out", "is a file", taken="x"),
    case("records-bogus", "run", f"{GPT_FILE} --records xml", "--records", "invalid choice"),
    case("window-one", "run", f"{GPT_FILE} --trace-window 5", "--trace-window", "expected START:END"),
    case("window-reversed", "run", f"{GPT_FILE} --trace-window 5:1", "--trace-window", "expected 0 <= START < END"),
    case("window-after-end", "run", f"{GPT_FILE} --set model.layers=2 --set nodes=1 --set parallelism.dp=null "
         "--trace-window 100000:200000", "--trace-window", "holds none of the simulated intervals",
         "expected a window inside"),
    case("window-words", "run", f"{GPT_FILE} --trace-window a:b", "--trace-window", "expected START:END"),
    case("unknown-option", "run", f"{GPT_FILE} --fast", "unrecognized arguments: --fast"),
    case("no-workload", "run", "", "the following arguments are required: workload"),
]

COMM = [
    case("sizes-zero", "comm", "--platform dgx_h100 --sizes 0", "--sizes", "expected a size from 1 byte"),
    case("sizes-fraction", "comm", "--platform dgx_h100 --sizes 1.5", "--sizes", "expected a whole number of bytes"),
    case("sizes-fraction-unit", "comm", "--platform dgx_h100 --sizes 1.5B", "--sizes", "whole number"),
    case("sizes-negative", "comm", "--platform dgx_h100 --sizes -8", "--sizes", "expected a size"),
    case("sizes-word", "comm", "--platform dgx_h100 --sizes big", "--sizes", "expected a size"),
    case("sizes-unit", "comm", "--platform dgx_h100 --sizes 8XB", "--sizes", "expected a size"),
    case("sizes-empty-item", "comm", "--platform dgx_h100 --sizes 8,,16", "--sizes", "expected a size"),
    case("sizes-reversed", "comm", "--platform dgx_h100 --sizes 64:8", "--sizes", "0 < low <= high"),
    case("sizes-open", "comm", "--platform dgx_h100 --sizes 8:", "--sizes", "expected a size"),
    case("sizes-huge", "comm", "--platform dgx_h100 --sizes 2TB", "--sizes", "1 TiB"),
    case("sizes-zero-range", "comm", "--platform dgx_h100 --sizes 0:8", "--sizes", "expected a size from 1 byte"),
    case("nodes-zero", "comm", "--platform dgx_h100 --nodes 0", "--nodes", "expected an integer >= 1"),
    case("nodes-negative", "comm", "--platform dgx_h100 --nodes -3", "--nodes", "expected an integer >= 1"),
    case("nodes-word", "comm", "--platform dgx_h100 --nodes two", "--nodes", "expected an integer >= 1"),
    case("nodes-huge", "comm", "--platform dgx_h100 --nodes 100000", "--nodes", "800,000 GPUs", "GiB",
         "expected at most"),
    case("gpn-zero", "comm", "--platform dgx_h100 --gpus-per-node 0", "--gpus-per-node", "expected an integer >= 1"),
    case("gpn-nine", "comm", "--platform dgx_h100 --gpus-per-node 9", "--gpus-per-node",
         "expected --gpus-per-node in 1..8"),
    case("one-gpu", "comm", "--platform dgx_h100 --gpus-per-node 1", "--gpus-per-node", "at least 2 GPUs"),
    case("op-bogus", "comm", "--platform dgx_h100 --op all_scatter", "--op", "expected --op one of"),
    case("nccl-version-number", "comm", "--platform dgx_h100 --set collectives.nccl_version=2.18",
         "collectives.nccl_version", "expected an NCCL release as quoted text"),
    case("tuner-bogus", "comm", "--platform dgx_h100 --set collectives.tuner=fast", "collectives.tuner",
         "expected nccl"),
    case("algorithm-bogus", "comm", "--platform dgx_h100 --algorithm butterfly", "--algorithm", "invalid choice"),
    case("platform-unknown", "comm", "--platform dgx_z100", "platform 'dgx_z100' not found", "expected"),
    case("platform-missing-arg", "comm", "--sizes 8", "--platform"),
    case("platform-folder", "comm", "--platform {tmp}/pdir/", "is a folder", "expected a platform YAML", pdir=None),
    case("platform-latin1", "comm", "--platform {tmp}/p.yaml", "p.yaml", "not UTF-8",
         p__yaml=("# \xe9\n" + PLATFORM_FILE.read_text()).encode("latin-1")),
    case("platform-utf16", "comm", "--platform {tmp}/p.yaml", "p.yaml", "UTF-16",
         p__yaml=PLATFORM_FILE.read_text().encode("utf-16")),
    case("platform-duplicate", "comm", "--platform {tmp}/p.yaml", "p.yaml", "given twice",
         p__yaml=PLATFORM_FILE.read_text().replace("name: dgx_h100", "name: dgx_h100\nname: again", 1)),
    case("alias-bomb-platform", "comm", "--platform {tmp}/p.yaml", "p.yaml", "aliases expand", p__yaml=LAUGHS),
    case("set-nic-inf", "comm", "--platform dgx_h100 --set network.nic_gbps=.inf", "network.nic_gbps", "finite"),
    case("set-nic-true", "comm", "--platform dgx_h100 --set network.nic_gbps=true", "network.nic_gbps", "boolean"),
    case("set-nic-string", "comm", "--platform dgx_h100 --set network.nic_gbps='400'", "network.nic_gbps",
         "expected a number"),
    case("set-typo", "comm", "--platform dgx_h100 --set network.nic_gpbs=400", "network.nic_gpbs: unknown key",
         "did you mean 'nic_gbps'?"),
    case("set-efficiency", "comm", "--platform dgx_h100 --set network.efficiency=2", "network.efficiency",
         "less than or equal to 1"),
    case("set-dragonfly-bare", "comm", "--platform dgx_h100 --set network.topology=dragonfly", "network:",
         "expected a dragonfly section"),
    case("set-topology-unknown", "comm", "--platform dgx_h100 --set network.topology=torus", "network.topology",
         "expected rail_optimized, fat_tree or dragonfly"),
    case("set-rails-mismatch", "comm", "--platform dgx_h100 --set network.nics_per_gpu=2", "network.nics_per_node",
         "expected node.gpus x nics_per_gpu = 16"),
    case("set-sharp-number", "comm", "--platform dgx_h100 --set network.in_network_reduction=3",
         "network.in_network_reduction", "expected true or false"),
    case("dragonfly-nodes-per-switch-huge", "comm", "--platform perlmutter_gpu --set "
         "network.dragonfly.nodes_per_switch=1000000000000", "perlmutter_gpu.yaml",
         "network.dragonfly.nodes_per_switch", "less than or equal to 1024"),
    case("dragonfly-global-links-huge", "comm", "--platform perlmutter_gpu --set "
         "network.dragonfly.global_links_per_group_pair=100000", "network.dragonfly.global_links_per_group_pair",
         "less than or equal to 1024"),
    case("dragonfly-links", "comm", "--platform perlmutter_gpu --nodes 4000 --set network.dragonfly.routing=minimal "
         "--set network.dragonfly.nodes_per_switch=1 --set network.dragonfly.switches_per_group=1000",
         "perlmutter_gpu.yaml", "links", "expected at most 1,000,000 links"),
    case("set-platform-prefix", "comm", "--platform dgx_h100 --set platform.network.nic_gbps=100",
         "platform.network.nic_gbps", "expected network.nic_gbps=...", "prefix"),
    case("set-dragonfly-typo", "comm", "--platform perlmutter_gpu --set network.dragonfly.groups=3",
         "network.dragonfly.groups: unknown key", "expected one of"),
    case("csv-folder", "comm", "--platform dgx_h100 --csv {tmp}/cdir", "--csv", "is a folder", "expected a file",
         cdir=None),
    case("csv-missing-folder", "comm", "--platform dgx_h100 --csv {tmp}/no/such.csv", "--csv", "does not exist"),
]

REPLAY = [
    case("corrupt-gzip", "replay", "{tmp}/t.json.gz", "t.json.gz", "corrupt gzip", "expected",
         t__json__gz=b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4),
    case("truncated-gzip", "replay", "{tmp}/t.json.gz", "t.json.gz", "truncated", "expected a whole trace",
         t__json__gz=trace_gz()[: len(trace_gz()) * 2 // 3]),
    case("truncated-json", "replay", "{tmp}/t.json", "t.json", "truncated", "--allow-truncated",
         t__json=trace_json()[: len(trace_json()) * 3 // 4]),
    case("empty", "replay", "{tmp}/t.json", "t.json", "empty", "expected", t__json=""),
    case("binary", "replay", "{tmp}/t.json", "t.json", "not a JSON document", t__json=b"\x00\x01\x02\xff"),
    case("yaml", "replay", "{tmp}/t.json", "t.json", "not a JSON document", t__json="name: x\nnodes: 2\n"),
    case("latin1", "replay", "{tmp}/t.json", "t.json", "expected", t__json="caf\xe9 au lait".encode("latin-1")),
    case("other-json", "replay", "{tmp}/t.json", "t.json", "no traceEvents", t__json='{"model": "resnet"}'),
    case("no-runtime", "replay", "{tmp}/t.json", "t.json", "no CUDA runtime calls",
         t__json='{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}'),
    case("only-et", "replay", "{tmp}/t.json", "t.json", "Execution Trace", t__json='{"schema": "1.0.1", "nodes": []}'),
    case("folder", "replay", "{tmp}/tdir", "tdir", "is a folder", "expected a PyTorch profiler", tdir=None),
    case("missing", "replay", "{tmp}/none.json", "none.json", "cannot read"),
    case("world-zero", "replay", "{tmp}/t.json --world 0", "--world", "expected an integer >= 1", t__json=trace_json()),
    case("world-negative", "replay", "{tmp}/t.json --world -4", "--world", "expected an integer >= 1",
         t__json=trace_json()),
    case("world-word", "replay", "{tmp}/t.json --world many", "--world", "expected an integer", t__json=trace_json()),
    case("world-huge", "replay", "{tmp}/t.json --world 100000", "--world", "GPUs", "expected at most",
         t__json=trace_json()),
    case("step-negative", "replay", "{tmp}/t.json --step -1", "--step", "expected an integer >= 0",
         t__json=trace_json()),
    case("step-unknown", "replay", "{tmp}/t.json --step 42", "no ProfilerStep#42", t__json=trace_json()),
    case("platform-unknown", "replay", "{tmp}/t.json --platform dgx_z100", "dgx_z100", "not found",
         t__json=trace_json()),
    case("trace-platform-unknown", "replay", "{tmp}/t.json --trace-platform nope", "nope", "not found",
         t__json=trace_json()),
    case("set-unknown", "replay", "{tmp}/t.json --set network.nics=2", "network.nics: unknown key",
         t__json=trace_json()),
    case("set-inf", "replay", "{tmp}/t.json --set network.nic_gbps=.inf", "network.nic_gbps", "finite",
         t__json=trace_json()),
    case("set-novalue", "replay", "{tmp}/t.json --set nic", "--set: expected key.path=value", t__json=trace_json()),
    case("out-is-file", "replay", "{tmp}/t.json --out {tmp}/taken", "--out", "is a file", t__json=trace_json(),
         taken="x"),
    case("records-bogus", "replay", "{tmp}/t.json --records xml", "--records", "invalid choice", t__json=trace_json()),
    case("et-not-et", "replay", "{tmp}/t.json --et {tmp}/e.json", "e.json", "not a PyTorch Execution Trace",
         t__json=trace_json(), e__json=trace_json()),
    case("no-traces", "replay", "", "the following arguments are required: traces"),
]

WHATIF = [
    case("missing", "whatif", "{tmp}/none.yaml", "none.yaml", "not found"),
    case("folder", "whatif", "{tmp}/sdir", "sdir", "is a folder", sdir=None),
    case("latin1", "whatif", "{tmp}/s.yaml", "s.yaml", "not UTF-8", s__yaml=("# \xe9\n" + study()).encode("latin-1")),
    case("utf16", "whatif", "{tmp}/s.yaml", "s.yaml", "UTF-16", s__yaml=study().encode("utf-16")),
    case("duplicate", "whatif", "{tmp}/s.yaml", "s.yaml", "name: given twice", s__yaml=study() + "name: again\n"),
    case("a-list", "whatif", "{tmp}/s.yaml", "s.yaml", "expected a mapping", s__yaml="- 1\n"),
    case("typo-top", "whatif", "{tmp}/s.yaml", "s.yaml", "gird: unknown key; did you mean 'grid'?",
         s__yaml=study(gird={"nodes": [1]})),
    case("base-missing-key", "whatif", "{tmp}/s.yaml", "s.yaml", "base: missing required key",
         s__yaml=study(base=None)),
    case("alias-bomb", "whatif", "{tmp}/s.yaml", "s.yaml", "aliases expand", "expected at most", s__yaml=LAUGHS),
    case("alias-bomb-base", "whatif", "{tmp}/s.yaml", "b.yaml", "aliases expand", s__yaml=study(base="b.yaml"),
         b__yaml=LAUGHS),
    case("base-not-found", "whatif", "{tmp}/s.yaml", "s.yaml", "base", "not found", s__yaml=study(base="nope.yaml")),
    case("base-folder", "whatif", "{tmp}/s.yaml", "s.yaml", "base", "is a folder", s__yaml=study(base="bdir"),
         bdir=None),
    case("base-latin1", "whatif", "{tmp}/s.yaml", "b.yaml", "not UTF-8", s__yaml=study(base="b.yaml"),
         b__yaml=("# \xe9\n" + GPT_TEXT).encode("latin-1")),
    case("name-path", "whatif", "{tmp}/s.yaml", "s.yaml", "name: expected a short name", s__yaml=study(name="../../x")),
    case("base-typo", "whatif", "{tmp}/s.yaml", "b.yaml", "model.hiddn: unknown key", s__yaml=study(base="b.yaml"),
         b__yaml=GPT_TEXT.replace("hidden:", "hiddn:")),
    case("base-platform-bad", "whatif", "{tmp}/s.yaml", "p.yaml", "gpu.hbm_gbytes_per_s", "finite",
         s__yaml=study(base="b.yaml"), b__yaml=ON_PLATFORM, p__yaml=platform(gpu__hbm_gbytes_per_s=float("inf"))),
    case("set-makes-base-bad", "whatif", "{tmp}/s.yaml", "s.yaml", "set.nodes", "greater than 0",
         s__yaml=study(set={"nodes": 0})),
    case("grid-empty", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.nodes", "expected a non-empty list",
         s__yaml=study(grid={"nodes": []})),
    case("grid-not-list", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.nodes", "list", s__yaml=study(grid={"nodes": 2})),
    case("grid-unknown-key", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.model.hiddn", "unknown key",
         "did you mean 'hidden'?", s__yaml=study(grid={"model.hiddn": [1024, 2048]})),
    case("grid-unknown-platform-key", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.platform.network.nic_gpbs",
         "unknown key", s__yaml=study(grid={"platform.network.nic_gpbs": [100, 200]})),
    case("grid-bad-value", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.platform.network.nic_gbps", "-5",
         "greater than 0", s__yaml=study(grid={"platform.network.nic_gbps": [100, -5]})),
    case("grid-bool", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.nodes", "expected a number",
         s__yaml=study(grid={"nodes": [2, True]})),
    case("grid-string", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.model.seq_len", "expected a number",
         s__yaml=study(grid={"model.seq_len": ["1024"]})),
    case("grid-inf", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.platform.gpu.hbm_gbytes_per_s", "finite",
         s__yaml=study(grid={"platform.gpu.hbm_gbytes_per_s": [float("inf")]})),
    case("grid-precision", "whatif", "{tmp}/s.yaml", "s.yaml", "grid.training.precision", "fp4",
         s__yaml=study(grid={"training.precision": ["bf16", "fp4"]})),
    case("set-unknown-key", "whatif", "{tmp}/s.yaml", "s.yaml", "set.model.layerz", "unknown key",
         s__yaml=study(set={"model.layerz": 2})),
    case("variant-unknown-key", "whatif", "{tmp}/s.yaml", "s.yaml", "variants.0.set.model.layerz", "unknown key",
         s__yaml=study(variants=[{"name": "v", "set": {"model.layerz": 2}}])),
    case("variant-no-name", "whatif", "{tmp}/s.yaml", "s.yaml", "variants.0.name", "missing required key",
         s__yaml=study(variants=[{"set": {"nodes": 2}}])),
    case("variants-identical", "whatif", "{tmp}/s.yaml", "s.yaml", "variants", "identical overrides",
         s__yaml=study(variants=[{"name": "a", "set": {"nodes": 2}}, {"name": "b", "set": {"nodes": 2}}])),
    case("workers-zero", "whatif", "{tmp}/s.yaml --workers 0", "--workers", "expected an integer >= 1",
         s__yaml=study()),
    case("workers-negative", "whatif", "{tmp}/s.yaml --workers -2", "--workers", "expected an integer >= 1",
         s__yaml=study()),
    case("workers-word", "whatif", "{tmp}/s.yaml --workers all", "--workers", "expected an integer >= 1",
         s__yaml=study()),
    case("scheduler-unreachable", "whatif", "{tmp}/s.yaml --scheduler tcp://127.0.0.1:9", "--scheduler",
         "no Dask scheduler answers", "expected", s__yaml=study()),
    case("scheduler-garbage", "whatif", "{tmp}/s.yaml --scheduler nowhere", "--scheduler", "expected a Dask scheduler",
         s__yaml=study()),
    case("out-is-file", "whatif", "{tmp}/s.yaml --out {tmp}/taken", "--out", "is a file", s__yaml=study(), taken="x"),
]

SEARCH = [
    case("sharding-on-gpt", "search", f"sharding {GPT_FILE}", "model.kind", "needs a DLRM"),
    case("parallelism-on-dlrm", "search", f"parallelism {DLRM_FILE}", "model.kind", "needs a Transformer"),
    case("space-bogus", "search", f"layout {GPT_FILE}", "invalid choice: 'layout'"),
    case("tp-zero", "search", f"parallelism {GPT_FILE} --tp 0", "--tp", "expected a comma list of integers >= 1"),
    case("tp-zero-in-list", "search", f"parallelism {GPT_FILE} --tp 1,0", "--tp", "integers >= 1"),
    case("tp-word", "search", f"parallelism {GPT_FILE} --tp two", "--tp", "integers >= 1"),
    case("tp-empty-item", "search", f"parallelism {GPT_FILE} --tp 1,,2", "--tp", "integers >= 1"),
    case("pp-zero", "search", f"parallelism {GPT_FILE} --pp 0", "--pp", "integers >= 1"),
    case("micro-batch-zero", "search", f"parallelism {GPT_FILE} --micro-batch 0", "--micro-batch", "integers >= 1"),
    case("recompute-bogus", "search", f"parallelism {GPT_FILE} --recompute some", "--recompute",
         "expected a comma list"),
    case("zero-five", "search", f"parallelism {GPT_FILE} --zero 5", "--zero", "expected ZeRO stages among 0, 1, 2, 3"),
    case("zero-negative", "search", f"parallelism {GPT_FILE} --zero -1", "--zero", "integers >= 0"),
    case("workers-zero", "search", f"parallelism {GPT_FILE} --workers 0", "--workers", "expected an integer >= 1"),
    case("top-negative", "search", f"parallelism {GPT_FILE} --top -1", "--top", "expected an integer >= 0"),
    case("none-fills-world", "search", f"parallelism {GPT_FILE} --tp 3", "gpt_2x_dgx_h100.yaml",
         "none of 0 candidates", "expected other --tp"),
    case("none-passes", "search", f"parallelism {GPT_FILE} --micro-batch 3 --recompute none", "gpt_2x_dgx_h100.yaml",
         "none of", "not a multiple of micro_batch x dp", "expected other"),
    case("workload-missing", "search", "parallelism {tmp}/none.yaml", "none.yaml", "not found"),
    case("workload-folder", "search", "parallelism {tmp}/wdir", "wdir", "is a folder", wdir=None),
    case("workload-latin1", "search", "parallelism {tmp}/w.yaml", "w.yaml", "not UTF-8",
         w__yaml=("# \xe9\n" + GPT_TEXT).encode("latin-1")),
    case("workload-typo", "search", "parallelism {tmp}/w.yaml", "model.hiddn", "did you mean 'hidden'?",
         w__yaml=GPT_TEXT.replace("hidden:", "hiddn:")),
    case("set-unknown", "search", f"parallelism {GPT_FILE} --set model.nope=1", "model.nope: unknown key"),
    case("set-bool", "search", f"parallelism {GPT_FILE} --set nodes=true", "nodes: expected a number"),
    case("out-is-file", "search", f"parallelism {GPT_FILE} --out {{tmp}}/taken", "--out", "is a file", taken="x"),
    case("stages-no-pipeline", "search", f"stages {GPT_FILE}", "parallelism.pp", "expected parallelism.pp >= 2"),
    case("stages-on-dlrm", "search", f"stages {DLRM_FILE}", "model.kind", "Transformer"),
    case("stages-interleaved", "search", f"stages {GPT_FILE} --set parallelism.pp=2 --set parallelism.dp=null "
         "--set parallelism.pp_schedule=interleaved --set parallelism.virtual_stages=2 "
         "--set training.grad_accumulation=2", "parallelism.virtual_stages", "expected virtual_stages: 1"),
]

LOG = "{tmp}/ar.log --platform dgx_h100"
CALIBRATE = [
    case("wrong-op-gather", "calibrate", f"{LOG} --op all_gather", "ar.log", "--op", "expected --op all_reduce",
         ar__log=nccl_log()),
    case("wrong-op-broadcast", "calibrate", f"{LOG} --op broadcast", "ar.log", "--op", "expected --op all_reduce",
         ar__log=nccl_log()),
    case("wrong-op-reduce", "calibrate", f"{LOG} --op reduce", "--op", "expected --op all_reduce", ar__log=nccl_log()),
    case("wrong-op-for-gather-log", "calibrate", f"{LOG} --op all_reduce", "--op", "expected --op all_gather",
         ar__log=nccl_log(redop="none")),
    case("wrong-op-for-broadcast-log", "calibrate", f"{LOG} --op all_gather", "--op", "expected --op broadcast",
         ar__log=nccl_log(redop="none", root=0)),
    case("out-folder", "calibrate", f"{LOG} --out {{tmp}}/odir", "--out", "is a folder", "expected a file",
         ar__log=nccl_log(), odir=None),
    case("out-missing-folder", "calibrate", f"{LOG} --out {{tmp}}/no/p.yaml", "--out", "does not exist",
         ar__log=nccl_log()),
    case("too-few-rows", "calibrate", LOG, "ar.log", "expected at least 3 nccl-tests data rows",
         ar__log=nccl_log(rows=2)),
    case("empty-log", "calibrate", LOG, "ar.log", "expected at least 3", ar__log=""),
    case("not-a-log", "calibrate", LOG, "ar.log", "expected at least 3", ar__log="hello\nworld\n"),
    case("log-latin1", "calibrate", LOG, "ar.log", "not UTF-8", ar__log=("# \xe9\n" + nccl_log()).encode("latin-1")),
    case("log-utf16", "calibrate", LOG, "ar.log", "UTF-16", ar__log=nccl_log().encode("utf-16")),
    case("log-folder", "calibrate", "{tmp}/ldir --platform dgx_h100", "ldir", "is a folder", ldir=None),
    case("log-missing", "calibrate", "{tmp}/none.log --platform dgx_h100", "none.log", "not found"),
    case("nodes-zero", "calibrate", f"{LOG} --nodes 0", "--nodes", "expected an integer >= 1", ar__log=nccl_log()),
    case("gpn-zero", "calibrate", f"{LOG} --gpus-per-node 0", "--gpus-per-node", "expected an integer >= 1",
         ar__log=nccl_log()),
    case("gpn-nine", "calibrate", f"{LOG} --gpus-per-node 9", "--gpus-per-node", "1..8", ar__log=nccl_log()),
    case("platform-unknown", "calibrate", "{tmp}/ar.log --platform dgx_z100", "dgx_z100", "not found",
         ar__log=nccl_log()),
    case("alias-bomb-platform", "calibrate", "{tmp}/ar.log --platform {tmp}/p.yaml", "p.yaml", "aliases expand",
         ar__log=nccl_log(), p__yaml=LAUGHS),
    case("all-sizes-zero", "calibrate", LOG, "ar.log", "0 distinct size(s) above 0", "8 left out: line 3 of size 0",
         "expected at least 3", ar__log=nccl_log(size=0)),
    case("one-size", "calibrate", LOG, "ar.log", "1 distinct size(s) above 0 in 8 data row(s)", "distinct sizes > 0",
         ar__log=nccl_log(size=4096)),
    case("mixed-ops", "calibrate", LOG, "ar.log", "line 13 is a row of all_gather or all_to_all",
         "but line 3 one of all_reduce", "expected the rows of one collective",
         ar__log=nccl_log() + nccl_log(redop="none")),
    case("cut-rows-only", "calibrate", LOG, "ar.log", "2 left out: line 3 cut short (6 of 13 columns)",
         "expected at least 3", ar__log="\n".join(r[:60] for r in nccl_log(rows=4).splitlines()[:4])),
    case("set-platform-prefix", "calibrate", f"{LOG} --set platform.network.latency_us=5",
         "platform.network.latency_us", "expected network.latency_us=...", ar__log=nccl_log()),
    case("set-unknown", "calibrate", f"{LOG} --set network.nics=2", "network.nics: unknown key", ar__log=nccl_log()),
    case("set-inf", "calibrate", f"{LOG} --set network.latency_us=.inf", "network.latency_us", "finite",
         ar__log=nccl_log()),
    case("op-bogus", "calibrate", f"{LOG} --op gather", "--op", "expected --op one of", ar__log=nccl_log()),
]

FIT = [
    case("platform-unknown", "fit", "--platform dgx_z100", "dgx_z100", "not found", "expected"),
    case("platform-folder", "fit", "--platform {tmp}/pdir/", "pdir", "is a folder", "expected", pdir=None),
    case("threads-zero", "fit", "--platform cpu_host --threads 0", "--threads", "expected --threads >= 1"),
    case("time-column", "fit", "--platform cpu_host --time-column mean", "--time-column", "expected one of median_s"),
    case("neusight-missing", "fit", "--neusight {tmp}/none", "none", "no NeuSight test set", "expected"),
    case("families-unknown", "fit", "--neusight {tmp} --families conv", "--families", "unknown family conv"),
]

def cluster(**extra: Any) -> str:
    """A cluster file of two GPT jobs (the workload beside it as g.yaml) on four DGX H100 nodes."""
    data = {"name": "c", "platform": "dgx_h100", "nodes": 4,
            "jobs": [{"name": "a", "workload": "g.yaml", "nodes": 2}, {"name": "b", "workload": "g.yaml", "nodes": 2}]}
    return yaml.safe_dump(data | extra, sort_keys=False)


C = "{tmp}/c.yaml"
CLUSTER = [
    case("unknown-key", "cluster", C, "c.yaml", "nodez", "unknown key", c__yaml=cluster(nodez=4), g__yaml=GPT_TEXT),
    case("unknown-job-key", "cluster", C, "jobs.0.gpus", "unknown key", g__yaml=GPT_TEXT,
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "gpus": 16}])),
    case("too-many-nodes", "cluster", C, "c.yaml", "jobs.0.nodes", "placed on 8 nodes but the cluster has 4",
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "nodes": 8}]), g__yaml=GPT_TEXT),
    case("not-enough-free", "cluster", C, "c.yaml", "jobs.1.nodes", "only 1 of the cluster's 3 are free",
         c__yaml=cluster(nodes=3), g__yaml=GPT_TEXT),
    case("overlap", "cluster", C, "c.yaml", "jobs.1.nodes", "node 1 is given twice", "(job 'a' has it too)",
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "nodes": [0, 1]},
                               {"name": "b", "workload": "g.yaml", "nodes": [1, 2]}]), g__yaml=GPT_TEXT),
    case("node-out-of-range", "cluster", C, "c.yaml", "jobs.0.nodes", "node 7 is not in the cluster",
         "expected node ids 0 to 3", c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "nodes": [0, 7]}]),
         g__yaml=GPT_TEXT),
    case("node-negative", "cluster", C, "c.yaml", "jobs.0.nodes", g__yaml=GPT_TEXT,
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "nodes": [-1, 0]}])),
    case("other-platform", "cluster", C, "c.yaml", "jobs.0.workload", "runs on platform 'dgx_a100'",
         "expected a workload on the cluster's platform", c__yaml=cluster(), g__yaml=gpt(platform="dgx_a100")),
    case("workload-missing", "cluster", C, "c.yaml", "jobs.0.workload", "not found", c__yaml=cluster()),
    case("duplicate-job", "cluster", C, "c.yaml", "jobs.1.name", "used twice", g__yaml=GPT_TEXT,
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "nodes": 1},
                               {"name": "a", "workload": "g.yaml", "nodes": 1}])),
    case("dp-does-not-fit", "cluster", C, "g.yaml", "parallelism.dp", "as job 'a'", "on 1 nodes",
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "nodes": 1}]), g__yaml=GPT_TEXT),
    case("set-nodes", "cluster", C, "c.yaml", "jobs.0.set.nodes", "the cluster's to give", g__yaml=GPT_TEXT,
         c__yaml=cluster(jobs=[{"name": "a", "workload": "g.yaml", "set": {"nodes": 2}}])),
    case("placement-unknown", "cluster", C, "c.yaml", "placement", "packed", c__yaml=cluster(placement="tight"),
         g__yaml=GPT_TEXT),
    case("platform-set-bad", "cluster", C, "c.yaml", "platform_set", "oversubscription", g__yaml=GPT_TEXT,
         c__yaml=cluster(platform_set={"network.oversubscription": 0.5})),
    case("no-jobs", "cluster", C, "c.yaml", "jobs", c__yaml=cluster(jobs=[])),
    case("run-a-cluster", "run", C, "c.yaml", "is a cluster file", "simgpu cluster", c__yaml=cluster(),
         g__yaml=GPT_TEXT),
]

CONSOLE = [
    case("verb-unknown", "simgpu", "simulate x.yaml", "unknown command 'simulate'", "expected one of: run"),
    case("verb-run-bad", "simgpu", f"run {GPT_FILE} --set nodes=true", "nodes: expected a number"),
    case("verb-comm-bad", "simgpu", "comm --platform dgx_h100 --sizes 0", "--sizes"),
    case("verb-search-bad", "simgpu", f"search parallelism {GPT_FILE} --tp 0", "--tp"),
    case("verb-calibrate-bad", "simgpu", "calibrate {tmp}/none.log --platform dgx_h100", "none.log", "not found"),
    case("verb-whatif-bad", "simgpu", "whatif {tmp}/none.yaml", "none.yaml", "not found"),
    case("verb-replay-bad", "simgpu", "replay {tmp}/t.json --world 0", "--world", t__json=trace_json()),
    case("validate-only-bogus", "simgpu", "validate --only nope", "--only", "unknown suite 'nope'"),
    case("validate-unknown-option", "simgpu", "validate --fast", "unrecognized arguments: --fast"),
    case("speed-no-case", "simgpu", "speed -k nonexistent --profile", "-k", "no case matches", "expected"),
    case("speed-unknown-option", "simgpu", "speed --fast", "unrecognized arguments: --fast"),
    case("fit-threads-word", "simgpu", "fit --platform cpu_host --threads x", "--threads", "expected an integer"),
    case("fit-nothing-to-fit", "simgpu", "fit", "one of the arguments --platform --all", "is required"),
    case("fit-leave-out-unknown", "simgpu", "fit --gpu-leave-out dgx_h100,nope", "--gpu-leave-out",
         "not a measured platform: nope", "expected one of: dgx_a100"),
    case("fit-leave-out-cpu", "simgpu", "fit --gpu-leave-out cpu_host", "--gpu-leave-out", "not a measured platform"),
    case("bench-device", "simgpu", "bench --device gpu --out {tmp}/b", "--device", "invalid choice: 'gpu'"),
]

LLAMA_FILE = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
SERVING_LLM = ROOT / "workloads" / "serving" / "llama2_70b_dgx_h100_azure_conv.yaml"
SERVING_DLRM = ROOT / "workloads" / "serving" / "dlrm_dcnv2_dgx_a100.yaml"
STUDY_FILE = ROOT / "workloads" / "studies" / "faster_nic.yaml"


def serving(**changes: Any) -> str:
    """A serving file of 20 fixed requests on the shipped Llama-2-70B deployment, with dotted changes."""
    data: dict[str, Any] = {"name": "t", "deployment": {"workload": str(LLAMA_FILE)},
                            "requests": {"kind": "fixed", "count": 20, "prompt_tokens": 200, "output_tokens": 20}}
    return yaml.safe_dump(edit_keys(data, changes, sep="__"), sort_keys=False)


S = "{tmp}/s.yaml"
def azure_trace(*rows: str) -> str:
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(r + "\n" for r in rows)


GOOD_ROW = "2023-11-16 18:15:46.6805900,374,44"
SERVE = [
    case("output-tokens-zero", "serve", S, "s.yaml", "requests.output_tokens", "expected a token count >= 1",
         s__yaml=serving(requests__output_tokens=0)),
    case("prompt-tokens-zero", "serve", S, "s.yaml", "requests.prompt_tokens", "got 0",
         s__yaml=serving(requests__prompt_tokens=0)),
    case("output-tokens-negative-set", "serve", f"{S} --set requests.output_tokens=-3", "requests.output_tokens",
         "got -3", s__yaml=serving()),
    case("trace-output-zero", "serve", S, "t.csv", "requests.file", "row 3: GeneratedTokens '0'",
         "expected a token count >= 1",
         s__yaml=serving(requests={"kind": "trace", "file": "t.csv"}),
         t__csv=azure_trace(GOOD_ROW, "2023-11-16 18:15:50,100,0")),
    case("trace-bad-timestamp", "serve", S, "t.csv", "row 3: TIMESTAMP 'noon'", "expected a date and time",
         s__yaml=serving(requests={"kind": "trace", "file": "t.csv"}), t__csv=azure_trace(GOOD_ROW, "noon,100,3")),
    case("trace-prompt-word", "serve", S, "t.csv", "row 2: ContextTokens 'many'", "expected a token count",
         s__yaml=serving(requests={"kind": "trace", "file": "t.csv"}), t__csv=azure_trace("2023-11-16,many,3")),
    case("count-huge", "serve", S, "s.yaml", "requests.count", "100,000,000 requests", "expected at most",
         s__yaml=serving(requests__count=100_000_000)),
    case("count-huge-set", "serve", f"{S} --set requests.count=1e9", "s.yaml", "requests.count",
         "expected at most", s__yaml=serving()),
    case("dlrm-queries-huge", "serve", f"{SERVING_DLRM} --set queries.count=100000000", "queries.count",
         "100,000,000 requests", "expected at most"),
    case("alias-bomb", "serve", S, "s.yaml", "aliases expand", "expected at most", s__yaml=LAUGHS),
    case("silicon-rows-missing-column", "validate-silicon-serving", "--rows {tmp}/r.csv", "--rows", "r.csv",
         "no column 'concurrency'", "expected the serving sample's columns", r__csv="id,model_path\n1,x\n"),
    case("silicon-rows-missing-file", "validate-silicon-serving", "--rows {tmp}/none.csv", "--rows", "none.csv",
         "no such file", "expected a CSV"),
    case("silicon-rows-binary", "validate-silicon-serving", "--rows {tmp}/r.csv", "--rows", "r.csv", "expected",
         r__csv=b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00\x01"),
    case("alias-bomb-deployment", "serve", S, "w.yaml", "aliases expand",
         s__yaml=serving(deployment__workload="w.yaml"),
         w__yaml=LAUGHS),
]

CASES = [c for group, prefix in ((RUN, "run"), (COMM, "comm"), (REPLAY, "replay"), (WHATIF, "whatif"),
                                  (SEARCH, "search"), (CALIBRATE, "calibrate"), (FIT, "fit"), (CONSOLE, "simgpu"),
                                  (SERVE, "serve"), (CLUSTER, "cluster"))
         for c in [Case(f"{prefix}-{x.id}", x.command, x.argv, x.expect, x.files) for x in group]]


def test_the_corpus_is_large_and_named_uniquely() -> None:
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.command for c in CASES} >= {"run", "whatif", "comm", "replay", "search", "calibrate", "fit"}


#: Words by which every error says what was expected.
EXPECTATIONS = ("expected", "choose from", "must", "needs", "give ")
#: Cases whose message says it in other words ("NeuSight measured: bmm, ..." lists the valid families).
OTHER_WORDS = {"fit-families-unknown"}


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.filterwarnings("error")  # a warning printed before the error line is a second line
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line(c: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # a default output folder would be made here
    for name, content in c.files.items():
        path = tmp_path / name
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    before = _listing(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in c.argv]
    code = importlib.import_module(COMMANDS[c.command]).main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("error: "), err
    assert out == "", out
    for words in c.expect:
        assert words in err, f"{words!r} not in {err!r}"
    assert c.id in OTHER_WORDS or any(w in err for w in EXPECTATIONS), f"what was expected? {err!r}"
    assert _listing(tmp_path) == before, "something was written"



#: Every command's every output option, the path to refuse written {bad}.
OUTPUTS = [
    ("run", [str(GPT_FILE), "--out", "{bad}/out"]),
    ("run", [str(GPT_FILE), "--out", "{bad}"]),
    ("comm", ["--platform", "dgx_h100", "--csv", "{bad}/x.csv"]),
    ("calibrate", ["{tmp}/ar.log", "--platform", "dgx_h100", "--out", "{bad}/p.yaml"]),
    ("serve", [str(SERVING_LLM), "--out", "{bad}/out"]),
    ("serve", [str(SERVING_DLRM), "--out", "{bad}/out"]),
    ("whatif", [str(STUDY_FILE), "--out", "{bad}/out"]),
    ("search", ["parallelism", str(GPT_FILE), "--out", "{bad}/out"]),
    ("replay", ["{tmp}/t.json", "--out", "{bad}/out"]),
    ("fit", ["--platform", "cpu_host", "--csv", "{bad}/rows.csv"]),
    ("simgpu", ["bench", "--device", "cpu", "--out", "{bad}/out"]),
    ("simgpu", ["validate", "--report", "{bad}/accuracy", "--only", "dlrm-pytorch"]),
    ("simgpu", ["speed", "--report", "{bad}/speed.md", "--no-cases"]),
    ("validate-dlrm", ["--csv", "{bad}/rows.csv"]),
    ("validate-sharding", ["--figure", "{bad}/ranking.png"]),
    ("simgpu", ["speed", "--plot", "{bad}/scaling.png", "--no-cases"]),
    ("simgpu", ["goodput", str(ROOT / "workloads" / "goodput" / "llama3_405b_16k_h100.yaml"), "--out", "{bad}/out"]),
]


@pytest.fixture(params=["read-only", "proc"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A folder nothing can be written into: a read-only one (not for root, who may write anywhere) or
    /proc (for everyone)."""
    if request.param == "proc":
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc")
        yield Path("/proc")
        return
    if not hasattr(os, "geteuid") or os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    yield ro
    ro.chmod(0o700)


@pytest.mark.parametrize("command, argv", OUTPUTS, ids=[f"{c}{a[-2]}-{i}" for i, (c, a) in enumerate(OUTPUTS)])
def test_an_unwritable_output_is_refused_before_any_work(command: str, argv: list[str], tmp_path: Path,
                                                         unwritable: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ar.log").write_text(nccl_log())
    (tmp_path / "t.json").write_text(trace_json())
    before = set(unwritable.iterdir()) if unwritable != Path("/proc") else set()
    code = importlib.import_module(COMMANDS[command]).main(
        [a.replace("{bad}", str(unwritable)).replace("{tmp}", str(tmp_path)) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert "not writable" in err or "cannot write" in err, err
    assert "expected" in err and out == ""
    if unwritable != Path("/proc"):
        assert set(unwritable.iterdir()) == before


def test_calibrate_says_in_one_line_what_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log cut in the middle of its last row is fitted on the whole rows, and the output says so."""
    log = tmp_path / "ar.log"
    log.write_text(nccl_log(rows=6)[:-40])
    assert importlib.import_module(COMMANDS["calibrate"]).main([str(log), "--platform", "dgx_h100"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == ["note: left out 1 row(s) of the log: line 8 cut short (8 of 13 columns)"], out
    assert out.startswith("5 sizes, all_reduce")

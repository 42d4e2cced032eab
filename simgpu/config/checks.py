"""Cross-field rules of a job, checked in one place before anything runs.

Single-key rules live on the spec models; rules that tie the workload to the platform (world size,
parallel degrees, dtypes the GPU supports, memory fit) live here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..precision import gemm_path, why_no_path
from .dlrm import DLRMModel
from .sharding import EmbeddingSharding
from .transformer import TransformerModel
from .workload import WorkloadSpec

if TYPE_CHECKING:
    from ..graph import Workload
    from .loader import Job
    from .platform import PlatformSpec


def gpus_per_node(job: Job) -> int:
    return job.workload.gpus_per_node or job.platform.node.gpus


def world_size(job: Job) -> int:
    return job.workload.nodes * gpus_per_node(job)


def check_job(job: Job) -> None:
    """Rules that need both files; raises ConfigError naming the workload key at fault."""
    w, p, f = job.workload, job.platform, job.workload_file
    if w.gpus_per_node is not None and w.gpus_per_node > p.node.gpus:
        raise ConfigError(f"{w.gpus_per_node} GPUs per node requested but a {p.name} node has "
                          f"{p.node.gpus}; expected at most {p.node.gpus}", file=f, key="gpus_per_node")
    check_world(w.nodes, gpus_per_node(job), file=f)
    check_parallelism(w, w.nodes, gpus_per_node(job), file=f)
    if w.training is not None and w.precision not in p.gpu.peak_tflops:
        raise ConfigError(
            f"{w.precision} is not supported by {p.gpu.name} on platform {p.name}; "
            f"expected one of: {', '.join(p.gpu.peak_tflops)}", file=f, key="training.precision")
    if w.inference is not None:
        for key, prec in (("precision", w.inference.precision), ("moe_precision", w.inference.moe_precision)):
            if prec is not None and gemm_path(prec, p.gpu.peak_tflops) is None:
                raise ConfigError(f"{why_no_path(prec, p.gpu.name, p.gpu.peak_tflops)} (platform {p.name})", file=f,
                                  key=f"inference.{key}")
    if isinstance(w.model, DLRMModel):
        check_dlrm(w, w.nodes, gpus_per_node(job), file=f)
    check_transformer(w, world_size(job), file=f)
    check_variability(job)
    check_size(job)


def check_variability(job: Job) -> None:
    """The ``variability`` section against the job: the slow ranks and nodes exist, the speeds CSV
    reads and names ranks that exist."""
    from .variability import read_speeds, speeds_path

    v, f = job.workload.variability, job.workload_file
    if v is None:
        return
    nodes, gpn = job.workload.nodes, gpus_per_node(job)
    world = nodes * gpn
    for i, s in enumerate(v.slow):
        bad = [r for r in s.ranks or () if r >= world]
        if bad:
            raise ConfigError(f"ranks {bad} do not exist; expected ranks below {world} ({nodes} node(s) x {gpn} GPUs)",
                              file=f, key=f"variability.slow.{i}.ranks")
        bad = [n for n in s.nodes or () if n >= nodes]
        if bad:
            raise ConfigError(f"nodes {bad} do not exist; expected nodes below {nodes}", file=f,
                              key=f"variability.slow.{i}.nodes")
    if v.speeds_csv is not None:
        path = speeds_path(f, v.speeds_csv)
        try:
            speeds = read_speeds(path)
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror or e}; expected a CSV with columns rank and factor",
                              file=f, key="variability.speeds_csv") from None
        except ValueError as e:
            raise ConfigError(str(e), file=f, key="variability.speeds_csv") from None
        bad = sorted(r for r in speeds if r >= world)
        if bad:
            raise ConfigError(f"{path.name}: ranks {bad[:8]} do not exist; expected ranks below {world}", file=f,
                              key="variability.speeds_csv")
        v._speeds = speeds  # the job carries its rows: a Dask worker reads no file beside the workload


def check_dlrm(spec: WorkloadSpec, nodes: int, gpus_per_node: int, file: str | None = None) -> None:
    """DLRM rules that need the world: every table the sharding plan names exists, its ranks and
    node exist, a column-wise table has no more shards than GPUs or columns, and a hybrid table
    has a distribution to split by (or its frequent rows given, no more than its rows)."""
    model = spec.model
    if not isinstance(model, DLRMModel):
        return
    world = nodes * gpus_per_node
    count = model.table_count
    dims = [t.dim or model.embedding_dim for t in model.tables for _ in range(t.count)]
    if model.generate is not None:  # generated dims are drawn later; the narrowest may be drawn
        dims += [min(model.generate.dims or [model.embedding_dim])] * model.generate.count
    cfg = spec.parallelism.sharding
    if cfg.planner == "table_row_wise_large" and nodes < 2:
        raise ConfigError("the table_row_wise_large plan needs 2 or more nodes; expected another planner",
                          file=file, key="parallelism.sharding.planner")
    _check_hybrid(model, cfg, file)
    for i, ts in sorted(cfg.tables.items()):
        key = f"parallelism.sharding.tables.{i}"
        if i >= count:
            raise ConfigError(f"table {i} does not exist; expected an index below {count}, the number of "
                              f"tables (count expanded, generated ones last)", file=file, key=key)
        bad = [r for r in ts.ranks or () if r >= world]
        if bad:
            raise ConfigError(f"ranks {bad} do not exist; expected ranks below {world} ({nodes} node(s) x "
                              f"{gpus_per_node} GPUs)", file=file, key=f"{key}.ranks")
        if ts.node is not None and ts.node >= nodes:
            raise ConfigError(f"node {ts.node} does not exist; expected a node below {nodes}", file=file,
                              key=f"{key}.node")
        shards = len(ts.ranks) if ts.ranks is not None and ts.type == "column_wise" else ts.shards
        if shards is not None and shards > world:
            raise ConfigError(f"{shards} column shards on {world} GPUs; expected at most one per GPU",
                              file=file, key=f"{key}.shards")
        if shards is not None and shards > dims[i]:
            raise ConfigError(f"{shards} column shards of a table of {dims[i]} columns; expected at most "
                              f"{dims[i]}", file=file, key=f"{key}.{'ranks' if ts.ranks else 'shards'}")


def _check_hybrid(model: DLRMModel, cfg: EmbeddingSharding, file: str | None) -> None:
    """Hybrid tables split their rows by their id distribution: one must be given (a zipf one, or an
    explicit uniform one) unless ``frequent_rows`` says how many rows are frequent."""
    # per table index (count expanded, generated last): its rows, whether its distribution was
    # given, whether it is skewed, and the key that describes it
    source: list[tuple[int, bool, bool, str]] = []
    for j, t in enumerate(model.tables):
        given = "distribution" in t.model_fields_set
        source += [(t.rows, given, t.distribution.kind == "zipf", f"model.tables.{j}.distribution")] * t.count
    g = model.generate
    if g is not None:
        given = "distribution" in g.model_fields_set
        source += [(g.rows[1], given, g.distribution.kind == "zipf", "model.generate.distribution")] * g.count
    if cfg.planner == "hybrid_skewed" and not any(skewed for _, _, skewed, _ in source):
        raise ConfigError("the hybrid_skewed plan needs a table with a skewed id distribution; expected "
                          "distribution: {kind: zipf, alpha: ...} on a table, or another planner",
                          file=file, key="parallelism.sharding.planner")
    if cfg.planner is not None:
        return
    for i, (rows, given, _, where) in enumerate(source):
        ts = cfg.tables.get(i)
        if (ts.type if ts is not None else cfg.default) != "hybrid":
            continue
        key = f"parallelism.sharding.tables.{i}" if ts is not None else "parallelism.sharding.default"
        frequent = ts.frequent_rows if ts is not None else None
        if frequent is not None and frequent > rows:
            raise ConfigError(f"{frequent} frequent rows of a table of {rows} rows; expected at most {rows}",
                              file=file, key=f"parallelism.sharding.tables.{i}.frequent_rows")
        if frequent is None and not given:
            raise ConfigError(
                f"table {i} is hybrid but {where} is not given: its frequent rows follow its id distribution; "
                f"expected {where}: {{kind: zipf, alpha: ...}} (or kind: uniform, said explicitly) or "
                f"parallelism.sharding.tables.{i}.frequent_rows", file=file, key=key)


def check_parallelism(spec: WorkloadSpec, nodes: int, gpus_per_node: int, file: str | None = None) -> None:
    """The parallel degrees fill the world exactly: tp * pp * cp * dp GPUs (dp defaults to the rest);
    model parallelism (tp, pp, cp, ep, sp, ZeRO) is for Transformer models only."""
    par = spec.parallelism
    world = nodes * gpus_per_node
    mp = par.tp * par.pp * par.cp
    where = f"{nodes} node(s) x {gpus_per_node} GPUs = {world}"
    if not isinstance(spec.model, TransformerModel):
        for key, value, plain in (("tp", par.tp, 1), ("pp", par.pp, 1), ("cp", par.cp, 1), ("ep", par.ep, 1),
                                  ("sp", par.sp, False), ("zero", par.zero_stage, 0),
                                  ("stage_layers", par.stage_layers, None)):
            if value != plain:
                raise ConfigError(f"{key}={value} applies to transformer models; a {spec.model.kind} model "
                                  f"expected {plain}", file=file, key=f"parallelism.{key}")
    if world % mp:
        raise ConfigError(f"tp*pp*cp = {par.tp}*{par.pp}*{par.cp} = {mp} does not divide the world size: {where}; "
                          f"expected a divisor of {world}",
                          file=file, key="parallelism.tp" if par.tp > 1 else "parallelism.pp" if par.pp > 1
                          else "parallelism.cp")
    if par.dp is not None and par.dp * mp != world:
        split = f" / (tp*pp*cp = {mp})" if mp > 1 else ""
        raise ConfigError(f"dp={par.dp} does not match the world size: {where}{split} (expected dp={world // mp})",
                          file=file, key="parallelism.dp")


def check_transformer(spec: WorkloadSpec, world: int, file: str | None = None) -> None:
    """Rules a Transformer's parallelism must meet (degrees already fill the world): every split
    divides what it splits, the schedule fits the pipeline, and the batch divides into micro-batches."""
    md, par, tr = spec.model, spec.parallelism, spec.training
    if not isinstance(md, TransformerModel):
        return

    def fail(key: str, msg: str) -> None:
        raise ConfigError(msg, file=file, key=key)

    tp, pp, cp, ep, v = par.tp, par.pp, par.cp, par.ep, par.virtual_stages
    dp = par.dp or world // (tp * pp * cp)
    if md.heads % tp:
        fail("model.heads", f"{md.heads} heads do not split over tp={tp}; expected a multiple of tp")
    served = tr is None
    if md.mla is None and md.kv_heads_n % tp and not (served and tp % md.kv_heads_n == 0):
        # a serving engine replicates KV heads over the ranks beyond them (vLLM's, TensorRT-LLM's GQA)
        fail("model.kv_heads", f"{md.kv_heads_n} key/value heads do not split over tp={tp}; expected a multiple of tp"
                               + (" or a divisor of it" if served else ""))
    la = md.linear_attention
    if la is not None and (la.key_heads % tp or la.value_heads % tp):
        fail("model.linear_attention", f"linear attention's {la.key_heads} key and {la.value_heads} value heads do "
                                       f"not split over tp={tp}; expected multiples of tp")
    if md.ffn % tp:
        fail("model.ffn_hidden", f"MLP width {md.ffn} does not split over tp={tp}; expected a multiple of tp")
    if par.stage_layers is not None:
        check_stage_layers(par.stage_layers, md.layers, pp, v, par.account_for_embedding_and_loss, file)
    elif par.account_for_embedding_and_loss:
        if (md.layers + 2) % (pp * v) or (md.layers + 2) // (pp * v) < 2:
            fail("model.layers", f"{md.layers} layers with the embedding and the loss do not divide into "
                                 f"pp*virtual_stages = {pp}*{v} chunks of 2 or more; expected layers + 2 a multiple "
                                 f"of {pp * v}")
    elif md.layers % (pp * v):
        fail("model.layers", f"{md.layers} layers do not divide into pp*virtual_stages = {pp}*{v} equal chunks; "
                             f"expected a multiple of {pp * v}"
                             + ("" if (md.layers + 2) % (pp * v) else
                                " (or parallelism.account_for_embedding_and_loss: true, Megatron's split)"))
    if v > 1 and par.pp_schedule != "interleaved":
        fail("parallelism.virtual_stages", f"virtual_stages={v} needs pp_schedule: interleaved")
    if par.pp_schedule == "interleaved" and (v < 2 or pp < 2):
        fail("parallelism.pp_schedule", f"the interleaved schedule needs pp >= 2 and virtual_stages >= 2, "
                                        f"got pp={pp}, virtual_stages={v}")
    if par.sp and tp < 2:
        fail("parallelism.sp", "sequence parallelism splits over tensor-parallel ranks; expected tp > 1")
    chunks = 2 * cp if cp > 1 and par.cp_comm == "ring" and md.causal else cp
    if md.seq_len % chunks:
        fail("model.seq_len", f"seq_len {md.seq_len} does not split into {chunks} chunks over cp={cp}")
    if par.sp and (md.seq_len // cp) % tp:
        fail("model.seq_len", f"seq_len/cp = {md.seq_len // cp} does not split over tp={tp} (sequence parallelism)")
    if cp > 1 and md.attention != "flash":
        fail("model.attention", "context parallelism runs flash attention; expected attention: flash")
    if ep > 1 and md.moe is None:
        fail("parallelism.ep", f"ep={ep} splits experts, but the model has none; expected ep: 1 or a model.moe section")
    split = [k for k in ("attention_dp", "moe_tp", "moe_ep") if getattr(par, k) is not None]
    if split and md.moe is None:
        fail(f"parallelism.{split[0]}", f"{split[0]} splits a served model's MoE layers, but the model has none; "
                                         "expected a model.moe section or no moe_tp / moe_ep / attention_dp")
    if md.moe is not None:
        _, moe_tp, moe_ep = par.serving_split if served else (0, tp, ep)
        if md.moe.experts % moe_ep:
            fail("model.moe.experts", f"{md.moe.experts} experts do not split over "
                                      f"{'moe_ep' if split else 'ep'}={moe_ep}; expected a divisor of the experts")
        if md.expert_ffn % moe_tp:
            fail("model.moe.expert_ffn_hidden", f"expert width {md.expert_ffn} does not split over "
                                                f"{'moe_tp' if split else 'tp'}={moe_tp}")
    if dp % ep:
        fail("parallelism.ep", f"ep={ep} must divide dp={dp} (experts are sharded over data-parallel ranks)")
    if tr is None and par.stage_layers is not None:
        fail("parallelism.stage_layers", "the pipeline split of a trained model's blocks; a served model's stages "
                                         "hold layers / pp blocks each; expected no stage_layers")
    if tr is None and par.account_for_embedding_and_loss:
        fail("parallelism.account_for_embedding_and_loss", "the pipeline split of a trained model's chunks; a served "
                                                           "model's stages hold layers / pp blocks each")
    if tr is None:  # served: no micro-batches, no schedule
        if pp > 1 and par.pp_schedule != "1f1b":
            fail("parallelism.pp_schedule", "a served model's stages run one iteration at a time; expected 1f1b")
        return
    if tr.global_batch is not None and tr.global_batch % (tr.batch_per_gpu * dp):
        fail("training.global_batch", f"global_batch {tr.global_batch} is not a multiple of micro_batch x dp = "
                                      f"{tr.batch_per_gpu} x {dp}; expected a multiple of {tr.batch_per_gpu * dp}")
    if par.pp_schedule == "interleaved":
        m = tr.global_batch // (tr.batch_per_gpu * dp) if tr.global_batch else tr.grad_accumulation or 1
        if m % pp:
            fail("training.global_batch" if tr.global_batch else "training.grad_accumulation",
                 f"the interleaved schedule needs micro-batches per iteration ({m}) divisible by pp={pp}")


def check_stage_layers(split: list[int], layers: int, pp: int, v: int, embedding_in_split: bool,
                       file: str | None = None) -> None:
    """``parallelism.stage_layers``: one entry per model chunk (pp x virtual_stages), each at least one
    block, summing to the model's layers."""
    def fail(msg: str) -> None:
        raise ConfigError(msg, file=file, key="parallelism.stage_layers")

    chunks = pp * v
    what = f"pp={pp} stages" if v == 1 else f"pp x virtual_stages = {pp} x {v} model chunks"
    if embedding_in_split:
        fail("gives each stage's blocks itself; expected it or parallelism.account_for_embedding_and_loss, not both")
    if len(split) != chunks:
        fail(f"{len(split)} entries for {what}; expected {chunks} entries, one per "
             + ("stage" if v == 1 else "chunk in model order"))
    low = [i for i, n in enumerate(split) if n < 1]
    if low:
        fail(f"entry {low[0]} is {split[low[0]]}; expected at least one block per "
             + ("stage" if v == 1 else "chunk"))
    if sum(split) != layers:
        fail(f"{' + '.join(map(str, split))} = {sum(split)} blocks, but model.layers is {layers}; expected entries "
             f"summing to {layers}")


def check_memory(job: Job, workload: Workload) -> None:
    """Reject a job whose busiest GPU needs more memory than the GPU has."""
    cap = job.platform.gpu.memory_gib * 2**30
    worst = max(range(len(workload.memory)), key=lambda r: workload.memory[r].total)
    need = workload.memory[worst]
    if need.total > cap:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in need.as_gib().items() if k != "total" and v >= 0.05)
        remedies = ("training.micro_batch, training.recompute, parallelism.zero, more tp / pp"
                    if isinstance(job.workload.model, TransformerModel) else "training.batch_per_gpu")
        raise ConfigError(
            f"does not fit in GPU memory: rank {worst} needs {need.total / 2**30:.1f} GiB ({parts} GiB) "
            f"but a {job.platform.gpu.name} has {job.platform.gpu.memory_gib:g} GiB; expected a smaller "
            f"model.* or {remedies}, or more GPUs", file=job.workload_file, key="model")


#: The largest job simulated: beyond it building the topology alone takes minutes (about 0.25 ms
#: and 2.3 KB per GPU) and no case has been validated.
MAX_GPUS = 65_536
#: Memory the simulation takes, at least, per GPU of the job (topology, routes, comm state), per op of
#: a simulated rank's program (the op, its records and events), and per pair of ranks of an
#: all-to-all (one flow each); measured on the shipped workloads, rounded down.
BYTES_PER_GPU, BYTES_PER_OP, BYTES_PER_FLOW = 12_000, 500, 100
#: Ops of one Transformer block's forward and backward for one micro-batch, at least.
OPS_PER_BLOCK = 30
#: Ops of a DLRM rank's program apart from its tables, at least.
OPS_PER_DLRM_RANK = 50


def available_memory() -> int:
    """Bytes of memory this machine can give a run (MemAvailable, else all physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            lines = f.read().splitlines()
        for line in lines:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**40


def _gib(n: float) -> str:
    return f"{n / 2**30:,.3g} GiB" if n < 2**70 else f"{n / 2**30:.2e} GiB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"


def check_world(nodes: int, gpus: int, *, file: str | None = None, key: str = "nodes",
                nodes_key: str | None = None) -> None:
    """Refuse a world of ``nodes`` x ``gpus`` GPUs larger than :data:`MAX_GPUS` or than memory allows,
    before anything is allocated; the message gives the estimate."""
    world = nodes * gpus
    need = world * BYTES_PER_GPU
    if world > MAX_GPUS or need > available_memory():
        raise ConfigError(
            f"{nodes:,} node(s) x {gpus} GPUs = {world:,} GPUs would take about {_gib(need)} of memory and "
            f"{_duration(world * 0.25e-3)} to build the topology alone; expected at most {MAX_GPUS:,} GPUs "
            f"({MAX_GPUS // max(gpus, 1):,} nodes of {gpus})", file=file, key=key)


#: Memory per network link of the topology (the link and its name), and seconds to make one; measured
#: on dragonflies of 30,000 and 200,000 links, rounded down.
BYTES_PER_LINK, SECONDS_PER_LINK = 250, 12e-6
#: The most links a topology may have: beyond it making the links alone takes tens of seconds.
MAX_LINKS = 1_000_000


def network_links(platform: PlatformSpec, nodes: int) -> int:
    """How many links the network of ``nodes`` nodes of ``platform`` will have, counted without building
    it (the dragonfly's; the other networks grow with the GPUs, which :func:`check_world` bounds)."""
    df = platform.network.dragonfly
    if platform.network.topology != "dragonfly" or df is None:
        return 0
    switches = -(-nodes // df.nodes_per_switch)
    groups = -(-switches // df.switches_per_group)
    in_group = df.switches_per_group if groups > 1 else switches
    if df.routing == "adaptive":
        return groups * in_group * 2 + groups * (groups - 1)
    return groups * in_group * (in_group - 1) + groups * (groups - 1) * df.global_links_per_group_pair


def check_network(platform: PlatformSpec, nodes: int, *, file: str | None = None) -> None:
    """Refuse a network whose links would take more memory or time than this machine has, before any
    is made; the message gives the estimate and the limit."""
    links = network_links(platform, nodes)
    need = links * BYTES_PER_LINK
    if links > MAX_LINKS or need > available_memory():
        df = platform.network.dragonfly
        assert df is not None
        big = max(("switches_per_group", df.switches_per_group),
                  ("global_links_per_group_pair", df.global_links_per_group_pair), key=lambda kv: kv[1])[0]
        raise ConfigError(
            f"{nodes:,} node(s) on this dragonfly make {links:,} links, about {_gib(need)} of memory and "
            f"{_duration(links * SECONDS_PER_LINK)} to build; expected at most {MAX_LINKS:,} links (a smaller {big})",
            file=file, key=f"network.dragonfly.{big}")


#: Memory a served request takes, at least (its arrays, its row of the request table, its events).
BYTES_PER_REQUEST = 1_000
#: The most requests (or queries) one serving run may simulate.
MAX_REQUESTS = 20_000_000


def check_requests(count: int, *, file: str | None = None, key: str = "requests.count",
                   line: int | None = None) -> None:
    """Refuse a serving run of ``count`` requests that memory cannot hold, before drawing any."""
    need = count * BYTES_PER_REQUEST
    have = available_memory()
    if count > MAX_REQUESTS or need > have:
        raise ConfigError(
            f"{count:,} requests would take about {_gib(need)} of memory (this machine has {_gib(have)} "
            f"available); expected at most {min(MAX_REQUESTS, have // BYTES_PER_REQUEST):,}", file=file, key=key,
            line=line)


def check_size(job: Job) -> None:
    """Refuse a job whose simulation would need more memory than this machine has, before building
    it: the estimate is a lower bound (ops of the representative ranks only), named by its
    largest factor."""
    w, f = job.workload, job.workload_file
    gpn = gpus_per_node(job)
    check_world(w.nodes, gpn, file=f)
    check_network(job.platform, w.nodes, file=job.platform_file)
    world = w.nodes * gpn
    md, tr, par = w.model, w.training, w.parallelism
    if tr is None:  # served: one forward of a replica's batch, a few ops per block
        return
    if isinstance(md, TransformerModel):
        dp = par.dp or max(world // (par.tp * par.pp * par.cp), 1)
        micro = (tr.global_batch // max(tr.batch_per_gpu * dp, 1) if tr.global_batch
                 else tr.grad_accumulation or 1)
        blocks = max(par.stage_layers) if par.stage_layers else -(-md.layers // par.pp)
        ops = OPS_PER_BLOCK * blocks * max(micro, 1) * par.pp  # one rank per stage, at least
        flows = 0
        factors = {"model.layers": blocks, "training.global_batch" if tr.global_batch else
                   "training.grad_accumulation": micro}
        what = f"{blocks:,} blocks per stage x {micro:,} micro-batches x {par.pp} stage(s)"
    elif isinstance(md, DLRMModel):
        ops = world * (OPS_PER_DLRM_RANK + md.table_count)
        flows = world * (world - 1)
        factors = {"model.tables": md.table_count, "nodes": world}
        what = f"{world:,} ranks x {md.table_count:,} tables, {flows:,} all-to-all flows"
    else:
        return
    need = world * BYTES_PER_GPU + ops * BYTES_PER_OP + flows * BYTES_PER_FLOW
    have = available_memory()
    if need > have:
        key = max(factors, key=lambda k: factors[k])
        raise ConfigError(
            f"simulating this job needs about {_gib(need)} of memory at least ({ops:,} ops: {what}) but this "
            f"machine has {_gib(have)} available; expected a smaller {key}", file=f, key=key)

"""Which rows of the measured serving sample simgpu can express, and why not the others.

``../shared/data/inference/aiconfigurator-silicon/silicon_sample.csv`` holds 3,931 measured serving
deployments (read its provenance.md): a model (its Hugging Face id, whose ``config.json`` lies in
``model_configs/``), a GPU system, a framework, a precision and each pool's parallelism. Each row is
written as the inference workload(s) of its pool(s) — the model from its config.json, the precision
from its GEMM and MoE quantisation modes, ``tp``, ``pp``, ``attention_dp``, ``moe_tp``, ``moe_ep``
— and resolved as a deployment on its platform: loaded, split, and its weights checked against the
GPU. Decode iterations replay CUDA graphs, as the three frameworks do by default (vLLM's captured
batch sizes, SGLang's ``cuda_graph_max_bs``, TensorRT-LLM's ``cuda_graph_config``). A row is
expressible when every pool resolves; otherwise the first refusal is its reason.
Scoring TTFT and TPOT against the measured figures is the serving validation's (``simgpu serve``
with a closed-loop load); this module only says what can be asked.

``python -m simgpu.validate.silicon`` prints the count per model and reason; ``--csv`` writes every
row's verdict.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..config.hf import adapt, expand, read_config
from ..config.loader import Job, load_platform, validate
from ..config.workload import WorkloadSpec
from ..errors import SimgpuError
from ..kernels.importers import data_root

#: The sample's folder, relative to the shared data folder.
SAMPLE = Path("inference/aiconfigurator-silicon")
#: The sample's systems -> simgpu's platforms.
PLATFORMS = {"h100_sxm": "dgx_h100", "h200_sxm": "dgx_h200", "b200_sxm": "dgx_b200", "gb200": "gb200_nvl72"}
#: The sample's frameworks -> the inference section's.
FRAMEWORKS = {"trtllm": "tensorrt_llm", "vllm": "vllm", "sglang": "sglang"}
#: Model ids whose config.json the sample's folder keeps under another id (the same architecture
#: facts: an instruct or quantised variant of the base checkpoint, or the model's new home).
CONFIG_OF = {
    "zhipuai/GLM-5": "zai-org/GLM-5",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
}
#: The sample's quantisation modes -> simgpu's precisions.
QUANT = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4", "w4a16_mxfp4": "w4a16", "mxfp4": "mxfp4",
         "bfloat16": "bf16", "float16": "fp16"}


def config_path(folder: Path, model: str) -> Path:
    """The config.json of model id ``model`` in the sample's ``model_configs``."""
    ref = CONFIG_OF.get(model, model)
    return folder / "model_configs" / f"{ref.replace('/', '--')}_config.json"


@cache
def _has_experts(path: Path) -> bool:
    try:
        return "moe" in adapt(read_config(path))[0]
    except SimgpuError:
        return False


def sample_int(v: Any, default: int = 1) -> int:
    """A size of the sample: empty or 0 (unset) is ``default``."""
    return default if v is None or (isinstance(v, float) and math.isnan(v)) or int(v) == 0 else int(v)


def _precisions(row: pd.Series) -> dict[str, str]:
    out: dict[str, str] = {}
    for col, key in (("gemm_quant_mode", "precision"), ("moe_quant_mode", "moe_precision")):
        mode = row.get(col)
        if isinstance(mode, str):
            if mode not in QUANT:
                raise SimgpuError(f"{col} {mode!r} has no precision in simgpu")
            out[key] = QUANT[mode]
    if "precision" not in out:
        prec = row.get("precision")
        out["precision"] = str(prec) if isinstance(prec, str) and prec in ("bf16", "fp16") else "bf16"
    return out


def pools(row: pd.Series) -> list[dict[str, int]]:
    """The row's pools' parallelism: one (aggregated) or a prefill and a decode pool."""
    if row["mode"] == "disagg":
        return [{k: sample_int(row.get(f"{side}_{k}_size")) for k in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")}
                for side in ("prefill", "decode")]
    return [{k: sample_int(row.get(f"{k}_size")) for k in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")}]


def _split(pool: dict[str, int]) -> dict[str, int]:
    """A pool's MoE split; where the sample leaves it unset (0), the experts split over every rank of
    the stage (moe_ep = tp x attention_dp)."""
    if pool["moe_tp"] * pool["moe_ep"] == 1 < pool["tp"] * pool["attention_dp"]:
        return {"attention_dp": pool["attention_dp"], "moe_tp": 1, "moe_ep": pool["tp"] * pool["attention_dp"]}
    return {"attention_dp": pool["attention_dp"], "moe_tp": pool["moe_tp"], "moe_ep": pool["moe_ep"]}


def workload(row: pd.Series, pool: dict[str, int], folder: Path) -> dict[str, Any]:
    """The inference workload of one pool of ``row`` (as a YAML mapping)."""
    backend = str(row["backend"])
    if backend not in FRAMEWORKS:
        raise SimgpuError(f"framework {backend!r} is not modelled; expected one of: {', '.join(FRAMEWORKS)}")
    gpus = pool["tp"] * pool["attention_dp"] * pool["pp"]
    gpn = 72 if row["system"] == "gb200" else 8  # a GB200 NVL72 rack is one NVLink domain of 72
    nodes = max(1, -(-gpus // gpn))
    par: dict[str, int] = {"tp": pool["tp"], "pp": pool["pp"]}
    # a dense model's rows carry moe sizes of 1, which mean nothing for it
    if _has_experts(config_path(folder, str(row["model_path"]))):
        par.update(_split(pool))
    elif pool["attention_dp"] > 1:
        raise SimgpuError(f"attention_dp {pool['attention_dp']} on a dense model is data parallelism; expected "
                          "replicas")
    return {"name": str(row["id"]), "platform": PLATFORMS[str(row["system"])], "nodes": nodes,
            "gpus_per_node": min(gpus, gpn), "model": {"config": str(config_path(folder, str(row["model_path"])))},
            "inference": {**_precisions(row), "framework": FRAMEWORKS[backend], "decode_requests": 1,
                          "context_tokens": int(row["isl"]) + int(row["osl"]), "cuda_graphs": True},
            "parallelism": par}


def resolve(data: dict[str, Any]) -> None:
    """Load ``data`` as a job and resolve its deployment; raises what a user would see."""
    from ..config.checks import check_job
    from ..workload.inference.builder import deployment
    from ..workload.registry import World

    file = f"<{data['name']}>"
    spec = validate(WorkloadSpec, expand(data, file), file)
    platform, pfile = load_platform(spec.platform)
    job = Job(spec, platform, file, pfile)
    check_job(job)
    gpn = spec.gpus_per_node or platform.node.gpus
    world = World(spec.nodes, gpn, platform.gpu.memory_gib, gpu_dtypes=tuple(platform.gpu.peak_tflops))
    dep = deployment(spec, world)
    if dep.memory.kv_blocks <= 0:
        raise SimgpuError(f"the weights leave no room for a KV cache: {dep.memory.weights_bytes / 2**30:.1f} GiB of "
                          f"weights per GPU")


def verdict(row: pd.Series, folder: Path, cache: dict[str, str]) -> str:
    """``""`` where ``row`` is expressible, else the first reason it is not."""
    try:
        works = [workload(row, p, folder) for p in pools(row)]
    except SimgpuError as e:
        return str(e)
    reasons = []
    for w in works:
        key = repr(sorted((k, repr(v)) for k, v in w.items() if k != "name"))
        if key not in cache:
            try:
                resolve(w)
                cache[key] = ""
            except (SimgpuError, ValueError) as e:
                cache[key] = str(e).replace(f"<{w['name']}>: ", "")
        reasons.append(cache[key])
    return next((r for r in reasons if r), "")


def table(folder: Path) -> pd.DataFrame:
    """Every row's id, model, backend, mode, whether it is expressible and why not."""
    rows = pd.read_csv(folder / "silicon_sample.csv")
    cache: dict[str, str] = {}
    why = [verdict(r, folder, cache) for _, r in rows.iterrows()]
    return pd.DataFrame({"id": rows["id"], "model": rows["model_path"], "backend": rows["backend"],
                         "mode": rows["mode"], "expressible": [not w for w in why], "reason": why})


def sample_folder(data: Path | None) -> Path | None:
    """The sample's folder under the shared data folder ``data`` (default ``../shared/data``), or
    None, having said so on stderr, where it holds no sample."""
    folder = (data or data_root()) / SAMPLE
    if not (folder / "silicon_sample.csv").is_file():
        print(f"error: no serving sample at {folder}", file=sys.stderr)
        return None
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.silicon", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--csv", help="write every row's verdict here")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    folder = sample_folder(args.data)
    if folder is None:
        return 2
    t = table(folder)
    if args.csv:
        t.to_csv(args.csv, index=False)
    per = t.groupby("model")["expressible"].agg(["sum", "count"])
    per = per.rename(columns={"sum": "expressible", "count": "rows"})
    with pd.option_context("display.width", 200, "display.max_colwidth", 120, "display.max_rows", 200):
        print(per.to_string())
        reasons = t.loc[~t["expressible"], "reason"].value_counts()
        if len(reasons):
            print("\nwhy not (rows):")
            print(reasons.to_string())
    print(f"\n{int(t['expressible'].sum()):,} of {len(t):,} rows expressible")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Studies on a real Dask cluster: a scheduler and a worker started in another folder than the study's
client, the worker refused every file under the studies' folder (an audit hook preloaded into it), run
the variants of a workload study and of a serving study, each variant sent loaded, to the rows they
give here; and a study whose variants all fail for one same reason stops with that reason."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

from simgpu.variant import Variant
from simgpu.whatif.__main__ import main as whatif_main
from simgpu.whatif.runner import _stop_on_a_common_failure, load_rows, run_variant

DASK = Path(sys.executable).parent / "dask"
LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
DLRM = ROOT / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml"

#: Preloaded into the worker: every file under $HIDDEN is refused to it, as on another machine.
HIDE = """
import os, sys

HIDDEN = os.environ["HIDDEN"]


def _refuse(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path == HIDDEN or path.startswith(HIDDEN + os.sep):
            raise PermissionError(13, "not on this worker's machine", path)


sys.addaudithook(_refuse)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"no Dask scheduler on port {port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A scheduler and one worker, in a folder of their own; yields the address and the folder whose
    files the worker cannot open (the studies go there)."""
    if not DASK.is_file() and shutil.which("dask") is None:
        pytest.skip("dask's command line is not installed")
    pytest.importorskip("distributed")
    dask = str(DASK if DASK.is_file() else shutil.which("dask"))
    here = tmp_path_factory.mktemp("cluster")
    hidden = tmp_path_factory.mktemp("studies").resolve()
    (here / "hide.py").write_text(HIDE)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HIDDEN": str(hidden)}  # the workers run this checkout's simgpu
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_for_port(port, time.monotonic() + 30)
        procs.append(subprocess.Popen([dask, "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1", "--nworkers",
                                       "1", "--no-dashboard", "--local-directory", str(here),
                                       "--preload", str(here / "hide.py")],
                                      cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout="20s") as c:
            c.wait_for_workers(1, timeout=30)
            (hidden / "probe").write_text("x")
            with pytest.raises(PermissionError):  # the worker cannot read the studies' files
                c.submit(Path.read_text, hidden / "probe", pure=False).result(timeout=30)
        yield f"tcp://127.0.0.1:{port}", hidden
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def _rows(study: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          *args: str) -> dict[str, dict[str, Any]]:
    """The rows of ``study`` run from its own folder, by variant id, without their wall times."""
    monkeypatch.chdir(study.parent)
    code = whatif_main([study.name, "--out", str(out), "--quiet", "--no-plots", *args])
    assert code == 0, capsys.readouterr().err
    return {r["id"]: {k: v for k, v in r.items() if k != "wall_s"} for r in load_rows(out / "results.jsonl")}


@pytest.mark.slow
def test_a_workload_study_runs_on_a_worker_that_cannot_read_its_files(cluster, tmp_path, monkeypatch,
                                                                      capsys) -> None:
    address, hidden = cluster
    folder = hidden / "workload"
    folder.mkdir()
    shutil.copy(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml", folder / "w.yaml")
    (folder / "s.yaml").write_text(yaml.safe_dump({
        "name": "two", "base": "w.yaml", "set": {"model.layers": 2, "parallelism.dp": None},
        "grid": {"platform.network.nic_gbps": [200, 400]}}))
    rows = _rows(folder / "s.yaml", tmp_path / "dask", monkeypatch, capsys, "--scheduler", address)
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows.values()), rows
    assert rows == _rows(folder / "s.yaml", tmp_path / "here", monkeypatch, capsys, "--workers", "1")


def _trace(path: Path, n: int = 24) -> None:
    """A small trace in Azure's columns: a request every 0.4 s, prompts of 100 to 790 tokens."""
    rows = [f"2023-11-16 18:15:{i * 0.4:07.4f},{100 + 30 * i},{10 + 3 * (i % 7)}" for i in range(n)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")


def _serving_study(folder: Path) -> Path:
    """A serving study in ``folder`` naming its files by relative paths: a serving file, the inference
    workload it deploys and a trace; two variants that serve and one that does not load (tp 3)."""
    (folder / "inference").mkdir(parents=True)
    shutil.copy(LLAMA, folder / "inference" / "llama.yaml")
    _trace(folder / "trace.csv")
    (folder / "serving.yaml").write_text(yaml.safe_dump({
        "name": "s", "deployment": {"workload": "inference/llama.yaml"},
        "requests": {"kind": "trace", "file": "trace.csv"}, "slo": {"ttft_ms": 2000, "tpot_ms": 60}}))
    (folder / "s.yaml").write_text(yaml.safe_dump({
        "name": "serving", "base": "serving.yaml", "grid": {"deployment.set.parallelism.tp": [3, 4, 8]}}))
    return folder / "s.yaml"


@pytest.mark.slow
@pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")
def test_a_serving_study_runs_on_a_worker_that_cannot_read_its_files(cluster, tmp_path, monkeypatch,
                                                                     capsys) -> None:
    """The serving file, its pool's workload and its trace go to the worker loaded: its rows are those
    of the same study run here, keys (the hashes results.jsonl is keyed by) included."""
    address, hidden = cluster
    study = _serving_study(hidden / "serving")
    rows = _rows(study, tmp_path / "dask", monkeypatch, capsys, "--scheduler", address)
    assert sorted(r["status"] for r in rows.values()) == ["invalid", "ok", "ok"], rows
    assert rows == _rows(study, tmp_path / "here", monkeypatch, capsys, "--workers", "1")


def test_variants_that_all_fail_alike_stop_the_study(tmp_path: Path) -> None:
    from simgpu.errors import SimulationError

    path = tmp_path / "results.jsonl"
    kept = {"key": "old", "feasible": True}
    rows = [{"key": k, "feasible": False, "why": "the base does not load"} for k in ("a", "b")]
    path.write_text("".join(json.dumps(r) + "\n" for r in [kept, *rows]))
    with pytest.raises(SimulationError, match="all 2 variants failed for the same reason"):
        _stop_on_a_common_failure(rows, path)
    assert load_rows(path) == [kept]  # the failed rows are computed again on the next run
    _stop_on_a_common_failure([{**rows[0], "why": "one"}, {**rows[1], "why": "two"}], path)  # their own reasons


def test_a_workload_variant_is_sent_loaded_and_needs_none_of_the_study_files(tmp_path: Path) -> None:
    """What a Dask worker gets for a workload study: the validated job, pickled; it simulates it with
    the study's files gone (a worker on another machine reads none of them)."""
    from simgpu.config.loader import load_job
    from simgpu.whatif.workload import run_job

    base = tmp_path / "w.yaml"
    shutil.copy(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml", base)
    variant = Variant(name="nic 800", overrides=(("platform.network.nic_gbps", 800),),
                      swept=(("platform.network.nic_gbps", 800),))
    sent = pickle.dumps(load_job(base, variant.as_args()))
    here = run_variant(str(base), variant)
    base.unlink()
    row = run_job(pickle.loads(sent), variant)
    assert row["status"] == "ok", row
    assert row["iteration_time_ms"] == here["iteration_time_ms"]


def test_a_variant_with_measured_speeds_carries_them(tmp_path: Path) -> None:
    """A workload's speeds CSV is read where the job is loaded: the pickled job runs with it gone."""
    from simgpu.config.loader import load_job
    from simgpu.whatif.workload import run_job

    base = tmp_path / "w.yaml"
    data = yaml.safe_load((ROOT / "workloads" / "gpt_2x_dgx_h100.yaml").read_text())
    data["variability"] = {"speeds_csv": "speeds.csv"}
    base.write_text(yaml.safe_dump(data))
    (tmp_path / "speeds.csv").write_text("rank,factor\n3,1.5\n")
    variant = Variant(name="as is", overrides=(), swept=())
    sent = pickle.dumps(load_job(base, variant.as_args()))
    here = run_variant(str(base), variant)
    (tmp_path / "speeds.csv").unlink()
    row = run_job(pickle.loads(sent), variant)
    assert row["status"] == "ok", row
    assert row["iteration_time_ms"] == here["iteration_time_ms"]
    plain = dict(data)
    del plain["variability"]
    base.write_text(yaml.safe_dump(plain))
    assert run_variant(str(base), variant)["iteration_time_ms"] < here["iteration_time_ms"]  # the slow rank counted


def _llm_serving(folder: Path) -> Path:
    return _serving_study(folder).with_name("serving.yaml")


def _dlrm_serving(folder: Path) -> Path:
    folder.mkdir()
    shutil.copy(DLRM, folder / "dlrm.yaml")
    (folder / "serving.yaml").write_text(yaml.safe_dump({
        "name": "d", "deployment": {"workload": "dlrm.yaml"},
        "queries": {"kind": "poisson", "count": 200, "rate_per_s": 10000, "samples": 300},
        "batcher": {"max_batch_samples": 4096, "max_queue_delay_us": 1000}, "slo": {"latency_ms": 60}}))
    return folder / "serving.yaml"


def _bad_trace(folder: Path) -> Path:
    """A disaggregated serving file whose trace lacks a column (a variant that also puts its pools on
    two platforms is refused for that: the deployment is built before the trace is read)."""
    base = _llm_serving(folder)
    (folder / "trace.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,10\n")
    base.write_text(yaml.safe_dump({
        "name": "s", "prefill": {"workload": "inference/llama.yaml"}, "decode": {"workload": "inference/llama.yaml"},
        "requests": {"kind": "trace", "file": "trace.csv"}}))
    return base


@pytest.mark.skipif(not (LLAMA.is_file() and DLRM.is_file()), reason="no inference workloads")
@pytest.mark.parametrize(("make", "overrides", "why"), [
    (_llm_serving, (("deployment.set.parallelism.tp", 8),), ""),
    (_dlrm_serving, (("deployment.set.gpus_per_node", 4),), ""),
    (_bad_trace, (), "trace lacks columns GeneratedTokens"),
    (_bad_trace, (("decode.set.platform.network.nic_gbps", 100),), "expected both pools on one platform"),
])
def test_a_serving_variant_is_sent_loaded_and_needs_none_of_the_study_files(
        tmp_path: Path, make: Callable[[Path], Path], overrides: tuple[tuple[str, Any], ...], why: str) -> None:
    """What a Dask worker gets for a serving study (LLM or DLRM): the serving file after the variant's
    overrides, its pools' jobs and its trace's requests (or the error reading it gave), pickled; served
    with the study's files gone, it gives the row served here."""
    from simgpu.config.loader import job_kind
    from simgpu.whatif.study import study_kind

    base = make(tmp_path / "study")
    kind = study_kind(job_kind(base))
    variant = Variant("v", overrides, overrides)
    sent = pickle.dumps(kind.load(str(base), variant))
    here = run_variant(str(base), variant)
    shutil.rmtree(tmp_path / "study")
    row = kind.run_loaded(pickle.loads(sent), variant)
    assert row["status"] == ("ok" if not why else "invalid") and why in row["why"], row
    assert {k: v for k, v in row.items() if k != "wall_s"} == {k: v for k, v in here.items() if k != "wall_s"}


def test_a_worker_with_other_kernel_models_says_so_instead_of_timing(tmp_path: Path) -> None:
    """A worker checks its installation against the study's: other models would give other times."""
    from simgpu.config.loader import load_job
    from simgpu.whatif.runner import installation, run_on_worker
    from simgpu.whatif.workload import run_job

    base = tmp_path / "w.yaml"
    shutil.copy(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml", base)
    variant = Variant(name="as is", overrides=(), swept=())
    job = load_job(base, variant.as_args())
    assert installation() == installation() and len(installation()) == 16
    assert run_on_worker(run_job, job, variant, installation())["status"] == "ok"
    row = run_on_worker(run_job, job, variant, "0" * 16)
    assert row["status"] == "invalid" and not row["feasible"]
    assert "not the study's" in row["why"] and "same simgpu installation" in row["why"]

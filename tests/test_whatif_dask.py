"""Studies on a real Dask cluster: a scheduler and a worker started in another folder than the study's
client run its variants (a workload's variants sent loaded and validated; a serving file by its
absolute path, checked by its hash), and a study whose variants all fail for one same reason stops
with that reason."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from simgpu.variant import Variant
from simgpu.whatif.__main__ import main as whatif_main
from simgpu.whatif.runner import _stop_on_a_common_failure, load_rows, run_variant

DASK = Path(sys.executable).parent / "dask"


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


@pytest.mark.slow
@pytest.mark.skipif(not DASK.is_file() and shutil.which("dask") is None, reason="dask's command line is not installed")
def test_a_study_runs_on_a_dask_cluster_started_in_another_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    dask = str(DASK if DASK.is_file() else shutil.which("dask"))
    cluster = tmp_path / "cluster"
    client = tmp_path / "client"
    cluster.mkdir()
    client.mkdir()
    shutil.copy(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml", client / "w.yaml")
    (client / "s.yaml").write_text(yaml.safe_dump({
        "name": "two", "base": "w.yaml", "set": {"model.layers": 2, "parallelism.dp": None},
        "grid": {"platform.network.nic_gbps": [200, 400]}}))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the workers run this checkout's simgpu
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              cwd=cluster, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_for_port(port, time.monotonic() + 30)
        procs.append(subprocess.Popen([dask, "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1", "--nworkers",
                                       "1", "--no-dashboard", "--local-directory", str(cluster)],
                                      cwd=cluster, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout="20s") as c:
            c.wait_for_workers(1, timeout=30)
        monkeypatch.chdir(client)
        code = whatif_main(["s.yaml", "--scheduler", f"tcp://127.0.0.1:{port}", "--out", str(client / "out")])
        assert code == 0, capsys.readouterr().err
        rows = load_rows(client / "out" / "results.jsonl")
        assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), rows
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_a_worker_that_cannot_read_the_base_says_so(tmp_path: Path) -> None:
    v = Variant("v", (("nodes", 2),))
    row = run_variant(str(tmp_path / "elsewhere.yaml"), v, "workload", digest="0" * 64)
    assert row["status"] == "error" and "cannot read the base file" in row["why"] and "expected" in row["why"]
    base = tmp_path / "w.yaml"
    base.write_text("name: x\n")
    row = run_variant(str(base), v, "workload", digest="0" * 64)
    assert "reads another" in row["why"]


def test_variants_that_all_fail_alike_stop_the_study(tmp_path: Path) -> None:
    from simgpu.errors import SimulationError

    path = tmp_path / "results.jsonl"
    kept = {"key": "old", "feasible": True}
    rows = [{"key": k, "feasible": False, "why": "the worker cannot read the base file"} for k in ("a", "b")]
    path.write_text("".join(json.dumps(r) + "\n" for r in [kept, *rows]))
    with pytest.raises(SimulationError, match="all 2 variants failed for the same reason"):
        _stop_on_a_common_failure(rows, path)
    assert load_rows(path) == [kept]  # the failed rows are computed again on the next run
    _stop_on_a_common_failure([{**rows[0], "why": "one"}, {**rows[1], "why": "two"}], path)  # their own reasons


def test_a_workload_variant_is_sent_loaded_and_needs_none_of_the_study_files(tmp_path: Path) -> None:
    """What a Dask worker gets for a workload study: the validated job, pickled; it simulates it with
    the study's files gone (a worker on another machine reads none of them)."""
    import pickle

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

"""The command line as a whole: one ``simgpu <verb>`` for every command, quiet on a closed pipe,
output folders that stay where the user pointed, studies that reuse only unchanged rows and stop
cleanly on Ctrl-C."""

from __future__ import annotations

import configparser
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from simgpu.__main__ import COMMANDS
from simgpu.__main__ import main as simgpu
from simgpu.cli import safe_name
from simgpu.whatif.__main__ import main as whatif

GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_every_verb_has_a_command(verb: str) -> None:
    module = importlib.import_module(COMMANDS[verb][0])
    if not hasattr(module, "main"):
        module = importlib.import_module(COMMANDS[verb][0] + ".__main__")
    assert callable(module.main)


@pytest.mark.parametrize("verb", ["run", "whatif", "search", "comm", "calibrate", "replay", "validate"])
def test_help_of_a_verb_exits_0(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert simgpu([verb, "--help"]) == 0
    assert "usage:" in capsys.readouterr().out


def test_bare_simgpu_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert simgpu([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {verb}" in out for verb in COMMANDS)


def test_the_console_script_is_the_dispatcher() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options.entry_points"]["console_scripts"].strip() == "simgpu = simgpu.__main__:console"


def test_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "simgpu", "comm", "--platform", "dgx_h100", "--sizes", "8:1GB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("name, want", [("../../..", "run"), ("a/b", "a_b"), (".hidden", "hidden"),
                                        ("gpt_1.3b_2x", "gpt_1.3b_2x"), ("x" * 200, None)])
def test_a_name_is_never_a_path(name: str, want: str | None) -> None:
    got = safe_name(name)
    assert "/" not in got and not got.startswith(".") and len(got) <= 80
    if want is not None:
        assert got == want


def _study(tmp: Path, base: Path, **grid: list[object]) -> Path:
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "st", "base": str(base), "grid": grid}))
    return path


def test_a_rerun_reuses_only_rows_whose_job_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.yaml"
    data = yaml.safe_load(GPT.read_text()) | {"platform": "dgx_h100"}
    data["model"].update(layers=2, hidden=512, heads=8, seq_len=256)
    base.write_text(yaml.safe_dump(data))
    study = _study(tmp_path, base, **{"platform.network.nic_gbps": [100, 400]})
    out = tmp_path / "out"
    assert whatif([str(study), "--out", str(out), "--workers", "1", "--no-plots"]) == 0
    rows = map(json.loads, (out / "results.jsonl").read_text().splitlines())
    first = {r["name"]: r["iteration_time_ms"] for r in rows}
    capsys.readouterr()
    assert whatif([str(study), "--out", str(out), "--workers", "1", "--no-plots"]) == 0
    assert "reused 2 of 2 rows" in capsys.readouterr().out
    data["model"]["layers"] = 4  # the base changed: every row's job changed
    base.write_text(yaml.safe_dump(data))
    assert whatif([str(study), "--out", str(out), "--workers", "1", "--no-plots"]) == 0
    assert "reused" not in capsys.readouterr().out
    import pandas as pd

    table = pd.read_csv(out / "results.csv").set_index("name")
    for name, t in first.items():
        assert table.loc[name, "iteration_time_ms"] > 1.1 * t  # recomputed with twice the layers


def _interruptible() -> None:
    """In the study's process before it starts: SIGINT delivered and handled as at a terminal, whatever
    disposition or mask the test runner's process passes on (an ignored or blocked SIGINT is inherited
    across exec, and Python then installs no KeyboardInterrupt handler)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_stops_a_study_at_once(tmp_path: Path) -> None:
    # 48 variants: enough that the study is still computing when the first row is written, so the
    # interrupt lands among its variants (not in the table and plots written at the end)
    study = _study(tmp_path, GPT, **{"platform.network.nic_gbps": [100, 200, 300, 400, 500, 600, 700, 800],
                                     "comm.bucket_mib": [5, 10, 25, 50, 100, 200]})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "simgpu", "whatif", str(study), "--out", str(out), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=tmp_path,
                            preexec_fn=_interruptible)
    rows = out / "results.jsonl"
    deadline = time.time() + 120
    while not (rows.is_file() and rows.read_text().strip()) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the study finished before it could be interrupted"
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 1.5
    assert proc.returncode == 130
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "run the same command again to resume" in lines[0], lines
    written = rows.read_text().splitlines()
    assert written and all(json.loads(line)["key"] for line in written)  # every row whole
    assert not (out / "results.csv").exists()


SMALL = ["--set", "model.layers=2", "--set", "model.seq_len=256"]


def test_a_run_says_what_it_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from simgpu.run import main as run

    monkeypatch.chdir(tmp_path)
    assert run([str(GPT), *SMALL, "--set", "platform.network.nic_gbps=800", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "out" / "gpt_1.3b_2x_dgx_h100" / "model.layers=2,model.seq_len=256,network.nic_gbps=800,seed=3"
    summary = json.loads((folder / "summary.json").read_text())  # its own folder, not the baseline's
    run_ = summary["run"]
    assert run_["overrides"] == ["model.layers=2", "model.seq_len=256", "platform.network.nic_gbps=800", "seed=3"]
    assert run_["seed"] == 3 and summary["seed"] == 3
    assert run_["platform"]["nic_gbps"] == 800 and run_["platform"]["nodes"] == 2
    assert run_["platform"]["gpu"] == "H100-SXM5-80GB" and run_["platform"]["gpus"] == 16
    assert {"simgpu", "python"} <= set(run_["versions"])
    assert "overrides  model.layers=2" in printed and "% of the iteration time" in printed
    assert "the seed changes nothing" in printed


def test_big_run_outputs_can_be_kept_small(tmp_path: Path) -> None:
    from simgpu.run import main as run

    out = tmp_path / "o"
    assert run([str(GPT), *SMALL, "--out", str(out), "--no-trace", "--records", "none", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "timeline.png"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert run([str(GPT), *SMALL, "--out", str(whole), "--records", "parquet", "--quiet"]) == 0
    assert run([str(GPT), *SMALL, "--out", str(part), "--trace-window", "0:1", "--quiet"]) == 0
    import pandas as pd

    records = pd.read_csv(part / "records.csv")
    assert 0 < len(records) < len(pd.read_parquet(whole / "records.parquet"))
    assert records["start_us"].min() <= 1000.0
    assert (part / "trace.json").stat().st_size < (whole / "trace.json").stat().st_size


def test_progress_is_drawn_only_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from simgpu.cli import Progress
    from simgpu.whatif.runner import text_progress

    with Progress(after_s=0.0) as progress:  # stderr is captured: not a terminal
        progress.set("working")
        time.sleep(0.7)
    text_progress(1, 2, {"name": "v", "iteration_time_ms": 1.0})
    assert capsys.readouterr().err == ""


def test_progress_on_a_terminal_is_one_rewritten_line() -> None:
    import io

    from simgpu.cli import Progress

    stream = io.StringIO()
    with Progress(after_s=0.0, stream=stream, enabled=True) as progress:
        progress.set("writing trace.json")
        time.sleep(0.7)
    text = stream.getvalue()
    assert text.startswith("\r") and "writing trace.json" in text and "\n" not in text


def test_a_checkout_named_simgpu_that_shadows_the_package_is_named_in_one_line(monkeypatch) -> None:
    """Run from the parent of a checkout named simgpu, Python imports the checkout as a namespace
    package; the command says so in one line (and nothing when the package is the real one)."""
    import types

    from simgpu.cli import shadowed

    assert shadowed() is None
    fake = types.ModuleType("simgpu")
    fake.__path__ = ["/somewhere/simgpu"]  # a namespace package: a __path__ and no __file__
    monkeypatch.setitem(sys.modules, "simgpu", fake)
    note = shadowed()
    assert note is not None and "\n" not in note and "/somewhere/simgpu" in note and "another folder" in note


def test_the_version_is_the_installed_one() -> None:
    from importlib.metadata import version

    from simgpu.version import VERSION, __version__

    assert __version__ == version("simgpu") and VERSION.count(".") == 2


def test_comm_csv_alone_writes_under_out(tmp_path, monkeypatch, capsys) -> None:
    from simgpu.comm.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert main(["--platform", "dgx_h100", "--sizes", "8:64", "--csv"]) == 0
    written = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.csv")]
    assert written == ["out/comm/dgx_h100_all_reduce_1n.csv"]

"""``simgpu validate --report``: the accuracy pages, tables and plots of the documentation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simgpu.validate import report
from simgpu.validate.__main__ import main as validate_main


def _points(errors: list[float], group: str = "g") -> pd.DataFrame:
    measured = np.linspace(1.0, 10.0, len(errors))
    return pd.DataFrame({"case": [f"c{i}" for i in range(len(errors))], "group": group, "measured": measured,
                         "predicted": measured * (1 + np.asarray(errors))})


def test_summary_figures_are_the_suites_definitions() -> None:
    f = report.summary(_points([0.09, -0.2, 0.05, 0.0]))
    assert f["n"] == 4
    expected = math.expm1(np.mean(np.abs(np.log1p([0.09, -0.2, 0.05, 0.0]))))
    assert f["geomean"] == pytest.approx(expected)
    assert f["max"] == pytest.approx(0.2)
    assert f["within"] == pytest.approx(0.75)  # 0.09 is inside the band, 0.2 is not
    assert f["median"] == pytest.approx(0.025)


def test_summary_ignores_points_without_a_positive_time() -> None:
    p = _points([0.1, 0.1])
    p.loc[0, "predicted"] = 0.0
    assert report.summary(p)["n"] == 1
    assert report.summary(p.iloc[:0])["n"] == 0


def _fake_sets(monkeypatch: pytest.MonkeyPatch, missing: bool = False) -> None:
    def points(quick: bool) -> pd.DataFrame:
        if missing:
            raise FileNotFoundError("no measurements at /nowhere")
        return pd.concat([_points([0.05, -0.3, 0.02], "a"), _points([0.5, 0.01], "b")], ignore_index=True)

    monkeypatch.setattr(report, "SETS", (report.Set("fake", "A fake set", "python -m fake", "ms", "Made up.",
                                                    points),))


def test_report_writes_page_table_plot_and_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_sets(monkeypatch)
    assert report.write_report(tmp_path, log=lambda _: None) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"fake.md", "fake.csv", "fake.png", "index.md"}
    page = (tmp_path / "fake.md").read_text()
    assert "# A fake set" in page and "![predicted against measured](fake.png)" in page
    assert "| a | 3 |" in page and "| b | 2 |" in page
    assert page.index("+50.0%") < page.index("-30.0%")  # the worst point first
    assert len(pd.read_csv(tmp_path / "fake.csv")) == 5
    index = (tmp_path / "index.md").read_text()
    assert "[A fake set](fake.md) | 5 |" in index and "Not in this report" not in index


def test_a_set_without_its_measurements_is_listed_as_skipped(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    _fake_sets(monkeypatch, missing=True)
    assert report.write_report(tmp_path, log=lambda _: None) == 0
    index = (tmp_path / "index.md").read_text()
    assert "- A fake set: no measurements at /nowhere" in index
    assert not (tmp_path / "fake.md").exists()


def test_the_command_refuses_an_unknown_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main(["--report", str(tmp_path), "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown set 'nope'" in err[0]
    assert not any(tmp_path.iterdir())


def test_every_set_has_a_distinct_name_and_a_command() -> None:
    names = report.set_names()
    assert len(names) == len(set(names))
    assert all(s.command.startswith("python -m simgpu.validate") for s in report.SETS)


def test_every_set_is_in_the_documentation_site() -> None:
    root = Path(__file__).resolve().parents[1]
    nav = (root / "mkdocs.yml").read_text()
    for s in report.SETS:
        assert f"accuracy/{s.name}.md" in nav, f"mkdocs.yml's nav lacks accuracy/{s.name}.md"
        assert (root / "docs" / "accuracy" / f"{s.name}.md").is_file(), \
            f"docs/accuracy/{s.name}.md is missing: python -m simgpu.validate --report docs/accuracy --only {s.name}"

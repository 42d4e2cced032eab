"""``simgpu speed --report``: the documentation's Speed page from the recorded figures."""

from __future__ import annotations

from pathlib import Path

from simgpu import speed
from simgpu.speed_cases import CASES


def test_speed_page_lists_every_case_with_its_figures(tmp_path: Path) -> None:
    first, second = list(CASES)[:2]
    page = tmp_path / "speed.md"
    speed.speed_page(page, {first: {"wall_s": 2.0, "events": 1000, "peak_mib": 150.0}}, "2026-01-01")
    text = page.read_text()
    assert (tmp_path / "speed-scaling.png").is_file()
    assert "![wall time against GPUs](speed-scaling.png)" in text
    assert f"| {first} | {CASES[first][0]:,} | 2.00 | 1,000 | 500 | 150 |" in text
    assert f"| {second} | {CASES[second][0]:,} | not measured |" in text
    assert text.count("\n| ") == len(CASES) + 1  # the header and a row per case


def test_the_committed_speed_page_is_in_the_site() -> None:
    root = Path(__file__).resolve().parents[1]
    assert (root / "docs" / "speed.md").is_file()
    assert "speed.md" in (root / "mkdocs.yml").read_text()

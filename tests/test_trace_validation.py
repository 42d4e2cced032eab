"""Replays of the real traces in ../shared/data/traces/hta/ against their traced step times."""

from __future__ import annotations

import pytest
from conftest import DATA

from simgpu.validate.traces import MAX_ERROR, format_table, jobs, validate

TRACES = DATA / "traces" / "hta"

pytestmark = [
    pytest.mark.validation,
    pytest.mark.slow,
    pytest.mark.skipif(not TRACES.is_dir(), reason=f"the real traces are not here ({TRACES}); they lie in the "
                       "shared data folder beside the repository"),
]


def test_replayed_step_times_match_the_traces() -> None:
    table = validate(TRACES)
    print(format_table(table))
    assert len(table) == len(jobs(TRACES)) >= 5
    judged = table[table["steps"] > 0]
    assert len(judged) >= 5, "expected traces with complete ProfilerSteps"
    bad = judged[judged["error_pct"].abs() > 100 * MAX_ERROR]
    assert bad.empty, f"replayed step time off by more than {100 * MAX_ERROR:g}%:\n{format_table(bad)}"
    # the replayed GPU timeline follows the trace, not only the step time
    assert (table["on_time_pct"] >= 95.0).all(), format_table(table)

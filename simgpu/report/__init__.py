"""Reports of a simulation: the summary (dict and printed table), Gantt chart, Chrome trace, files."""

from .chrome_trace import chrome_trace, write_chrome_trace
from .gantt import plot_timeline
from .outputs import write_outputs
from .summary import summarize
from .table import format_summary

__all__ = ["chrome_trace", "format_summary", "plot_timeline", "summarize", "write_chrome_trace", "write_outputs"]

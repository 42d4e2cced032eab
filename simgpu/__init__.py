"""simgpu: predict how fast ML training runs on multi-GPU, multi-node platforms.

The pipeline: platform + workload YAML -> validated specs -> per-rank op graph -> kernel times
(bulk) -> SimPy engine (streams, CPU threads, shared links, collectives) -> records -> summary,
Gantt chart, Chrome trace.
"""

from .config.loader import Job, load_job
from .errors import ConfigError, SimgpuError, SimulationError
from .result import SimResult
from .sim import simulate, simulate_file
from .version import __version__

__all__ = ["ConfigError", "Job", "SimResult", "SimgpuError", "SimulationError", "__version__", "load_job",
           "simulate", "simulate_file"]

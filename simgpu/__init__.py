"""simgpu: predict how fast ML training runs, and how a deployment serves requests, on multi-GPU,
multi-node platforms.

The pipeline: platform + workload YAML -> validated specs -> per-rank op graph -> kernel times
(bulk) -> SimPy engine (streams, CPU threads, shared links, collectives) -> records -> summary,
Gantt chart, Chrome trace. From Python: :func:`load` any simgpu file, :func:`simulate` a job,
:func:`serve` a serving file (:mod:`simgpu.api`; docs/api.md).
"""

from .api import Loaded, Served, kind, load, serve, summarize
from .config.loader import Job, load_job
from .errors import ConfigError, SimgpuError, SimulationError
from .result import SimResult
from .sim import simulate, simulate_file
from .version import __version__

__all__ = ["ConfigError", "Job", "Loaded", "Served", "SimResult", "SimgpuError", "SimulationError", "__version__",
           "kind", "load", "load_job", "serve", "simulate", "simulate_file", "summarize"]

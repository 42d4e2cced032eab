"""Traces of real training jobs: import PyTorch profiler (Kineto) traces, replay them, ask what-if.

:mod:`~simgpu.trace.kineto` reads the files, :mod:`~simgpu.trace.et` the optional Execution Traces,
:mod:`~simgpu.trace.classify` names and classes kernels and collectives,
:mod:`~simgpu.trace.build` turns one rank's trace into a program of ops with measured times,
:mod:`~simgpu.trace.link` matches collectives and clocks across ranks, :mod:`~simgpu.trace.whatif`
re-times ops for another platform, and :mod:`~simgpu.trace.player` runs it all in the engine.
"""

from .build import RankProgram, build_program
from .et import ExecutionTrace, load_et
from .kineto import RankTrace, load_rank_trace
from .load import load_traces
from .player import ReplayOptions, ReplayOutcome, build_programs, replay, replay_programs

__all__ = ["ExecutionTrace", "RankProgram", "RankTrace", "ReplayOptions", "ReplayOutcome", "build_program",
           "build_programs", "load_et", "load_rank_trace", "load_traces", "replay", "replay_programs"]

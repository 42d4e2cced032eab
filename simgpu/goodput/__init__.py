"""Goodput of a whole training run under failures: checkpoint intervals by Young, Daly and Monte Carlo.

:mod:`~simgpu.goodput.spec` reads a goodput file and resolves its job (simulating one iteration of
a workload where one is named), :mod:`~simgpu.goodput.model` holds the formulas and the simulated
failure timelines, :mod:`~simgpu.goodput.run` the summary and the printed table,
:mod:`~simgpu.goodput.plots` the figure. The command is ``simgpu goodput`` (``python -m simgpu.goodput``).
"""

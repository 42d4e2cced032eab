"""The microbenchmark harness: ``python -m simgpu.bench`` times torch ops over a sweep of shapes.

Rows it writes are keyed by the kernel families and parameters of
:class:`~simgpu.graph.KernelSpec`, so the models fitted on them (``python -m simgpu.fit``)
time the kernels the workload builders emit. :mod:`.cases` owns the shape sweeps, :mod:`.ops` the
torch code of each op, :mod:`.indices` the embedding index distributions, :mod:`.timing` the clocks,
and :mod:`.harness` the loop that measures, resumes and writes.
"""

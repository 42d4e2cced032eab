"""Several jobs on one cluster (``python -m simgpu.cluster``): the jobs simulated together on the shared
links of one topology and each alone, the slowdown each suffers from its neighbours, and whose
traffic crosses the busiest links. See docs/cluster.md."""

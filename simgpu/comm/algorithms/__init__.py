"""Collective algorithms as NCCL runs them: ring, double binary tree, NVLS, direct (pairwise).

Each turns a :class:`CollectiveRequest` into a :class:`CollectivePlan` for one protocol (LL, LL128,
Simple): transfers over the topology's routes, whose bytes are inflated by the protocol's payload
fraction, plus a latency of the protocol's fixed cost and one per-step cost per algorithm step,
by the class of hardware the step crosses (NVLink, PCIe, network) and the route's propagation.
A ring's chunk pays each hop's step cost in turn (NVLink or PCIe inside a node, the network between
nodes), and each loop of the ring has one step that copies in a rank's own memory; a tree's chunk
crosses every level up and down. Rings and trees use several channels when the group spans nodes,
each channel entering and leaving every node on a different GPU (so a different NIC), as NCCL's
channels do; on NVLink meshes the rings are Hamiltonian cycles over the wired pairs. Over the
network a channel has SLOTS buffer slots of one chunk each in flight: its transfer never runs
faster than those slots come back (a round trip and the proxy's step), which holds mid-size
messages, whose chunks are small, below the links' bandwidth on high-latency fabrics.

The algorithms, registered in this order (the order the planner compares them in): the ring
(:mod:`.rings`), the double binary tree and CollNet (:mod:`.trees`), NVLS (:mod:`.nvls`), PAT
(:mod:`.pat`) and direct (:mod:`.p2p`); their shared parts in :mod:`.common`.
"""

# the modules register their algorithms as they are imported: in the order the planner compares them
# isort: off
from . import rings  # noqa: F401
from . import trees  # noqa: F401
from . import nvls  # noqa: F401
from . import pat  # noqa: F401
from . import p2p  # noqa: F401
# isort: on

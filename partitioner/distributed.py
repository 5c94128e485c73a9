"""Multi-process meshes on ``jax.distributed``: one job, many processes, global arrays.

``initialize()`` joins the job (the launcher's settings, or jax's cluster
detection); ``host_local_to_global`` / ``global_to_host_local`` convert between each
process's block of data and global ``jax.Array``s; ``host_local_slice`` tells a loader
which block to read. ``python -m partitioner.launch`` starts local jobs. See the
README, "Running on several processes / hosts".
"""

from ._src.distributed.arrays import global_to_host_local, host_local_slice, host_local_to_global
from ._src.distributed.cluster import EXIT_PEER_LOST, ProcessLostError, initialize

__all__ = [
    "EXIT_PEER_LOST",
    "ProcessLostError",
    "global_to_host_local",
    "host_local_slice",
    "host_local_to_global",
    "initialize",
]

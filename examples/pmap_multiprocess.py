# examples/pmap_multiprocess.py: python -m partitioner.launch -n 2 --devices-per-process 4 -- python examples/pmap_multiprocess.py
import jax
import numpy as np

import partitioner
import partitioner.distributed as pd

pd.initialize()  # first: before anything touches a device

me, n_local = jax.process_index(), jax.local_device_count()
# Each process passes its local slice: one entry per local device (4 here).
x = np.arange(n_local, dtype=np.float32) + me * n_local  # process 0: 0..3, process 1: 4..7


def normalize(v):
    # The collectives reach all 8 devices of the job, in process order.
    return v / jax.lax.psum(v, "i"), jax.lax.axis_index("i"), jax.lax.all_gather(v, "i")


share, index, everything = partitioner.pmap(normalize, "i")(x)
print("my shares:", np.round(np.asarray(share), 4).tolist())  # this process's 4 outputs
print("my positions:", np.asarray(index).tolist())
print("all values:", np.asarray(everything)[0].tolist())

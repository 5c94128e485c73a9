# examples/colocated_loader.py: python -m partitioner.launch -n 2 --devices-per-process 4 -- python examples/colocated_loader.py
"""A per-host data loader: each process makes only its own rows of every batch, in the background.

``load_batch`` runs on every process, on that process's devices, with the
host-local part of its argument; the rows each process returns are assembled
into one global batch that feeds a pjit-ed train step. After the first call
(which runs at once, to learn the batch's layout) a call returns immediately:
batch ``i + 1`` is read while step ``i`` trains.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

import partitioner
import partitioner.distributed as pd
from partitioner import PartitionSpec as P

pd.initialize()  # first: before anything touches a device

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
BATCH = (64, 16)


def read_rows(step: int, rows: slice) -> np.ndarray:
    """Stands for reading part of a file on disk: rows ``rows`` of batch ``step``."""
    index = np.arange(rows.start, rows.stop, dtype=np.float32)[:, None] + BATCH[0] * step
    return np.sin(index + np.arange(BATCH[1], dtype=np.float32))


@partitioner.colocated_python
def load_batch(step: jax.Array) -> jax.Array:
    """This process's rows of batch ``step``, on this process's devices."""
    rows, _ = pd.host_local_slice(BATCH, mesh, P("data"))  # process 0: 0..32, process 1: 32..64
    here = step.sharding.mesh  # ``step`` is this process's part: its mesh is our block
    return jax.device_put(read_rows(int(step), rows), NamedSharding(here, P("data")))


def counter(i: int) -> jax.Array:
    """The step number as a global (replicated) array: colocated functions take jax.Arrays."""
    return pd.host_local_to_global(np.int32(i), mesh, P())


def step(w, x):
    loss, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.5 * g, loss


train = partitioner.pjit(step, (P(None, "model"), P("data")), (P(None, "model"), None))
w = np.full((16, 8), 0.1, np.float32)
with partitioner.mesh(mesh.devices, mesh.axis_names):
    batch = load_batch(counter(0))  # the first call runs now: it learns the batch's layout
    print("batch", batch.shape, batch.sharding.spec)
    for i in range(5):
        upcoming = load_batch(counter(i + 1))  # returns at once; read while step i trains
        w, loss = train(w, batch)
        print(f"step {i} loss {float(loss):.6f}")  # every process prints the same global loss
        batch = upcoming

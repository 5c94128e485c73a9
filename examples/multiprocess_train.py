# examples/multiprocess_train.py: python -m partitioner.launch -n 2 --devices-per-process 4 -- python examples/multiprocess_train.py
import jax
import jax.numpy as jnp
import numpy as np

import partitioner
import partitioner.distributed as pd
from partitioner import PartitionSpec as P

pd.initialize()  # first: before anything touches a device

mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))


def load_rows(rows: slice) -> np.ndarray:
    """Stands for reading rows of a dataset on disk: only this process's block is read."""
    index = np.arange(rows.start, rows.stop, dtype=np.float32)[:, None]
    return np.sin(index + np.arange(16, dtype=np.float32))  # (rows, 16)


rows, _ = pd.host_local_slice((64, 16), mesh, P("data"))  # process 0: 0..32, process 1: 32..64
x = pd.host_local_to_global(load_rows(rows), mesh, P("data"))  # one global (64, 16) array
w = np.full((16, 8), 0.1, np.float32)  # numpy arguments are global values: the same everywhere


def step(w, x):
    loss, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.5 * g, loss


train = partitioner.pjit(step, (P(None, "model"), P("data")), (P(None, "model"), None))
with partitioner.mesh(mesh.devices, mesh.axis_names):
    for i in range(5):
        w, loss = train(w, x)
        print(f"step {i} loss {float(loss):.6f}")  # every process prints the same global loss
mine = pd.global_to_host_local(x, mesh, P("data"))  # this process's rows again, no copy
print("my block of x:", mine.shape, "of", x.shape)

"""A pmap over all 8 devices of a 2x4 job, each process passing its local slice.

Prints ``OK <name>`` per check; with the argument ``mismatch`` process 1 passes
a slice of another size and every process must get a clear error.
"""

from __future__ import annotations

import partitioner.distributed as pd

pd.initialize()

# isort: split
import sys  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import partitioner  # noqa: E402

ME = jax.process_index()
N = jax.process_count() * jax.local_device_count()
GLOBAL = np.arange(N, dtype=np.float32)
LOCAL = GLOBAL[ME * 4 : (ME + 1) * 4]


def step(x):
    return (
        jax.lax.psum(x, "i"),
        jax.lax.all_gather(x, "i"),
        jax.lax.axis_index("i"),
        x * 2,
    )


f = partitioner.pmap(step, "i")
if sys.argv[1:] == ["mismatch"]:
    try:
        f(LOCAL[: 4 - ME])
    except ValueError as e:
        print("MISMATCH", str(e).replace("\n", " "), flush=True)
    sys.exit(0)

for _attempt in range(2):  # the second call runs on the fast path
    with partitioner.recording() as counts:
        total, gathered, index, doubled = f(LOCAL)
    assert total.shape == (4,) and gathered.shape == (4, N), (total.shape, gathered.shape)
    np.testing.assert_array_equal(np.asarray(total), np.full(4, GLOBAL.sum()))
    np.testing.assert_array_equal(np.asarray(gathered), np.broadcast_to(GLOBAL, (4, N)))
    np.testing.assert_array_equal(np.asarray(index), np.arange(4) + 4 * ME)
    np.testing.assert_array_equal(np.asarray(doubled), LOCAL * 2)
    assert {d.process_index for d in total.sharding.device_set} == {ME}
assert counts.get("dispatch_miss", 0) == 0, dict(counts)
print("OK local slices over the whole job", flush=True)

# An output fed back in: this process's shards are its next local slice.
np.testing.assert_array_equal(np.asarray(f(doubled)[3]), LOCAL * 4)
print("OK outputs as inputs", flush=True)

# devices= lists devices of every process, interleaved: axis_index follows the list.
by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(2)]
interleaved = [d for pair in zip(*by_process, strict=True) for d in pair]
g = partitioner.pmap(step, "i", devices=interleaved)
_, gathered, index, _ = g(LOCAL)
positions = [i for i, d in enumerate(interleaved) if d.process_index == ME]
np.testing.assert_array_equal(np.asarray(index), positions)
want = np.zeros(N, np.float32)
for p in range(2):
    want[[i for i, d in enumerate(interleaved) if d.process_index == p]] = GLOBAL[
        p * 4 : (p + 1) * 4
    ]
np.testing.assert_array_equal(np.asarray(gathered)[0], want)
print("OK devices across processes", flush=True)

# A broadcast (in_axes=None) argument and an unmapped output.
h = partitioner.pmap(
    lambda x, w: (jax.lax.psum(x * w, "i"), w), "i", in_axes=(0, None), out_axes=(0, None)
)
total, w = h(LOCAL, np.float32(3))
np.testing.assert_array_equal(np.asarray(total), np.full(4, 3 * GLOBAL.sum()))
assert float(w) == 3
print("OK broadcast arguments", flush=True)

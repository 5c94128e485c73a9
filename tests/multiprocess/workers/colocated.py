"""colocated_python over a 2x4 mesh spanning two processes; prints ``OK <name>`` per check.

Every process holds the whole inputs in numpy, so each check compares this
process's block of a result with numpy on the same data.
"""

from __future__ import annotations

import partitioner.distributed as pd

pd.initialize()

# isort: split
import threading  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import colocated_python  # noqa: E402

ME = jax.process_index()
MESH = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
X = np.arange(64.0, dtype=np.float32).reshape(8, 8)
WAIT_S = 30.0


def global_array(value: np.ndarray, spec: P) -> jax.Array:
    return pd.host_local_to_global(value[pd.host_local_slice(value.shape, MESH, spec)], MESH, spec)


def block(x: jax.Array, spec: P) -> np.ndarray:
    return np.asarray(pd.global_to_host_local(x, MESH, spec))


def mine(value: np.ndarray, spec: P) -> np.ndarray:
    return value[pd.host_local_slice(value.shape, MESH, spec)]


def ok(name: str) -> None:
    print(f"OK {name}", flush=True)


x = global_array(X, P("a", "b"))
seen: list[tuple[Any, ...]] = []


@colocated_python
def shifted(a: jax.Array) -> jax.Array:
    """2 * a + this process's index, on this process's block."""
    seen.append((a.shape, a.is_fully_addressable, len(a.sharding.device_set)))
    return jax.device_put(np.asarray(a) * 2 + jax.process_index(), a.sharding)


first = shifted(x)  # discovers the output layout: runs before it returns
assert len(seen) == 1 and first.shape == (8, 8) and not first.is_fully_addressable
np.testing.assert_array_equal(block(first, P("a", "b")), mine(X, P("a", "b")) * 2 + ME)
ok("discovery call on the host-local part")

for _ in range(3):
    out = shifted(x)
np.testing.assert_array_equal(block(out, P("a", "b")), mine(X, P("a", "b")) * 2 + ME)
assert seen == [((4, 8), True, 4)] * 4, seen
assert out.sharding.is_equivalent_to(x.sharding, 2)
ok("once per call per process, outputs assembled into global arrays")

release = threading.Event()
order: list[int] = []


@colocated_python
def gated(a: jax.Array, k: jax.Array) -> jax.Array:
    assert release.wait(WAIT_S)
    order.append(int(np.asarray(k)))
    return jax.device_put(np.asarray(a) * int(np.asarray(k)), a.sharding)


g = gated.specialize(out_specs_fn=lambda a, k: a)
ks = [global_array(np.int32(k), P()) for k in range(6)]
outs = [g(x, k) for k in ks]
assert order == []  # every call returned while the first one still waits
release.set()
for k, out in enumerate(outs):
    np.testing.assert_array_equal(block(out, P("a", "b")), mine(X, P("a", "b")) * k)
assert order == list(range(6)), order
ok("asynchronous, in call order")


@colocated_python
def fails_on_one(a: jax.Array) -> jax.Array:
    if jax.process_index() == 1:
        raise RuntimeError("disk full on host 1")
    return jax.device_put(np.asarray(a) + 1, a.sharding)


h = fails_on_one.specialize(out_specs_fn=lambda a: a)
result = h(x)
if ME == 1:
    try:
        result.block_until_ready()
    except Exception as e:  # the runtime's error, carrying the function's
        assert (
            "colocated_python function 'fails_on_one' raised RuntimeError: disk full on host 1"
            in (str(e))
        ), e
    else:
        raise AssertionError("the error did not surface")
else:
    np.testing.assert_array_equal(block(result, P("a", "b")), mine(X, P("a", "b")) + 1)
np.testing.assert_array_equal(block(shifted(x), P("a", "b")), mine(X, P("a", "b")) * 2 + ME)
ok("an error surfaces on the process that raised, later calls are clean")

rows = NamedSharding(MESH, P("a"))


@colocated_python
def load() -> jax.Array:
    """Each process makes only its own rows of the batch."""
    local = jax.sharding.NamedSharding(
        Mesh(np.array(jax.local_devices()).reshape(1, 4), ("a", "b")), P("a")
    )
    return jax.device_put(mine(X, P("a")) + 100, local)


loader = load.specialize(
    devices=jax.devices(),
    out_specs_fn=lambda: jax.ShapeDtypeStruct((8, 8), np.float32, sharding=rows),
)
batch = loader()
assert batch.shape == (8, 8) and batch.sharding.is_equivalent_to(rows, 2)
np.testing.assert_array_equal(block(batch, P("a")), mine(X, P("a")) + 100)
ok("no inputs, specialized devices and out_specs_fn")

wrong = colocated_python(lambda a: a).specialize(
    out_specs_fn=lambda a: jax.ShapeDtypeStruct((16, 8), a.dtype, sharding=a.sharding)
)
try:
    wrong(x).block_until_ready()
except Exception as e:
    assert "output 0 is float32[4, 8] on process" in str(e) and "float32[8, 8]" in str(e), e
else:
    raise AssertionError("out_specs_fn mismatch not reported")
ok("outputs that disagree with out_specs_fn")

flat = P(("a", "b"))


@colocated_python
def process_keys(a: jax.Array) -> jax.Array:
    """Four typed keys per process, laid out over this process's devices."""
    here = a.sharding.mesh
    return jax.device_put(
        jax.random.split(jax.random.key(jax.process_index()), 4), NamedSharding(here, flat)
    )


for _ in range(2):  # the discovery call, then an asynchronous one
    keys = process_keys(x)
    assert keys.shape == (8,) and keys.dtype == jax.random.key(0).dtype
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(pd.global_to_host_local(keys, MESH, flat))),
        np.asarray(jax.random.key_data(jax.random.split(jax.random.key(ME), 4))),
    )
ok("typed PRNG keys out, assembled")

try:
    shifted(X)
except ValueError as e:
    assert "only supports jax.Array" in str(e)
else:
    raise AssertionError("numpy input accepted")
ok("non-jax.Array input")
print("DONE", flush=True)

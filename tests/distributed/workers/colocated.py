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
from partitioner import (  # noqa: E402
    colocated_cpu_devices,
    colocated_python,
    colocated_python_class,
)

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
# --- the drop-in's objects, threads, nesting, memory kinds, strings ---

assert colocated_cpu_devices(jax.devices()) == jax.devices()
assert colocated_cpu_devices(MESH) is MESH
ok("colocated_cpu_devices")


@colocated_python_class
class Total:
    """A running total per process, over this process's block."""

    def __init__(self, start: float) -> None:
        self.total = start + jax.process_index()

    def add(self, a: jax.Array) -> jax.Array:
        self.total += float(np.asarray(a).sum())
        return jax.device_put(np.full(a.shape, self.total, np.float32), a.sharding)


total = Total(1.0)
adds = [total.add(x) for _ in range(3)]
block_sum = float(mine(X, P("a", "b")).sum())
for k, out in enumerate(adds):
    np.testing.assert_array_equal(block(out, P("a", "b")), 1.0 + ME + block_sum * (k + 1))
ok("a colocated object per process, its calls in order")

barrier = threading.Barrier(2)


@colocated_python
def meet(a: jax.Array) -> jax.Array:
    barrier.wait(timeout=WAIT_S)  # only if both threads' calls run at once
    return a


meet_async = meet.specialize(out_specs_fn=lambda a: a)
met: list[Any] = []
threads = [
    threading.Thread(target=lambda: met.append(block(meet_async(x), P("a", "b")))) for _ in range(2)
]
for t in threads:
    t.start()
for t in threads:
    t.join(WAIT_S)
assert len(met) == 2 and all((m == mine(X, P("a", "b"))).all() for m in met)
ok("calls from two threads run at once")

inner_device = jax.local_devices()[1]
plus_one = colocated_python(lambda a: jax.device_put(np.asarray(a) + 1, a.sharding))
via_one = colocated_python(
    lambda a: jax.device_put(np.asarray(plus_one(jax.device_put(a, inner_device))), a.sharding)
)
nested = colocated_python(lambda a: jax.device_put(np.asarray(via_one(a)) * 2, a.sharding))
for spec_fn in (None, lambda a: a):
    run = nested if spec_fn is None else nested.specialize(out_specs_fn=spec_fn)
    np.testing.assert_array_equal(block(run(x), P("a", "b")), (mine(X, P("a", "b")) + 1) * 2)
ok("nested calls across device lists finish")

pinned = NamedSharding(MESH, P("a", "b"), memory_kind="pinned_host")


@colocated_python
def to_host(a: jax.Array) -> jax.Array:
    here = NamedSharding(a.sharding.mesh, a.sharding.spec, memory_kind="pinned_host")
    return jax.device_put(np.asarray(a) + 2, here)


for f in (
    to_host,
    to_host,
    to_host.specialize(
        out_specs_fn=lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=pinned)
    ),
):
    out = f(x)
    assert out.sharding == pinned, out.sharding
    in_device_memory = jax.device_put(out, NamedSharding(MESH, P("a", "b")))
    np.testing.assert_array_equal(block(in_device_memory, P("a", "b")), mine(X, P("a", "b")) + 2)
ok("outputs keep their memory kind")

STRINGS = np.dtypes.StringDType()


@colocated_python
def spelled(a: jax.Array) -> jax.Array:
    words = np.array(
        [[f"p{jax.process_index()}:{v:g}" for v in row] for row in np.asarray(a)], STRINGS
    )
    return jax.device_put(words, a.sharding)


try:
    spelled(x)
except ValueError as e:  # jax's runtime cannot assemble strings over processes
    assert "StringDType array of a call over several processes" in str(e), e
else:
    raise AssertionError("a string array over processes was accepted")
here = pd.global_to_host_local(x, MESH, P("a", "b"))  # this process's block, its devices
for _ in range(2):
    words = spelled(here)
    assert words.dtype == STRINGS and words.sharding == here.sharding
    want = [[f"p{ME}:{v:g}" for v in row] for row in mine(X, P("a", "b"))]
    assert np.asarray(words).tolist() == want
ok("string outputs on this process's devices; a clear error over processes")
print("DONE", flush=True)

"""jax.jit's mesh scenarios (jax's ``tests/pjit_test.py``), side by side through both front doors.

Scenarios from jax's ``PJitTest`` (buffer donation), ``ArrayPjitTest`` (devices,
meshes, committed arrays, shardings found while tracing) and ``PJitErrorTest``
(jax's messages), as of the jax sources this project mirrors, rewritten here and
run against installed jax 0.10.2 through ``partitioner.jit`` and
``partitioner.pjit`` (the ``door`` fixture), each compared with ``jax.jit`` on the
same inputs (``jit_conformance.py``), under both of XLA's partitioners where the
layouts are decided by propagation. The 2022 meaning of pjit's ``None`` is
compared with jax's own (deprecated) ``jax.experimental.pjit.pjit``. The last
section trains a flax + optax model with a donated, committed, sharded state and
no shardings given, as jax.jit users write it.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections import namedtuple
from typing import Any

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import partitioner
from tests.conformance.jit_conformance import (
    deleted,
    donation_warnings,
    make_mesh,
    raises_like,
    same,
    same_donation,
    same_donation_warnings,
    same_outcome,
    sharded,
)

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pjit import pjit as jax_pjit


def jax_twin(door: Any) -> Any:
    """jax's function of the same name: where the classic ``with mesh:`` context (or a
    ``None`` spec) is involved, jax's own pjit and jax.jit differ, and each door is
    compared with its namesake."""
    return jax_pjit if door is partitioner.pjit else jax.jit


INCOMPATIBLE_DEVICES = "Received incompatible devices for jitted computation"

# --- donation with a mesh (PJitTest) ---


def test_buffer_donation(door: Any) -> None:
    mesh = make_mesh((2,), ("x",))
    s = NamedSharding(mesh, P("x"))

    def make():
        return (jax.device_put(np.ones((2, 5)) * 4, s), jax.device_put(np.ones((2, 5)) * 2, s)), {}

    same_donation(door, lambda x, y: x + y, make, in_shardings=s, out_shardings=s, donate_argnums=0)


def test_buffer_donation_with_names(door: Any) -> None:
    s = NamedSharding(make_mesh((2,), ("x",)), P("x"))

    def make():
        return (jax.device_put(np.ones((2, 5)) * 4, s), jax.device_put(np.ones((2, 5)) * 2, s)), {}

    same_donation(
        door, lambda inp1, inp2: inp1 + inp2, make, out_shardings=s, donate_argnames="inp2"
    )


def test_buffer_donation_with_kwargs(door: Any) -> None:
    s = NamedSharding(make_mesh((2,), ("x",)), P("x"))

    def make():
        x, y, z = (jax.device_put(np.ones((2, 5)) * k, s) for k in (4, 2, 1))
        return (x,), {"inp2": y, "inp3": z}

    same_donation(
        door,
        lambda inp1, inp2, inp3: (inp1 + inp2 + inp3, inp3),
        make,
        out_shardings=s,
        donate_argnames=("inp2", "inp3"),
    )


def test_buffer_donation_with_pytree_kwargs(door: Any) -> None:
    s = NamedSharding(make_mesh((2,), ("x",)), P("x"))

    def tree(k):
        v = np.ones((2, 5)) * k
        return jax.device_put({"a": {"b": v}, "c": v}, s)

    def make():
        return (tree(4),), {"inp2": tree(2), "inp3": tree(1)}

    same_donation(
        door,
        lambda inp1, inp2, inp3: jax.tree.map(lambda x, y, z: x + y + z, inp1, inp2, inp3),
        make,
        out_shardings=s,
        donate_argnames="inp2",
    )


def test_buffer_donation_with_output_sharding_inference(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((2,), ("x",))
    s, rs = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())

    def f(inp1, inp2, inp3):
        wsc = jax.lax.with_sharding_constraint
        return wsc(inp1, rs), inp1, wsc(inp2, rs), inp2, wsc(inp3, rs), inp3

    def make():
        trees = []
        for k, n in ((4, 5), (2, 7), (1, 11)):
            v = np.ones((2, n)) * k
            trees.append(jax.device_put({"a": {"b": v}, "c": v}, s))
        return tuple(trees), {}

    same_donation(door, f, make, donate_argnames=("inp2", "inp3"))


def test_buffer_donation_not_donated(door: Any) -> None:
    s = NamedSharding(make_mesh((2,), ("x",)), P("x"))
    same_donation(
        door,
        lambda x: x @ x.T,
        lambda: ((jax.device_put(np.arange(16).reshape(8, 2), s),), {}),
        donate_argnames="x",
    )


def test_buffer_donation_different_io_shapes(door: Any) -> None:
    mesh = make_mesh((2,), ("x",))
    s1, s2 = NamedSharding(mesh, P("x")), NamedSharding(mesh, P(None, "x", None))

    def make():
        x = jax.device_put(np.arange(16), s1)
        y = jax.device_put(np.arange(16).reshape(16, 1), s1)
        z = jax.device_put(np.arange(16).reshape(2, 2, 4), s1)
        return (x, y, z), {}

    same_donation(
        door,
        lambda x, y, z: (x, jnp.reshape(y, (16,)), z),
        make,
        out_shardings=(s1, s1, s2),
        donate_argnames=("x", "y", "z"),
    )


# Donation with no shardings given, of arrays committed to a mesh: the line most
# jax.jit training loops are written with (jax consumes them, and both doors must too).
COMMITTED = [
    pytest.param((2,), ("x",), P("x"), id="1d"),
    pytest.param((2, 2), ("x", "y"), P("x", "y"), id="2d"),
    pytest.param((4, 2), ("x", "y"), P(None, "y"), id="partly-replicated"),
    pytest.param((4,), ("x",), P(), id="replicated"),
]


@pytest.mark.parametrize("shape, names, spec", COMMITTED)
def test_donated_committed_sharded_no_shardings(
    door: Any, partitioner_mode: Any, shape: Any, names: Any, spec: P
) -> None:
    mesh = make_mesh(shape, names)
    same_donation(
        door,
        lambda x: x * 2,
        lambda: ((sharded((8, 4), mesh, spec),), {}),
        donate_argnums=0,
    )


def test_donated_committed_state_tree_no_shardings(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((2, 2), ("x", "y"))

    def make():
        state = {
            "w": sharded((8, 4), mesh, P(None, "y")),
            "b": sharded((4,), mesh, P("x")),
            "step": jax.device_put(np.zeros((), np.int32), NamedSharding(mesh, P())),
        }
        return (state, sharded((8, 4), mesh, P("x"))), {}

    def step(state, batch):
        grad = batch * state["w"]
        return {"w": state["w"] - 0.1 * grad, "b": state["b"] + 1, "step": state["step"] + 1}

    same_donation(door, step, make, donate_argnums=0)


def test_donated_committed_by_name_and_keyword(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((4,), ("x",))

    def make():
        return (sharded((8, 2), mesh, P("x")),), {"y": sharded((8, 2), mesh, P("x"))}

    same_donation(door, lambda x, y: (x + y, y * 2), make, donate_argnames="y")
    same_donation(door, lambda x, y: (x + y, y * 2), make, donate_argnums=1)


def test_donated_committed_reshaped(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((2,), ("x",))
    same_donation(
        door,
        lambda x: x.reshape(16),
        lambda: ((sharded((16, 1), mesh, P("x")),), {}),
        donate_argnums=0,
    )


def test_donated_committed_output_laid_out_otherwise(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((4,), ("x",))
    rs = NamedSharding(mesh, P())
    same_donation(
        door,
        lambda x: jax.lax.with_sharding_constraint(x * 2, rs),
        lambda: ((sharded((8, 4), mesh, P("x")),), {}),
        donate_argnums=0,
    )


def test_jit_no_forwarding(door: Any) -> None:
    mesh = make_mesh((2,), ("x",))

    def run(wrap: Any) -> tuple[list[bool], Any]:
        f = wrap(lambda x: (x, x * 2), donate_argnums=(0,))
        x = jax.device_put(jnp.zeros(64, dtype="int32"), NamedSharding(mesh, P()))
        jaxpr = jax.make_jaxpr(f)(x)
        y = jax.extend.core.jaxpr_as_fun(jaxpr)(x)
        return [x.is_deleted(), *(v.is_deleted() for v in y)], y

    (ours, our_out), (theirs, their_out) = run(door), run(jax.jit)
    assert ours == theirs
    same(our_out, their_out)


# --- devices and meshes (ArrayPjitTest) ---


def test_with_sharding_constraint_jit_no_mesh(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((2, 2), ("x", "y"))

    def sharded_zeros(shape, pspec):
        out = jnp.zeros(shape, jnp.bfloat16)
        return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, pspec))

    ours = door(sharded_zeros, static_argnums=(0, 1))((16, 8), P("x", "y"))
    theirs = jax.jit(sharded_zeros, static_argnums=(0, 1))((16, 8), P("x", "y"))
    same(ours, theirs, equal_shardings=True)


def test_wsc_named_sharding_nullary(door: Any) -> None:
    s = NamedSharding(make_mesh((2,), ("x",)), P())

    def f():
        return jax.lax.with_sharding_constraint(jnp.arange(8), s)

    same(door(f)(), jax.jit(f)(), equal_shardings=True)


@pytest.mark.parametrize("spec", [P("x"), P(None, "y"), P()], ids=str)
def test_constraint_on_uncommitted_input_no_mesh(door: Any, partitioner_mode: Any, spec: P) -> None:
    # Uncommitted inputs, no mesh in context, a NamedSharding constraint in the body:
    # jax runs on the constraint's mesh, and both doors must too.
    s = NamedSharding(make_mesh((4, 2), ("x", "y")), spec)

    def f(a, b):
        return jax.lax.with_sharding_constraint(a @ b, s), a * 2

    a, b = jnp.arange(32.0).reshape(8, 4), jnp.ones((4, 8))
    same(door(f)(a, b), jax.jit(f)(a, b), equal_shardings=True)


@pytest.mark.parametrize("spec", [P("x"), P()], ids=str)
def test_device_put_in_body_on_uncommitted_input_no_mesh(
    door: Any, partitioner_mode: Any, spec: P
) -> None:
    s = NamedSharding(make_mesh((4,), ("x",)), spec)

    def f(a):
        return jax.device_put(a * 2, s)

    a = jnp.arange(32.0).reshape(8, 4)
    same(door(f)(a), jax.jit(f)(a), equal_shardings=True)


def test_device_put_in_jit_default_mem_kind_no_op(door: Any) -> None:
    mesh = make_mesh((2,), ("x",))
    arr = jax.device_put(np.arange(8), NamedSharding(mesh, P("x")))

    def f(x):
        return jax.device_put(x * 2, NamedSharding(mesh, P()))

    for marker in ("@Sharding", "@annotate_device_placement"):
        assert (marker in door(f).lower(arr).as_text()) == (
            marker in jax.jit(f).lower(arr).as_text()
        )
    same(door(f)(arr), jax.jit(f)(arr))


def test_jit_with_sharding_constraint_committed_inp_error(door: Any) -> None:
    s = NamedSharding(make_mesh((2, 2), ("x", "y")), P("x", "y"))

    def sharded_inp(inp):
        return jax.lax.with_sharding_constraint(inp, s)

    committed = jax.device_put(jnp.zeros((8, 2), jnp.bfloat16), jax.devices()[0])
    raises_like(
        lambda: door(sharded_inp)(committed),
        lambda: jax.jit(sharded_inp)(committed),
        INCOMPATIBLE_DEVICES,
        re.compile(
            r"Got argument inp of.*sharded_inp with shape bfloat16\[8,2\] and.*device ids \[0\]"
        ),
        "sharding_constraint inside jit with device ids",
        door=door,
    )


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "uncommitted"])
def test_jit_inside_jit_runs_where_the_enclosing_call_runs(
    door: Any, partitioner_mode: Any, committed: bool
) -> None:
    # No mesh in context: the inner call, given the outer body's values, runs on the
    # outer call's devices (the committed arguments' mesh), as jax.jit's does.
    mesh = make_mesh((4, 2), ("x", "y"))
    data = jnp.arange(32.0).reshape(8, 4)
    x = jax.device_put(data, NamedSharding(mesh, P("x", "y"))) if committed else data

    def outer(wrap: Any) -> Any:
        inner = wrap(lambda a: jnp.sin(a) * 2)
        return wrap(lambda a: inner(a) + inner(a.T).T)

    same(outer(door)(x), outer(jax.jit)(x), equal_shardings=True)


def test_nested_jit_with_committed_inp_error(door: Any) -> None:
    s = NamedSharding(make_mesh((2, 2), ("x", "y")), P("x", "y"))

    def nested(wrap):
        def my_nested_pjit(inp1, inp2, inp3):
            f = wrap(
                lambda x, y, z: (x * 2, y * 2, z * 2),
                in_shardings=(s, s, s),
                out_shardings=(s, s, s),
            )
            return f(inp1, inp2, inp3)

        return wrap(my_nested_pjit)

    committed = jax.device_put(jnp.zeros((8, 2), jnp.bfloat16), jax.devices()[0])
    args = (committed,) * 3
    raises_like(
        lambda: nested(door)(*args),
        lambda: nested(jax.jit)(*args),
        INCOMPATIBLE_DEVICES,
        re.compile(
            r"Got argument inp1 of.*my_nested_pjit with shape bfloat16\[8,2\] and.*device ids \[0\]"
        ),
        "jit inside jit with device ids",
        door=door,
    )


def test_jit_device_with_sharding_constraint_error(door: Any) -> None:
    mesh = make_mesh((2, 2), ("x", "y"))

    def sharded_zeros(shape, pspec):
        out = jnp.zeros(shape, jnp.bfloat16)
        return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, pspec))

    options = dict(static_argnums=(0, 1), device=jax.devices()[0])
    raises_like(
        lambda: door(sharded_zeros, **options)((16, 8), P("x", "y")),
        lambda: jax.jit(sharded_zeros, **options)((16, 8), P("x", "y")),
        INCOMPATIBLE_DEVICES,
        re.compile(
            r"Got explicit output sharding with device ids \[0\].*sharding_constraint inside jit with device ids"
        ),
        door=door,
    )


# pjit's None: replicated under the classic `with mesh:` only (jax's own pjit is the reference).


def _both_pjits(fun: Any, *args: Any, **options: Any) -> tuple[Any, Any]:
    return partitioner.pjit(fun, **options)(*args), jax_pjit(fun, **options)(*args)


NONE_SPECS = [
    pytest.param({"in_shardings": None, "out_shardings": None}, id="both-None"),
    pytest.param({"out_shardings": None}, id="out-None"),
    pytest.param({"in_shardings": None}, id="in-None"),
]


@pytest.mark.parametrize("options", NONE_SPECS)
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "uncommitted"])
@pytest.mark.parametrize("context", ["with-mesh", "set_mesh"])
def test_pjit_none_as_jax_pjit_reads_it(
    partitioner_mode: Any, options: dict[str, Any], committed: bool, context: str
) -> None:
    mesh = make_mesh((2, 2), ("x", "y"))
    x = sharded((8, 4), mesh, P("x")) if committed else jnp.arange(32.0).reshape(8, 4)

    def f(v):
        return v * 2

    def run(wrap: Any) -> Any:
        with mesh if context == "with-mesh" else jax.set_mesh(mesh):
            return wrap(f, **options)(x)

    try:
        theirs = run(jax_pjit)
    except ValueError as e:  # jax's pjit refuses: ours does too, with jax's sentence
        with pytest.raises(ValueError, match=re.escape(str(e).split(".")[0])):
            run(partitioner.pjit)
        return
    same(run(partitioner.pjit), theirs, equal_shardings=True)


@pytest.mark.parametrize("context", ["with-mesh", "set_mesh"])
def test_jit_none_under_a_mesh_context(context: str) -> None:
    # jax.jit's None is unspecified under any context, and jax.jit takes no devices
    # from the classic `with mesh:` (pjit's None is the test above).
    mesh = make_mesh((2, 2), ("x", "y"))
    for x in (sharded((8, 4), mesh, P("x")), jnp.arange(32.0).reshape(8, 4)):
        with mesh if context == "with-mesh" else jax.set_mesh(mesh):
            ours = partitioner.jit(lambda v: v * 2, out_shardings=None)(x)
            theirs = jax.jit(lambda v: v * 2, out_shardings=None)(x)
        same(ours, theirs, equal_shardings=True)


def test_pjit_none_with_named_shardings_and_no_context(partitioner_mode: Any) -> None:
    mesh = make_mesh((2, 2), ("x", "y"))
    u, x = jnp.arange(32.0).reshape(8, 4), sharded((8, 4), mesh, P("x"))
    ours, theirs = _both_pjits(
        lambda v, w: (v * 2, w * 2),
        u,
        x,
        in_shardings=(NamedSharding(mesh, P("y")), None),
        out_shardings=None,
    )
    same(ours, theirs, equal_shardings=True)


def test_none_out_sharding_under_with_mesh() -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    x = jnp.arange(8)
    with mesh:
        ours, theirs = _both_pjits(lambda v: v * 2, x, out_shardings=None)
    same(ours, theirs, equal_shardings=True)
    x2 = jax.device_put(x, NamedSharding(mesh, P()))
    same(partitioner.pjit(lambda v: v * 2)(x2), jax_pjit(lambda v: v * 2)(x2), equal_shardings=True)


def test_trivial_computation_with_replicated_literal(door: Any) -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    with mesh:
        same(door(lambda: 1)(), jax_twin(door)(lambda: 1)(), equal_shardings=True)


@pytest.mark.parametrize("mesh_shape", [(2, 1), (1, 2)], ids=["same-mesh", "transposed-mesh"])
def test_trivial_computation_with_sharded_const(door: Any, mesh_shape: Any) -> None:
    const = sharded((8, 2), make_mesh((2, 1), ("x", "y")), P("x", "y"))
    with make_mesh(mesh_shape, ("x", "y")):
        same(door(lambda: const)(), jax_twin(door)(lambda: const)())


def test_trivial_computation(door: Any) -> None:
    arr = sharded((8, 2), make_mesh((2, 2), ("x", "y")), P("x", "y"))
    same(door(lambda x: x)(arr), jax.jit(lambda x: x)(arr), equal_shardings=True)


def test_multi_device_pjit_mul(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((4, 2), ("x", "y"))
    a1, a2 = sharded((8, 2), mesh, P("x", "y")), sharded((8, 2), mesh, P(None, "y"))
    same(
        door(lambda x, y: (x @ x.T, y * 2))(a1, a2),
        jax.jit(lambda x, y: (x @ x.T, y * 2))(a1, a2),
    )


def test_vmap_of_unspecified_jit_over_committed(door: Any, partitioner_mode: Any) -> None:
    arr = sharded((4, 8), make_mesh((2, 2), ("x", "y")), P(None, "x"))
    same(
        jax.vmap(door(lambda v: v * 2))(arr),
        jax.vmap(jax.jit(lambda v: v * 2))(arr),
        equal_shardings=True,
    )


def test_sharding_on_output_with_vmap(door: Any) -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    ns = NamedSharding(mesh, P("x"))
    arr = sharded((8, 2), mesh, P(None, "x"))
    ours_f, theirs_f = (
        jax.vmap(door(lambda x: x * 2, in_shardings=ns)),
        jax.vmap(jax.jit(lambda x: x * 2, in_shardings=ns)),
    )
    ours, theirs = arr, arr
    for _ in range(3):
        ours, theirs = ours_f(ours), theirs_f(theirs)
        same(ours, theirs)


def test_vmap_of_jvp_jit_no_shardings(door: Any) -> None:
    mesh = make_mesh((2, 2), ("x", "y"))
    inp1 = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
    inp2 = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P(("x", "y"))))

    def nested(wrap):
        def f_(x, n):
            if n == 0:
                return x * 2.0
            return wrap(functools.partial(f_, n=n - 1))(x - 1)

        return wrap(functools.partial(f_, n=5))

    ours = jax.vmap(lambda xs, ts: jax.jvp(nested(door), xs, ts))((inp1,), (inp2,))
    theirs = jax.vmap(lambda xs, ts: jax.jvp(nested(jax.jit), xs, ts))((inp1,), (inp2,))
    same(ours, theirs)


def test_spmd_preserves_input_sharding_vmap_grad(door: Any) -> None:
    mesh = jax.sharding.Mesh(jax.devices(), "x")
    x = jax.device_put(jnp.ones((8, 3)), NamedSharding(mesh, P("x")))
    params = jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))

    def model(params, x):
        return x @ params

    for wrap_fun in (
        lambda w: w(model),
        lambda w: w(jax.vmap(model, in_axes=(None, 0))),
        lambda w: w(jax.grad(lambda p, x: model(p, x).sum())),
        lambda w: w(jax.vmap(jax.grad(model), in_axes=(None, 0))),
    ):
        same(wrap_fun(door)(params, x), wrap_fun(jax.jit)(params, x))


def test_same_out_sharding_id(door: Any) -> None:
    arr = sharded((8, 2), make_mesh((4, 2), ("x", "y")), P("x", "y"))
    f = door(lambda x: x)
    out1 = f(arr)
    out2 = f(out1)
    out3 = f(out2)
    same(out3, jax.jit(lambda x: x)(arr))
    assert out1.sharding is out2.sharding is out3.sharding


def test_nested_jit_output_under_jax_jit(door: Any) -> None:
    # A partitioner function inside jax.jit on one device: jax.jit's result sharding.
    x = jnp.arange(4.0)
    same(jax.jit(door(lambda v: v * 2))(x), jax.jit(jax.jit(lambda v: v * 2))(x))
    same(
        jax.jit(jax.grad(door(lambda v: (v * v).sum())))(x),
        jax.jit(jax.grad(jax.jit(lambda v: (v * v).sum())))(x),
    )


def test_pmap_output_input_to_jit(door: Any) -> None:
    pmap_out = jax.pmap(lambda x: x)(jnp.arange(jax.device_count()))
    same(door(lambda x: x * 3)(pmap_out), jax.jit(lambda x: x * 3)(pmap_out))


def test_nullary_out_sharding_partial(door: Any) -> None:
    mesh = make_mesh((jax.device_count(),), ("x",))

    def init():
        return jnp.zeros(shape=(1,)), jnp.zeros(shape=(1,))

    options = dict(out_shardings=(None, NamedSharding(mesh, P())))
    same(door(init, **options)(), jax.jit(init, **options)(), equal_shardings=True)


def test_input_shardings_aot(door: Any) -> None:
    arr = sharded((8, 2), make_mesh((2, 1), ("x", "y")), P("x"))
    np_inp = np.arange(16.0, dtype=np.float32).reshape(8, 2)

    def f(x, y):
        return x * 2, y.T

    ours = door(f).lower(arr, np_inp).compile()
    theirs = jax.jit(f).lower(arr, np_inp).compile()
    assert ours.input_shardings == theirs.input_shardings
    assert ours.output_shardings == theirs.output_shardings


def test_compiled_out_info(door: Any) -> None:
    arr = jax.device_put(
        np.arange(8, dtype=np.int32), NamedSharding(make_mesh((2,), ("x",)), P("x"))
    )
    ours, theirs = door(lambda x: x * 2).lower(arr), jax.jit(lambda x: x * 2).lower(arr)
    for o, t in ((ours, theirs), (ours.compile(), theirs.compile())):
        assert (o.out_info.shape, o.out_info.dtype, o.out_info.sharding) == (
            t.out_info.shape,
            t.out_info.dtype,
            t.out_info.sharding,
        )


# --- devices that do not fit together: jax's messages, arguments named as jax names them ---


def test_array_device_assignment_mismatch_with_mesh(door: Any) -> None:
    arr = sharded((8, 2), make_mesh((2, 2), ("x", "y")), P("x", "y"))
    mesh = make_mesh((4, 2), ("x", "y"))
    with mesh:  # the classic context: jax's pjit refuses, jax.jit takes no devices from it
        same_outcome(
            lambda: door(lambda x: x)(arr),
            lambda: jax_twin(door)(lambda x: x)(arr),
            INCOMPATIBLE_DEVICES,
            door=door,
        )
    with jax.set_mesh(mesh):  # jax.jit refuses; jax's pjit takes no devices from set_mesh
        same_outcome(
            lambda: door(lambda x: x)(arr),
            lambda: jax_twin(door)(lambda x: x)(arr),
            INCOMPATIBLE_DEVICES,
            door=door,
        )


def test_array_device_assignment_mismatch_out_shardings(door: Any) -> None:
    m1, m2 = make_mesh((4, 2), ("x", "y")), make_mesh((2, 2), ("x", "y"))
    a1 = jnp.arange(16).reshape(8, 2)
    options = dict(out_shardings=(NamedSharding(m1, P("x", "y")), NamedSharding(m2, P("x", "y"))))
    raises_like(
        lambda: door(lambda x, y: (x, y), **options)(a1, a1),
        lambda: jax.jit(lambda x, y: (x, y), **options)(a1, a1),
        INCOMPATIBLE_DEVICES,
        door=door,
    )


def test_array_device_assignment_mismatch_in_and_out_shardings(door: Any) -> None:
    m1, m2 = make_mesh((4, 2), ("x", "y")), make_mesh((2, 2), ("x", "y"))
    a1 = jnp.arange(16).reshape(8, 2)
    options = dict(
        in_shardings=NamedSharding(m2, P("x", "y")), out_shardings=NamedSharding(m1, P("x", "y"))
    )
    raises_like(
        lambda: door(lambda x, y: (x, y), **options)(a1, a1),
        lambda: jax.jit(lambda x, y: (x, y), **options)(a1, a1),
        INCOMPATIBLE_DEVICES,
        door=door,
    )


def _on_devices_0_and_1() -> tuple[jax.Array, jax.Array]:
    return (
        jax.device_put(np.array([1, 2, 3]), jax.devices()[0]),
        jax.device_put(np.array([4, 5, 6]), jax.devices()[1]),
    )


def test_committed_array_different_devices(door: Any) -> None:
    a, b = _on_devices_0_and_1()
    raises_like(
        lambda: door(lambda x, y: (x, y))(a, b),
        lambda: jax.jit(lambda x, y: (x, y))(a, b),
        INCOMPATIBLE_DEVICES,
        re.compile(
            r"Got argument x of.*\<lambda\> with shape int.*\[3\] and.*device ids \[0\].*and "
            r"argument y of.*\<lambda\> with shape int.*\[3\] and.*device ids \[1\]"
        ),
        door=door,
    )


def test_committed_array_different_devices_variadic_args(door: Any) -> None:
    a, b = _on_devices_0_and_1()
    raises_like(
        lambda: door(lambda *x: x)(a, b),
        lambda: jax.jit(lambda *x: x)(a, b),
        INCOMPATIBLE_DEVICES,
        re.compile(
            r"Got argument x\[0\] of.*\<lambda\> with shape int.*\[3\] and.*device ids \[0\].*and "
            r"argument x\[1\] of.*\<lambda\> with shape int.*\[3\] and.*device ids \[1\]"
        ),
        door=door,
    )


def test_pytree_inp_device_assignment_mismatch(door: Any) -> None:
    a, b = _on_devices_0_and_1()
    c = sharded((8, 2), make_mesh((2, 2), ("x", "y")), P("x", "y"), dtype=np.int32)
    msg = (
        r"Received incompatible devices for jitted computation. Got argument {} of.*<lambda> with "
        r"shape int.*\[3\] and.*device ids \[0\].*and argument {} of.*<lambda> with shape "
        r"int.*\[8,2\] and.*device ids"
    )
    raises_like(
        lambda: door(lambda tuple_inp: tuple_inp)((a, (c, (b)))),
        lambda: jax.jit(lambda tuple_inp: tuple_inp)((a, (c, (b)))),
        re.compile(msg.format(r"tuple_inp\[0\]", r"tuple_inp\[1\]\[0\]")),
        door=door,
    )
    inp = {"d": a, "z": a, "a": {"f": a, "y": b, "b": {"g": c, "c": a}}}
    raises_like(
        lambda: door(lambda dict_inp: dict_inp)(inp),
        lambda: jax.jit(lambda dict_inp: dict_inp)(inp),
        re.compile(msg.format(r"dict_inp\['a'\]\['b'\]\['c'\]", r"dict_inp\['a'\]\['b'\]\['g'\]")),
        door=door,
    )


def test_in_shardings_mismatch_error(door: Any) -> None:
    mesh = make_mesh((4, 2), ("x", "y"))
    arr = sharded((8, 2), mesh, P("x", "y"))
    s = NamedSharding(mesh, P("x"))
    for arg in (arr, {"b": arr}):
        raises_like(
            lambda arg=arg: door(lambda x: x, in_shardings=s)(arg),
            lambda arg=arg: jax.jit(lambda x: x, in_shardings=s)(arg),
            "Sharding passed to jit does not match the sharding on the respective arg",
            door=door,
        )


# --- jax's messages for bad options and specs (ArrayPjitTest, PJitErrorTest) ---


def test_kwargs_with_in_shardings_accepted(door: Any) -> None:
    # A difference kept on purpose (docs/api.md): jax refuses keyword arguments when
    # in_shardings is given; partitioner gives a keyword argument its parameter's spec.
    s = SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(ValueError, match="does not support kwargs when in_shardings is specified"):
        jax.jit(lambda x: x, in_shardings=s)(x=jnp.arange(8.0))
    ours = door(lambda x: x, in_shardings=s)(x=jnp.arange(8.0))
    same(ours, jax.jit(lambda x: x, in_shardings=s)(jnp.arange(8.0)), equal_shardings=True)


def test_device_backend_and_shardings_error(door: Any) -> None:
    s = SingleDeviceSharding(jax.devices()[0])
    for options, key in (
        (dict(in_shardings=s, backend="cpu"), "in_shardings should not be specified."),
        (dict(out_shardings=s, device=jax.devices()[0]), "out_shardings should not be specified."),
    ):
        raises_like(
            lambda o=options: door(lambda x: x, **o),
            lambda o=options: jax.jit(lambda x: x, **o),
            "If backend or device is specified on jit, then",
            key,
            door=door,
        )


def test_device_and_backend_both_error(door: Any) -> None:
    options = dict(device=jax.devices()[0], backend="cpu")
    raises_like(
        lambda: door(lambda x: x, **options),
        lambda: jax.jit(lambda x: x, **options),
        "can't specify both a device and a backend for jit",
        door=door,
    )


def test_mesh_context_with_device(door: Any) -> None:
    # jax's pjit refuses a classic `with mesh:` with device=; jax.jit 0.10.2 runs it.
    with make_mesh((1,), ("x",)):
        same_outcome(
            lambda: door(lambda x: x, device=jax.devices()[0])(jnp.arange(8)),
            lambda: jax_twin(door)(lambda x: x, device=jax.devices()[0])(jnp.arange(8)),
            door=door,
        )
    if door is partitioner.pjit:
        with make_mesh((1,), ("x",)):
            raises_like(
                lambda: door(lambda x: x, device=jax.devices()[0])(jnp.arange(8)),
                lambda: jax_pjit(lambda x: x, device=jax.devices()[0])(jnp.arange(8)),
                "Mesh context manager should not be used with jit when backend or device is "
                "also specified as an argument to jit.",
            )


def test_in_out_shardings_unconstrained_error(door: Any) -> None:
    s = NamedSharding(make_mesh((1,), ("x",)), P(P.UNCONSTRAINED, "x"))
    raises_like(
        lambda: door(lambda x: x, in_shardings=s),
        lambda: jax.jit(lambda x: x, in_shardings=s),
        "Unconstrained dims are not allowed",
        door=door,
    )


def test_partition_spec_needs_a_mesh(door: Any) -> None:
    raises_like(
        lambda: door(lambda x: x, in_shardings=P("x"))(np.ones(4)),
        lambda: jax.jit(lambda x: x, in_shardings=P("x"))(np.ones(4)),
        "requires a non-empty mesh in context if you are passing `PartitionSpec`s to in_shardings",
        door=door,
    )


def test_constraint_spec_needs_a_mesh(door: Any) -> None:
    raises_like(
        lambda: door(lambda x: jax.lax.with_sharding_constraint(x, P("x")))(jnp.arange(4)),
        lambda: jax.jit(lambda x: jax.lax.with_sharding_constraint(x, P("x")))(jnp.arange(4)),
        "with_sharding_constraint requires a non-empty mesh in context",
        door=door,
    )


MESHES = [
    pytest.param((2,), ("x",), "x", id="2"),
    pytest.param((2, 1), ("x", "y"), ("x", "y"), id="2x1"),
    pytest.param((2, 2), ("x", "y"), ("x", "y"), id="2x2"),
    pytest.param((4,), ("x",), "x", id="4"),
]


@pytest.mark.parametrize("shape, names, resources", MESHES)
def test_non_divisible_args(door: Any, shape: Any, names: Any, resources: Any) -> None:
    s = NamedSharding(make_mesh(shape, names), P(resources, None))
    n = int(np.prod(shape))
    x = jnp.ones((3, 2))
    raises_like(
        lambda: door(lambda x: x, in_shardings=s)(x),
        lambda: jax.jit(lambda x: x, in_shardings=s)(x),
        f"implies that array axis 0 is partitioned {n} times",
        "should evenly divide the shape",
        door=door,
    )


@pytest.mark.parametrize("shape, names, resources", MESHES)
def test_non_divisible_outs(door: Any, shape: Any, names: Any, resources: Any) -> None:
    s = NamedSharding(make_mesh(shape, names), P(resources, None))
    n = int(np.prod(shape))
    x = jnp.ones((3, 2))
    raises_like(
        lambda: door(lambda x: {"rrr": x}, out_shardings=s)(x),
        lambda: jax.jit(lambda x: {"rrr": x}, out_shardings=s)(x),
        f"implies that array axis 0 is partitioned {n} times",
        "should evenly divide the shape",
        door=door,
    )


@pytest.mark.parametrize("where", ["in_shardings", "out_shardings", "constraint"])
@pytest.mark.parametrize("resources", ["x", ("x", "y")], ids=["x", "xy"])
def test_undefined_resources(door: Any, where: str, resources: Any) -> None:
    spec = P(resources)
    x = jnp.ones((2, 2))

    def call(wrap: Any) -> Any:
        with jax.set_mesh(make_mesh((1,), ("z",))):
            if where == "constraint":
                return wrap(lambda x: jax.lax.with_sharding_constraint(x, spec))(x)
            return wrap(lambda x: x, **{where: spec})(x)

    raises_like(
        lambda: call(door),
        lambda: call(jax.jit),
        re.compile(
            r"Resource axis: x of.*" + re.escape(str(spec)) + r" is not found in mesh: \(.*\)."
        ),
        door=door,
    )


def test_rank_too_low(door: Any) -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    x = jnp.arange(2)
    for spec in (P("x", "y"), P(None, None)):
        s = NamedSharding(mesh, spec)
        raises_like(
            lambda s=s: door(lambda x: x.sum(), in_shardings=s)(x),
            lambda s=s: jax.jit(lambda x: x.sum(), in_shardings=s)(x),
            "with pytree key path x ",
            "is only valid for values of rank at least 2, but was applied to a value of rank 1",
            door=door,
        )
    s = NamedSharding(mesh, P("x", "y"))
    raises_like(
        lambda: door(lambda x: x.sum(), out_shardings=s)(x),
        lambda: jax.jit(lambda x: x.sum(), out_shardings=s)(x),
        "is only valid for values of rank at least 2, but was applied to a value of rank 0",
        door=door,
    )


def test_rank_too_low_constraint(door: Any) -> None:
    s = NamedSharding(
        make_mesh((1, 1, 2), ("replica", "data", "mdl")), P(None, ("mdl",), None, None)
    )

    def f(x):
        return jax.lax.with_sharding_constraint(x, s) + 2

    raises_like(
        lambda: door(f)(jnp.array([1, 2, 3])),
        lambda: jax.jit(f)(jnp.array([1, 2, 3])),
        re.compile(
            r"One of with_sharding_constraint.*Sharding NamedSharding.*P\(None, 'mdl', None, None\).*\) "
            r"is only valid for values of rank at least 4, but was applied to a value of rank 1"
        ),
        door=door,
    )


@pytest.mark.parametrize("where", ["in_shardings", "out_shardings"])
def test_repeated_resources(door: Any, where: str) -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    x = jnp.arange(2)
    for spec in (P("x", "x"), P("x", ("y", "x"))):
        raises_like(
            lambda spec=spec: door(lambda x: x, **{where: NamedSharding(mesh, spec)})(x),
            lambda spec=spec: jax.jit(lambda x: x, **{where: NamedSharding(mesh, spec)})(x),
            "can map every mesh axis to at most one positional dimension",
            f"{spec} has duplicate entries for `x`",
            door=door,
        )


def test_in_shardings_tuple_of_the_wrong_length(door: Any) -> None:
    x = jnp.ones([])
    p = [None, None, None]
    same(
        door(lambda x: x, in_shardings=(p,), out_shardings=p)([x, x, x]),
        jax.jit(lambda x: x, in_shardings=(p,), out_shardings=p)([x, x, x]),
    )
    raises_like(
        lambda: door(lambda x, y: x, in_shardings=p, out_shardings=p)(x, x),
        lambda: jax.jit(lambda x, y: x, in_shardings=p, out_shardings=p)(x, x),
        "in_shardings specification must be a tree prefix of the positional arguments tuple.",
        "is the wrong length: got a tuple or list of length 3 for an args tuple of length 2.",
        door=door,
    )


def test_in_shardings_not_a_tuple(door: Any) -> None:
    Foo = namedtuple("Foo", ["x"])
    x = jnp.ones([])
    raises_like(
        lambda: door(lambda x: x, in_shardings=Foo(None), out_shardings=Foo(None))(Foo(x)),
        lambda: jax.jit(lambda x: x, in_shardings=Foo(None), out_shardings=Foo(None))(Foo(x)),
        re.compile("in_shardings is not a tuple.*might need to be wrapped"),
        door=door,
    )
    same(
        door(lambda x: x, in_shardings=(Foo(None),), out_shardings=Foo(None))(Foo(x)),
        jax.jit(lambda x: x, in_shardings=(Foo(None),), out_shardings=Foo(None))(Foo(x)),
    )


def test_out_shardings_tree_mismatch(door: Any) -> None:
    x = jnp.ones([])
    p = [None, None, None]
    raises_like(
        lambda: door(lambda x: x, in_shardings=(p,), out_shardings=[p, None])([x, x, x]),
        lambda: jax.jit(lambda x: x, in_shardings=(p,), out_shardings=[p, None])([x, x, x]),
        "pytree structure error: different lengths of list at key path\n",
        door=door,
    )


def test_out_shardings_mismatch_shows_all_details(door: Any) -> None:
    x = jnp.ones([])
    specs = {"a": [None, None], "b": (None, None)}
    raises_like(
        lambda: door(lambda x: x, out_shardings=specs)({"a": x, "b": x}),
        lambda: jax.jit(lambda x: x, out_shardings=specs)({"a": x, "b": x}),
        "Mismatch details (2 found)",
        door=door,
    )


@pytest.mark.parametrize("committed", [True, False])
def test_deleted_committed_input(door: Any, committed: bool) -> None:
    mesh = make_mesh((1,), ("x",))

    def make():
        data = np.arange(8)
        return (
            jax.device_put(data, NamedSharding(mesh, P("x"))) if committed else jax.device_put(data)
        )

    x, y = make(), make()
    x.delete()
    y.delete()
    raises_like(
        lambda: door(lambda v: v + 1)(x),
        lambda: jax.jit(lambda v: v + 1)(y),
        "has been deleted",
        door=door,
    )


# --- explicit axes: results spelled as jax spells them ---


def _explicit_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(names))


EXPLICIT = [
    pytest.param(lambda v: v * 2, {}, id="elementwise"),
    pytest.param(lambda v: v.T, {}, id="transpose"),
    pytest.param(lambda v: v.sum(0), {}, id="sum0"),
    pytest.param(lambda v: v.sum(1), {}, id="sum1"),
    pytest.param(lambda v: v.reshape(8, 2, 2), {}, id="reshape"),
    pytest.param(lambda v: v * 2, {"out_shardings": P("x")}, id="out_shardings-P"),
    pytest.param(lambda v: v * 2, {"out_shardings": P("x", None)}, id="out_shardings-P-long"),
    pytest.param(lambda v: v * 2, {"in_shardings": P("x")}, id="in_shardings-P"),
    pytest.param(lambda v: jax.sharding.reshard(v, P("x")), {}, id="reshard"),
    pytest.param(lambda v: jax.sharding.reshard(v, P(None, "x")), {}, id="reshard-other"),
    pytest.param(lambda v: jnp.ones((8, 4), out_sharding=P("x")) + v, {}, id="ones"),
]


@pytest.mark.parametrize("fun, options", EXPLICIT)
def test_explicit_axes_result_spec(
    door: Any, partitioner_mode: Any, fun: Any, options: Any
) -> None:
    mesh = _explicit_mesh((4,), ("x",))
    with jax.set_mesh(mesh):
        x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), P("x"))
        ours, theirs = door(fun, **options)(x), jax.jit(fun, **options)(x)
    same(ours, theirs, equal_shardings=True)
    assert ours.sharding.spec == theirs.sharding.spec
    assert jax.typeof(ours) == jax.typeof(theirs)


def test_explicit_axes_out_shardings_spelled_as_given(door: Any, partitioner_mode: Any) -> None:
    mesh = _explicit_mesh((4,), ("x",))
    with jax.set_mesh(mesh):
        x = np.ones((8, 4), np.float32)
        out = door(lambda v: v * 2, out_shardings=P("x"))(x)
        theirs = jax.jit(lambda v: v * 2, out_shardings=P("x"))(x)
    assert theirs.sharding == NamedSharding(mesh, P("x"))
    assert out.sharding == NamedSharding(mesh, P("x"))


# --- a training step: flax + optax, state committed sharded, donated, no shardings ---


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.relu(nn.Dense(8)(x)))


def _train_state(mesh: Any) -> tuple[Any, Any, Any]:
    model, tx = _MLP(), optax.adam(1e-2)
    params = model.init(jax.random.key(0), jnp.ones((8, 8)))

    def spec(leaf):  # shard every dimension divisible by the mesh, replicate the rest
        if leaf.ndim >= 1 and leaf.shape[-1] % 4 == 0:
            return NamedSharding(mesh, P(*([None] * (leaf.ndim - 1)), "x"))
        return NamedSharding(mesh, P())

    state = (params, tx.init(params))
    state = jax.tree.map(lambda leaf: jax.device_put(leaf, spec(leaf)), state)
    return model, tx, state


def test_flax_optax_step_donated_committed_state(door: Any, partitioner_mode: Any) -> None:
    mesh = make_mesh((4,), ("x",))
    model, tx, _ = _train_state(mesh)
    batch = jax.device_put(
        np.random.RandomState(0).randn(8, 8).astype(np.float32), NamedSharding(mesh, P("x"))
    )
    target = jax.device_put(
        np.random.RandomState(1).randn(8, 4).astype(np.float32), NamedSharding(mesh, P("x"))
    )

    def step(state, x, y):
        params, opt_state = state

        def loss_fn(p):
            return jnp.mean((model.apply(p, x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    ours_step, theirs_step = door(step, donate_argnums=0), jax.jit(step, donate_argnums=0)
    ours_state, theirs_state = _train_state(mesh)[2], _train_state(mesh)[2]
    for i in range(17):  # past the dispatcher's window of 16 in-flight calls
        old_ours, old_theirs = ours_state, theirs_state
        (theirs_state, their_loss), their_warnings = donation_warnings(
            lambda s=old_theirs: theirs_step(s, batch, target)
        )
        (ours_state, our_loss), our_warnings = donation_warnings(
            lambda s=old_ours: ours_step(s, batch, target)
        )
        assert deleted(old_ours) == deleted(old_theirs), (i, "consumed inputs differ")
        np.testing.assert_allclose(np.asarray(our_loss), np.asarray(their_loss), rtol=1e-5)
        same_donation_warnings(our_warnings, their_warnings)
    assert all(deleted(old_theirs)), "jax.jit consumes the donated state"
    for a, b in zip(jax.tree.leaves(ours_state), jax.tree.leaves(theirs_state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)

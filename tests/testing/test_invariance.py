"""``partitioner.testing.assert_sharding_invariant`` and ``strategies.argument_shardings``.

The check must find a ``custom_partitioning`` rule that is right only while an axis is
whole (it runs a cumulative sum on each device's block, so a split of the summed
dimension gives each block its own running total), and pass the correct rule and
functions with sharding constraints inside, on Auto and Explicit meshes.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AxisType, Mesh, NamedSharding

from partitioner import PartitionSpec as P
from partitioner import with_sharding_constraint
from partitioner.testing import assert_sharding_invariant, strategies

pytestmark = pytest.mark.slow  # each drawn layout compiles a program


def running_total(whole_rows: bool):
    """``cumsum`` over rows as a custom_partitioning op; with ``whole_rows`` False the
    rule keeps the rows split as they come (right only while they are whole)."""

    @custom_partitioning
    def op(x):
        return jnp.cumsum(x, axis=0)

    def spec_of(sharding):
        spec = tuple(sharding.spec) + (None,) * 2
        return P(*spec[:2]) if not whole_rows else P(None, spec[1])

    def infer(mesh, arg_shapes, result_shape):
        return NamedSharding(mesh, spec_of(arg_shapes[0].sharding))

    def partition(mesh, arg_shapes, result_shape):
        out = NamedSharding(mesh, spec_of(arg_shapes[0].sharding))
        return mesh, (lambda x: jnp.cumsum(x, axis=0)), out, (out,)

    op.def_partition(
        infer_sharding_from_operands=infer, partition=partition, sharding_rule="i j -> i j"
    )
    return op


X = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) / 7


def test_finds_a_rule_right_only_while_an_axis_is_whole() -> None:
    with pytest.raises(AssertionError) as e:
        assert_sharding_invariant(running_total(False), X, max_examples=15)
    message = str(e.value)
    assert "output differs from jax.jit's on one device over mesh" in message
    # shrunk to two devices, splitting the rows (the axis' name depends on the run)
    assert "(devices [0, 1])" in message, message
    assert re.search(r"args\[0\]: P\('[a-h]', None\)", message), message
    assert "partitioned:" in message and "one device:" in message


@pytest.mark.parametrize("partitioner_name", ["gspmd", "shardy"])
def test_passes_the_correct_rule(partitioner_name: str) -> None:
    import partitioner

    with partitioner.spmd_partitioner(partitioner_name):
        assert_sharding_invariant(running_total(True), X, max_examples=6)


def test_passes_a_function_with_constraints_inside_and_asked_output_layouts() -> None:
    def layer(x, w, *, scale):
        h = with_sharding_constraint(jnp.tanh(x @ w), P("data", "model"))
        return {"h": h * scale, "norm": jnp.sum(h**2, axis=-1)}

    w = np.linspace(-1, 1, 4 * 6, dtype=np.float32).reshape(4, 6)
    named = strategies.meshes(
        axis_names=("data", "model"), min_axes=2, max_axes=2, axis_types=(AxisType.Auto,)
    )
    assert_sharding_invariant(
        layer, X, w, scale=0.5, meshes=named, out_shardings=True, max_examples=10
    )


def test_explicit_axes_when_asked() -> None:
    assert_sharding_invariant(lambda x: jnp.sin(x).sum(0), X, axis_types="explicit", max_examples=8)


@pytest.mark.parametrize("axis_types", [AxisType.Explicit, (AxisType.Explicit,)])
def test_axis_types_as_jax_takes_them(axis_types) -> None:
    seen = set()

    def f(x):
        seen.update(jax.sharding.get_abstract_mesh().axis_types)
        return jnp.sin(x).sum(0)

    assert_sharding_invariant(f, X, axis_types=axis_types, max_examples=3)
    assert seen == {AxisType.Explicit}


def _two_devices() -> st.SearchStrategy[Mesh]:
    """Always the same mesh, over two devices: every example is split."""
    return st.just(Mesh(np.array(jax.devices()[:2]), ("x",), axis_types=(AxisType.Auto,)))


def _split() -> bool:
    """Whether ``f`` is being traced over a mesh that splits: the drawn meshes here do,
    the one-device reference's (every axis of size 1) does not."""
    return math.prod(jax.sharding.get_abstract_mesh().axis_sizes) > 1


def test_nan_equals_nan_in_the_check_and_in_its_message() -> None:
    x = np.arange(8, dtype=np.float32)
    x[0] = np.nan
    assert_sharding_invariant(lambda v: 2 * v, x, meshes=_two_devices(), max_examples=3)

    def one_off_where_split(v):
        return v.at[1].add(1.0) if _split() else v

    # The NaN both sides compute at [0] is no difference: one element differs, at [1].
    with pytest.raises(AssertionError, match=r"\b1 of 8 elements differ .*, first at \(1,\)"):
        assert_sharding_invariant(one_off_where_split, x, meshes=_two_devices(), max_examples=3)


def test_bfloat16_outputs_compare_within_their_tolerance() -> None:
    x = np.ones(8, jnp.bfloat16)

    def one_step_up_where_split(v):
        # 1 + 2**-7 is the next bfloat16 above 1: inside TOLERANCES["bfloat16"] (2e-2).
        return v * jnp.bfloat16(1 + 2**-7) if _split() else v

    assert_sharding_invariant(one_step_up_where_split, x, meshes=_two_devices(), max_examples=3)
    with pytest.raises(AssertionError, match="8 of 8 elements differ"):  # it does differ
        assert_sharding_invariant(
            one_step_up_where_split, x, meshes=_two_devices(), max_examples=3, rtol=0, atol=0
        )


def test_the_message_names_the_output_layouts_drawn() -> None:
    def one_off_where_split(v):
        return v.at[1].add(1.0) if _split() else v

    with pytest.raises(AssertionError, match=r"\n  out: P\("):
        assert_sharding_invariant(
            one_off_where_split, X, meshes=_two_devices(), out_shardings=True, max_examples=3
        )


def test_only_the_arguments_asked_for_are_laid_out() -> None:
    seen = []

    def f(x, y):
        seen.append(None)
        return x * y

    # y stays as it is (a host array): the function still gets both, every time.
    assert_sharding_invariant(f, X, 2 * X, argnums=(0,), max_examples=5)
    assert seen


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: assert_sharding_invariant(None, X), TypeError, "f must be callable"),
        (
            lambda: assert_sharding_invariant(jnp.sin, X, axis_types="manual"),
            ValueError,
            "axis_types must be AxisType.Auto or AxisType.Explicit .* got 'manual'",
        ),
        (
            lambda: assert_sharding_invariant(jnp.sin, X, axis_types="sideways"),
            ValueError,
            "assert_sharding_invariant: axis_types must be a jax.sharding.AxisType .* "
            "got 'sideways'",
        ),
        (
            lambda: assert_sharding_invariant(jnp.sin, X, axis_types=1.5),
            TypeError,
            "assert_sharding_invariant: axis_types must be .* got 1.5",
        ),
        (
            lambda: assert_sharding_invariant(jnp.sin, X, argnums=(3,)),
            ValueError,
            "argnums .* out of range for 1 positional",
        ),
        (
            lambda: assert_sharding_invariant(jnp.sin, np.ones((3, 5)), np.float32(2.0)),
            ValueError,
            r"no mesh over the 8 devices can split any argument .*\(3, 5\)",
        ),
    ],
)
def test_bad_arguments(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_argument_shardings_divide_every_leaf(data) -> None:
    mesh = data.draw(strategies.meshes())
    args = {
        "w": jax.ShapeDtypeStruct((6, 4), jnp.float32),
        "b": np.zeros((3,), np.float32),
        "n": 3,
        "s": np.float32(1.0),
    }
    drawn = data.draw(strategies.argument_shardings(mesh, args))
    assert drawn["n"] is None
    for name in ("w", "b", "s"):
        shape = np.shape(args[name])
        block = drawn[name].shard_shape(shape)  # raises where it does not divide
        assert all(n % b == 0 for n, b in zip(shape, block))


def test_finds_a_shard_map_missing_its_psum() -> None:
    def column_sums(x):
        # Each device sums its rows; the psum over "x" that would add the blocks is missing.
        partial = jax.shard_map(
            lambda b: b.sum(0, keepdims=True), in_specs=P("x"), out_specs=P(), check_vma=False
        )
        return partial(x)

    one_axis = strategies.meshes(axis_names=("x",), max_axes=1, axis_types=(AxisType.Auto,))
    with pytest.raises(AssertionError, match="output differs"):
        assert_sharding_invariant(column_sums, X, meshes=one_axis, max_examples=10)

    def with_psum(x):
        summed = jax.shard_map(
            lambda b: jax.lax.psum(b.sum(0, keepdims=True), "x"),
            in_specs=P("x"),
            out_specs=P(),
            check_vma=False,
        )
        return summed(x)

    assert_sharding_invariant(with_psum, X, meshes=one_axis, max_examples=10)


def test_a_flax_model_and_an_optax_update_pass() -> None:
    nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.gelu(nn.Dense(16)(x)))

    model, tx = MLP(), optax.adamw(1e-2)
    params = jax.jit(model.init)(jax.random.key(0), X)
    state = jax.jit(tx.init)(params)

    def step(params, state, x):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(model.apply(p, x) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    assert_sharding_invariant(model.apply, params, X, max_examples=4)
    assert_sharding_invariant(step, params, state, X, max_examples=4, rtol=1e-4, atol=1e-5)

"""vmap of pjit and of with_sharding_constraint.

Numbers are compared with ``jax.vmap`` of the same plain function under
``jax.jit``; specs are read from ``jax.make_jaxpr`` and the lowered text. Every
test runs under GSPMD and Shardy (``partitioner_mode``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from partitioner import ParsedPartitionSpec, pjit, with_sharding_constraint
from partitioner import PartitionSpec as P
from tests.helpers import MESH_1D, MESH_2D, mesh_ctx
from tests.primitives.rules_helpers import (
    assert_sharded_like,
    assert_tree_close,
    constraint_eqns,
    pjit_eqns,
    rand,
)

pytestmark = pytest.mark.usefixtures("partitioner_mode")


def _layer(x: Any, w: Any) -> Any:
    # x: [8, 4], w: [4, 4] -> [8, 4]
    return jnp.tanh(x @ w) + jnp.sin(x) * jnp.sum(w)


SPECS_2D = ((P("a", "b"), P("b")), P("a"))
SPECS_NO_A = ((P(None, "b"), P("b")), P(None, "b"))  # leaves "a" free for spmd_axis_name


def _strip(parts: tuple[Any, ...]) -> tuple[Any, ...]:
    """Partitions without trailing unpartitioned dimensions."""
    parts = tuple(parts)
    while parts and parts[-1] == ():
        parts = parts[:-1]
    return parts


def _batched(in_axes: Any, batch: int = 3) -> tuple[Any, Any]:
    x, w = rand(0, 8, 4), rand(1, 4, 4) / 2
    xs, ws = rand(2, batch, 8, 4), rand(3, batch, 4, 4) / 2
    x_in = x if in_axes[0] is None else jnp.moveaxis(xs, 0, in_axes[0])
    w_in = w if in_axes[1] is None else jnp.moveaxis(ws, 0, in_axes[1])
    return x_in, w_in


@pytest.mark.parametrize(
    ("in_axes", "out_axes"),
    [
        pytest.param((0, 0), 0, id="in0-in0-out0"),
        pytest.param((1, None), 0, id="in1-unbatched-out0"),
        pytest.param((0, None), 1, id="in0-unbatched-out1"),
        pytest.param((None, 2), 2, id="unbatched-in2-out2"),
    ],
)
@pytest.mark.slow
def test_vmap_matches_jit(in_axes, out_axes) -> None:
    x, w = _batched(in_axes)
    want = jax.vmap(jax.jit(_layer), in_axes, out_axes)(x, w)
    (in_specs, out_spec) = SPECS_2D
    with mesh_ctx(*MESH_2D) as mesh:
        pf = pjit(_layer, in_specs, out_spec)
        got = jax.vmap(pf, in_axes, out_axes)(x, w)
        assert_tree_close(got, want)
        if out_axes == 0:  # the batch dimension comes out unpartitioned, in front
            assert_sharded_like(got, mesh, P(None, *out_spec))
        # The pjit equation: the batch dimension is inserted unpartitioned.
        (eqn,) = pjit_eqns(jax.make_jaxpr(jax.vmap(pf, in_axes, out_axes))(x, w))
        for spec, axis, user in zip(
            eqn.params["in_axis_resources"], in_axes, in_specs, strict=True
        ):
            user_parts = ParsedPartitionSpec.from_user_input(user, "spec").partitions
            want_parts = user_parts if axis is None else ((), *user_parts)
            assert _strip(spec.partitions) == _strip(want_parts), spec
        assert eqn.params["out_axis_resources"][0].partitions[:2] == ((), ("a",))


@pytest.mark.parametrize("spmd_axis_name", ["a", ("a",)], ids=["name", "tuple"])
def test_vmap_spmd_axis_name_partitions_the_batch_dim(spmd_axis_name) -> None:
    x, w = _batched((0, None), batch=4)
    want = jax.vmap(jax.jit(_layer), (0, None))(x, w)
    in_specs, out_spec = SPECS_NO_A
    with mesh_ctx(*MESH_2D) as mesh:
        pf = pjit(_layer, in_specs, out_spec)
        vf = jax.vmap(pf, (0, None), spmd_axis_name=spmd_axis_name)
        (eqn,) = pjit_eqns(jax.make_jaxpr(vf)(x, w))
        x_spec, w_spec = eqn.params["in_axis_resources"]
        assert x_spec.partitions[:3] == (("a",), (), ("b",)), x_spec
        assert w_spec.partitions[:1] == (("b",),), w_spec  # unbatched: unchanged
        (o_spec,) = eqn.params["out_axis_resources"]
        assert o_spec.partitions[:3] == (("a",), (), ("b",)), o_spec
        got = vf(x, w)
        assert_tree_close(got, want)
        assert_sharded_like(got, mesh, P("a", None, "b"))


def test_vmap_spmd_axis_name_already_used_by_spec_is_an_error() -> None:
    x, w = _batched((0, None), batch=4)
    with mesh_ctx(*MESH_2D):
        pf = pjit(_layer, *SPECS_2D)
        with pytest.raises(ValueError, match="'a'"):
            jax.vmap(pf, (0, None), spmd_axis_name="a")(x, w)


def test_nested_vmap_1d() -> None:
    xs = rand(4, 2, 3, 8, 4)
    w = rand(5, 4, 4) / 2
    f = jax.vmap(jax.vmap(_layer, (0, None)), (0, None))
    want = jax.jit(f)(xs, w)
    with mesh_ctx(*MESH_1D):
        pf = pjit(_layer, (P("x"), None), P("x"))
        got = jax.vmap(jax.vmap(pf, (0, None)), (0, None))(xs, w)
        assert_tree_close(got, want)


# --- vmap and grad ---


def _loss(x: Any, w: Any) -> Any:
    return jnp.sum(_layer(x, w) ** 2)


@pytest.mark.slow
def test_grad_of_vmap() -> None:
    xs, w = _batched((0, None))

    def outer(f: Callable[..., Any]) -> Callable[..., Any]:
        return lambda xs, w: jnp.sum(jax.vmap(f, (0, None))(xs, w) ** 2)

    want = jax.jit(jax.grad(outer(_layer), argnums=(0, 1)))(xs, w)
    in_specs, out_spec = SPECS_2D
    with mesh_ctx(*MESH_2D) as mesh:
        got = jax.grad(outer(pjit(_layer, in_specs, out_spec)), argnums=(0, 1))(xs, w)
        assert_tree_close(got, want)
        assert_sharded_like(got[0], mesh, P(None, *in_specs[0]))
        assert_sharded_like(got[1], mesh, in_specs[1])


@pytest.mark.parametrize("spmd_axis_name", [None, "a"])
@pytest.mark.slow
def test_vmap_of_grad(spmd_axis_name) -> None:
    xs, w = _batched((0, None), batch=4)
    want = jax.vmap(jax.jit(jax.grad(_loss, argnums=(0, 1))), (0, None))(xs, w)
    in_specs, _ = SPECS_NO_A
    with mesh_ctx(*MESH_2D):
        g = jax.grad(pjit(_loss, in_specs, None), argnums=(0, 1))
        got = jax.vmap(g, (0, None), spmd_axis_name=spmd_axis_name)(xs, w)
        assert_tree_close(got, want)


# --- with_sharding_constraint ---


def _constrained(constrain: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def f(x: Any) -> Any:
        y = constrain(jnp.sin(x) * 3, P(None, "b"))
        return jnp.cos(y) * x

    return f


def _no_constraint(x: Any, _spec: Any) -> Any:
    return x


def _open_text(text: str, mode: str) -> bool:
    if mode == "gspmd":
        return "unspecified_dims=[0]" in text
    return '[{?}, {}, {"b"}]' in text


def test_constraint_under_vmap_leaves_the_batch_dim_open(partitioner_mode) -> None:
    xs = rand(6, 3, 8, 4)
    want = jax.jit(jax.vmap(_constrained(_no_constraint)))(xs)
    with mesh_ctx(*MESH_2D):
        vf = jax.vmap(_constrained(with_sharding_constraint))
        (eqn,) = constraint_eqns(jax.make_jaxpr(vf)(xs))
        spec = eqn.params["axis_resources"]
        assert spec.unconstrained_dims == frozenset({0}), spec
        assert spec.partitions[:3] == ((), (), ("b",)), spec
        text = pjit(vf, None, None).lower(xs).as_text()
        assert _open_text(text, partitioner_mode), text
        assert_tree_close(pjit(vf, P(None, "a"), P(None, "a"))(xs), want)
        assert_tree_close(vf(xs), want)
        assert_tree_close(jax.jit(vf)(xs), want)


def test_constraint_under_vmap_spmd_axis_name() -> None:
    xs = rand(7, 4, 8, 4)
    want = jax.jit(jax.vmap(_constrained(_no_constraint)))(xs)
    with mesh_ctx(*MESH_2D):
        vf = jax.vmap(_constrained(with_sharding_constraint), spmd_axis_name="a")
        (eqn,) = constraint_eqns(jax.make_jaxpr(vf)(xs))
        spec = eqn.params["axis_resources"]
        assert spec.partitions[:3] == (("a",), (), ("b",)) and not spec.unconstrained_dims, spec
        assert_tree_close(pjit(vf, None, None)(xs), want)


@pytest.mark.slow
def test_constraint_under_grad() -> None:
    x = rand(8, 8, 4)

    def loss_of(constrain: Callable[..., Any]) -> Callable[..., Any]:
        return lambda x: jnp.sum(_constrained(constrain)(x) ** 2)

    want = jax.jit(jax.grad(loss_of(_no_constraint)))(x)
    with mesh_ctx(*MESH_2D) as mesh:
        loss = loss_of(with_sharding_constraint)
        eqns = constraint_eqns(jax.make_jaxpr(jax.grad(loss))(x))
        # The forward constraint and its transpose: a constraint with the same spec.
        assert len(eqns) == 2, eqns
        assert eqns[0].params["axis_resources"] == eqns[1].params["axis_resources"]
        assert_tree_close(jax.grad(loss)(x), want)
        got = jax.grad(pjit(loss, P("a"), None))(x)
        assert_tree_close(got, want)
        assert_sharded_like(got, mesh, P("a"))
        # vmap of grad and grad of vmap with a constraint inside.
        xs = rand(9, 3, 8, 4)
        want_v = jax.jit(jax.vmap(jax.grad(loss_of(_no_constraint))))(xs)
        assert_tree_close(pjit(jax.vmap(jax.grad(loss)), None, None)(xs), want_v)

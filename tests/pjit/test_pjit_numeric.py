"""pjit runs the function: numbers equal ``jax.jit``'s, outputs laid out as NamedSharding.

Every test runs under GSPMD and Shardy (the ``partitioner_mode`` fixture).
"""

from __future__ import annotations

import warnings
from collections import namedtuple
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from partitioner.testing.plugin import MeshFactory
from tests.helpers import (
    MESH_1D,
    MESH_2D,
    MESH_3D,
    arange,
    assert_close,
    assert_laid_out,
    devices,
    mesh_ctx,
    named,
    shard_pointers,
)

pytestmark = pytest.mark.usefixtures("partitioner_mode")

Pair = namedtuple("Pair", ["left", "right"])


def _mlp(x: Any, w: Any) -> Any:
    return jnp.tanh(x @ w) + x.sum()


# (mesh, in specs for (x: [16, 8], w: [8, 8]), out spec)
MESH_CASES = [
    pytest.param(MESH_1D, (P("x"), None), P("x"), id="1d-rows"),
    pytest.param(MESH_1D, (P(None, "x"), P("x")), P(None, "x"), id="1d-contracting"),
    pytest.param(MESH_2D, (P("a", "b"), P("b")), P("a"), id="2d"),
    pytest.param(MESH_2D, (P(("a", "b")), None), P(None, "a"), id="2d-tuple-axes"),
    pytest.param(MESH_2D, (P("b", "a"), P("a", "b")), P("b", "a"), id="2d-transposed"),
    pytest.param(MESH_3D, (P(("a", "b"), "c"), P("c")), P("a", "c"), id="3d"),
    pytest.param(MESH_3D, (P("c"), P(None, ("b", "a"))), P(("c", "a")), id="3d-tuple-reordered"),
]


@pytest.mark.parametrize(("mesh_def", "in_specs", "out_spec"), MESH_CASES)
def test_matches_jit_and_lays_out_outputs(mesh_def, in_specs, out_spec) -> None:
    x, w = arange(16, 8), arange(8, 8, start=-0.5)
    want = jax.jit(_mlp)(x, w)
    with mesh_ctx(*mesh_def) as mesh:
        out = jax.block_until_ready(pjit(_mlp, in_specs, out_spec)(x, w))
    assert_close(out, want)
    assert_laid_out(out, mesh, out_spec, want)


def test_replicated_everywhere_with_none_specs() -> None:
    def f(x: Any) -> Any:
        return x * 2 + 1

    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(f, None, None)(x))
    assert_close(out, jax.jit(f)(x))
    assert_laid_out(out, mesh, None)
    assert all(s.data.shape == (8, 4) for s in out.addressable_shards)


def test_multiple_outputs() -> None:
    def f(x: Any, y: Any) -> Any:
        return x + y, (x * y).sum(axis=0), x @ y.T, jnp.float32(3) * x[0, 0]

    x, y = arange(8, 4), arange(8, 4, start=1.0)
    out_specs = (P("a", "b"), P("b"), P(None, "a"), None)
    want = jax.jit(f)(x, y)
    with mesh_ctx(*MESH_2D) as mesh:
        outs = jax.block_until_ready(pjit(f, (P("a"), P(None, "b")), out_specs)(x, y))
    assert isinstance(outs, tuple) and len(outs) == 4
    assert_close(outs, want)
    for out, spec, ref in zip(outs, out_specs, want, strict=True):
        assert_laid_out(out, mesh, spec, ref)


def test_pytree_inputs_and_outputs_with_prefix_specs() -> None:
    def f(params: dict, batch: list, pair: Pair) -> Any:
        h = batch[0] @ params["w"] + params["b"]
        return {
            "h": h,
            "stats": Pair(left=h.sum(0), right=batch[1] * pair.left),
            "rest": [pair.right + 1.0],
        }

    params = {"w": arange(4, 8), "b": arange(8)}
    batch = [arange(16, 4), arange(16, 2)]
    pair = Pair(left=arange(16, 2, start=2.0), right=arange(4))
    in_specs = (
        {"w": P(None, "b"), "b": None},  # dict prefix, one spec per key
        P("a"),  # one spec for the whole list
        Pair(left=P("a", "b"), right=None),  # namedtuple prefix
    )
    out_specs = {"h": P("a", "b"), "stats": Pair(left=P("b"), right=P("a")), "rest": None}
    want = jax.jit(f)(params, batch, pair)
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(f, in_specs, out_specs)(params, batch, pair))
    assert_close(out, want)
    assert isinstance(out["stats"], Pair) and isinstance(out["rest"], list)
    assert_laid_out(out["h"], mesh, P("a", "b"), want["h"])
    assert_laid_out(out["stats"].left, mesh, P("b"), want["stats"].left)
    assert_laid_out(out["stats"].right, mesh, P("a"), want["stats"].right)
    assert_laid_out(out["rest"][0], mesh, None, want["rest"][0])


def test_top_level_list_of_specs_is_a_tuple() -> None:
    def f(x: Any, y: Any) -> Any:
        return x - y

    x, y = arange(8, 2), arange(8, 2, start=3.0)
    with mesh_ctx(*MESH_1D) as mesh:
        out = jax.block_until_ready(pjit(f, [P("x"), None], P("x"))(x, y))
    assert_close(out, jax.jit(f)(x, y))
    assert_laid_out(out, mesh, P("x"))


def test_jax_partition_specs_accepted() -> None:
    def f(x: Any) -> Any:
        return jnp.cos(x)

    x = arange(8, 4)
    JP = jax.sharding.PartitionSpec
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(f, JP("a", "b"), JP(None, ("b",)))(x))
    assert_close(out, jax.jit(f)(x))
    assert_laid_out(out, mesh, P(None, "b"))


@pytest.mark.parametrize(
    "make_input",
    [
        pytest.param(lambda mesh, v: v, id="numpy"),
        pytest.param(lambda mesh, v: jnp.asarray(v), id="jax-uncommitted"),
        pytest.param(lambda mesh, v: jax.device_put(v, jax.devices()[3]), id="jax-one-device"),
        pytest.param(
            lambda mesh, v: jax.device_put(v, named(mesh, P("b", "a"))), id="jax-other-layout"
        ),
        pytest.param(lambda mesh, v: jax.device_put(v, named(mesh, P("a"))), id="jax-right-layout"),
    ],
)
def test_array_input_kinds(make_input) -> None:
    def f(x: Any, s: Any, i: Any) -> Any:
        return x * s + i

    v = arange(8, 4)
    want = jax.jit(f)(v, 2.5, 3)
    with mesh_ctx(*MESH_2D) as mesh:
        x = make_input(mesh, v)
        g = pjit(f, (P("a"), None, None), P("a"))
        if isinstance(x, jax.Array) and x.committed and x.sharding != named(mesh, P("a")):
            # Committed elsewhere: an error, as in jax.jit, unless moving is opted into.
            with pytest.raises(
                ValueError,
                match=r"(?s)^Sharding passed to jit does not match.*argument x is committed",
            ):
                g(x, 2.5, 3)
            with partitioner.options.reshard_committed():
                out = jax.block_until_ready(g(x, 2.5, 3))
        else:
            out = jax.block_until_ready(g(x, 2.5, 3))
    assert_close(out, want)  # Python scalars are weakly typed, as under jax.jit
    assert_laid_out(out, mesh, P("a"), want)


def test_python_scalar_outputs_and_scalar_only_inputs() -> None:
    def f(a: Any, b: Any) -> Any:
        return a * b, jnp.int32(7)

    want = jax.jit(f)(3.0, 4)
    with mesh_ctx(*MESH_1D) as mesh:
        out = jax.block_until_ready(pjit(f, None, None)(3.0, 4))
    assert_close(out, want)
    for o in out:
        assert_laid_out(o, mesh, None)


def test_right_layout_input_is_not_copied() -> None:
    # The identity with the input donated: the output aliases the buffer the
    # executable received. If the input were copied first, the output would
    # live in the copy (other addresses) and the input would stay alive.
    def ident(x: Any) -> Any:
        return x

    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(arange(8, 4), named(mesh, P("a", "b")))
        before = shard_pointers(x)
        out = jax.block_until_ready(pjit(ident, P("a", "b"), P("a", "b"), donate_argnums=0)(x))
    assert x.is_deleted()
    if shard_pointers(out) != before:
        pytest.skip("this backend does not reuse donated buffers in place for the identity")
    assert_close(out, arange(8, 4))


def test_right_layout_input_is_not_resharded(monkeypatch: pytest.MonkeyPatch) -> None:
    def f(x: Any, y: Any) -> Any:
        return x + y

    puts: list[Any] = []
    real_put = jax.device_put

    def counting_put(x: Any, *args: Any, **kwargs: Any) -> Any:
        puts.append(x)
        return real_put(x, *args, **kwargs)

    with mesh_ctx(*MESH_2D) as mesh:
        x = real_put(arange(8, 4), named(mesh, P("a", "b")))
        y = real_put(arange(8, 4), named(mesh, P("b")))  # not what the spec asks
        g = pjit(f, (P("a", "b"), P("a", "b")), P("a", "b"))
        with partitioner.options.reshard_committed():  # y is moved: opted into
            jax.block_until_ready(g(x, y))  # compile outside the count
            monkeypatch.setattr(jax, "device_put", counting_put)
            out = jax.block_until_ready(g(x, y))
    assert not any(p is x for p in puts)  # laid out already: passed through
    assert_close(out, 2 * arange(8, 4))


def test_repeated_calls_with_changing_input_kinds() -> None:
    # Cached calls (fast paths) must still place every kind of input correctly.
    def f(x: Any, y: Any) -> Any:
        return x * 2 - y

    v, w = arange(8, 4), arange(8, 4, start=1.0)
    want = jax.jit(f)(v, w)
    with mesh_ctx(*MESH_2D) as mesh, partitioner.options.reshard_committed():
        g = pjit(f, (P("a", "b"), P("b")), P("a"))
        kinds = [
            lambda u: u,
            lambda u: jax.device_put(u, named(mesh, P("a", "b"))),
            lambda u: jax.device_put(u, named(mesh, P("a"))),
            lambda u: jnp.asarray(u),
            lambda u: jax.device_put(u, named(mesh, P("b"))),
            lambda u: u,
        ]
        for kind_x in kinds:
            for kind_y in kinds[::2]:
                out = jax.block_until_ready(g(kind_x(v), kind_y(w)))
                assert_close(out, want)
                assert_laid_out(out, mesh, P("a"), want)


def test_donation_on_every_call() -> None:
    def f(x: Any) -> Any:
        return x + 1

    with mesh_ctx(*MESH_2D) as mesh:
        g = pjit(f, P("a"), P("a"), donate_argnums=0)
        for k in range(4):
            x = jax.device_put(arange(8, 4, start=k), named(mesh, P("a")))
            out = jax.block_until_ready(g(x))
            assert x.is_deleted(), k
            assert_close(out, arange(8, 4, start=k) + 1)


@pytest.mark.parametrize("how", ["argnums", "argnames"])
def test_static_arguments(how: str) -> None:
    def f(x: Any, n: int, y: Any, *, mode: str = "add") -> Any:
        z = jnp.tile(x, (1, n))
        return z + y if mode == "add" else z * y

    x, y = arange(8, 2), arange(8, 6, start=1.0)
    if how == "argnums":
        # Given both, each applies as written (as in jax.jit): n is static when passed
        # positionally, mode when passed by keyword.
        g = pjit(f, (P("a"), P("a", "b")), P("a", "b"), static_argnums=1, static_argnames="mode")
    else:
        g = pjit(f, (P("a"), P("a", "b")), P("a", "b"), static_argnames=("n", "mode"))
    with mesh_ctx(*MESH_2D) as mesh:
        out_add = jax.block_until_ready(g(x, 3, y))
        out_mul = jax.block_until_ready(g(x, 3, y, mode="mul"))
        out_kw = jax.block_until_ready(
            g(x, 3, y=y, mode="mul") if how == "argnums" else g(x, n=3, y=y, mode="mul")
        )
    assert_close(out_add, jnp.tile(x, (1, 3)) + y)
    assert_close(out_mul, jnp.tile(x, (1, 3)) * y)
    assert_close(out_kw, out_mul)
    assert_laid_out(out_mul, mesh, P("a", "b"))


def test_keyword_arguments_get_their_positional_spec() -> None:
    def f(x: Any, y: Any, *, scale: Any) -> Any:
        return x * scale + y

    x, y = arange(8, 4), arange(8, 4, start=1.0)
    want = jax.jit(f)(x, y, scale=2.0)
    g = pjit(f, (P("a"), P("b", "a")), P("a", "b"))
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(g(x, y=y, scale=2.0))
        out_pos = jax.block_until_ready(g(x, y, scale=2.0))
        compiled = g.lower(x, y=y, scale=np.float32(2.0)).compile()
    assert_close(out, want)
    assert_close(out_pos, want)
    assert_laid_out(out, mesh, P("a", "b"), want)
    # The keyword `y` is the positional parameter `y`: it gets the second spec.
    args_specs, kwarg_specs = compiled.input_specs
    assert args_specs == (P("a"), P("b", "a"))
    # A keyword-only argument has no positional spec: it is replicated.
    assert kwarg_specs == {"scale": P()}


def test_donation_consumes_the_input() -> None:
    def f(x: Any, y: Any) -> Any:
        return x * 2 + y

    x_np, y_np = arange(8, 4), arange(8, 4, start=1.0)
    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(x_np, named(mesh, P("a", "b")))
        y = jax.device_put(y_np, named(mesh, P("a", "b")))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a usable donation does not warn
            out = jax.block_until_ready(pjit(f, P("a", "b"), P("a", "b"), donate_argnums=0)(x, y))
    assert x.is_deleted()
    assert not y.is_deleted()
    assert_close(out, x_np * 2 + y_np)
    assert_laid_out(out, mesh, P("a", "b"))


def test_donate_argnames() -> None:
    def f(x: Any, y: Any) -> Any:
        return x - y

    with mesh_ctx(*MESH_1D) as mesh:
        x = jax.device_put(arange(8, 4), named(mesh, P("x")))
        y = jax.device_put(arange(8, 4), named(mesh, P("x")))
        out = jax.block_until_ready(pjit(f, P("x"), P("x"), donate_argnames="y")(x, y=y))
    assert y.is_deleted() and not x.is_deleted()
    assert_close(out, np.zeros((8, 4), np.float32))


@pytest.mark.parametrize(
    ("out_fn", "why"),
    [
        pytest.param(lambda x: x.sum(0), "shape", id="other-shape"),
        pytest.param(lambda x: x.astype(jnp.int32), "dtype", id="other-dtype"),
    ],
)
def test_unusable_donation_warns_and_keeps_input(out_fn, why: str) -> None:
    x_np = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(x_np, named(mesh, P("a")))
        g = pjit(out_fn, P("a"), None, donate_argnums=(0,))
        with pytest.warns(UserWarning, match="donat"):
            out = jax.block_until_ready(g(x))
    assert not x.is_deleted(), why
    assert_close(x, x_np)
    assert_close(out, jax.jit(out_fn)(x_np))


def test_donation_with_other_output_layout_keeps_input() -> None:
    # Same global shape, another per-device shape: the buffer cannot be reused.
    def f(x: Any) -> Any:
        return x + 1

    x_np = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(x_np, named(mesh, P("a")))
        with pytest.warns(UserWarning, match="donat"):
            out = jax.block_until_ready(pjit(f, P("a"), P("a", "b"), donate_argnums=0)(x))
    assert not x.is_deleted()
    assert_close(out, x_np + 1)


# --- the mesh context ---


def _double_plus(x: Any) -> Any:
    return 2 * x + 1


@pytest.mark.filterwarnings("ignore:.*context manager has been deprecated:DeprecationWarning")
def test_jax_mesh_context_manager(mesh: MeshFactory) -> None:
    x = arange(8, 4)
    with mesh(*MESH_2D) as jax_mesh:
        out = jax.block_until_ready(pjit(_double_plus, P("a", "b"), P("b", "a"))(x))
    assert_close(out, jax.jit(_double_plus)(x))
    assert_laid_out(out, jax_mesh, P("b", "a"))


@pytest.mark.filterwarnings("ignore:.*context manager has been deprecated:DeprecationWarning")
def test_jax_mesh_as_decorator(mesh: MeshFactory) -> None:
    jax_mesh = mesh(*MESH_1D)
    g = pjit(_double_plus, P("x"), P("x"))

    @jax_mesh
    def run(v: Any) -> Any:
        return g(v)

    x = arange(16, 2)
    out = jax.block_until_ready(run(x))
    assert_close(out, jax.jit(_double_plus)(x))
    assert_laid_out(out, jax_mesh, P("x"))


def test_explicit_axes_mesh_from_make_mesh() -> None:
    mesh = jax.make_mesh((4, 2), ("a", "b"))  # Explicit axis types by default
    x = arange(8, 4)
    with jax.set_mesh(mesh):
        out = jax.block_until_ready(pjit(_double_plus, P("a", "b"), P("a"))(x))
    assert_close(out, jax.jit(_double_plus)(x))
    assert out.sharding.is_equivalent_to(named(mesh, P("a")), 2)
    assert_laid_out(out, Mesh(mesh.devices, mesh.axis_names), P("a"))


@pytest.mark.filterwarnings("ignore:.*context manager has been deprecated:DeprecationWarning")
def test_explicit_axes_mesh_as_context_manager(mesh: MeshFactory) -> None:
    explicit = mesh(*MESH_3D, axis_types=AxisType.Explicit)
    x = arange(8, 4)
    with explicit:
        out = jax.block_until_ready(pjit(_double_plus, P(("a", "b"), "c"), P("c"))(x))
    assert_close(out, jax.jit(_double_plus)(x))
    assert out.sharding.is_equivalent_to(named(explicit, P("c")), 2)


def test_mesh_is_looked_up_at_call_time() -> None:
    g = pjit(_double_plus, P("a"), P("a"))  # no mesh in context yet
    x = arange(8, 2)
    want = jax.jit(_double_plus)(x)
    with mesh_ctx((8,), ("a",)) as mesh1:
        out1 = jax.block_until_ready(g(x))
    with mesh_ctx((2, 4), ("b", "a")) as mesh2:
        out2 = jax.block_until_ready(g(x))
    assert_close(out1, want)
    assert_close(out2, want)
    assert_laid_out(out1, mesh1, P("a"))
    assert_laid_out(out2, mesh2, P("a"))
    assert out2.sharding.mesh.shape == {"b": 2, "a": 4}


def test_nested_mesh_contexts_innermost_wins() -> None:
    g = pjit(_double_plus, P("x"), P("x"))
    x = arange(8, 2)
    with mesh_ctx((8,), ("x",)), partitioner.mesh(devices(2)[::-1], ("x",)) as inner:
        out = jax.block_until_ready(g(x))
    assert_close(out, jax.jit(_double_plus)(x))
    assert_laid_out(out, inner, P("x"))
    assert {d.id for d in out.sharding.device_set} == {0, 1}

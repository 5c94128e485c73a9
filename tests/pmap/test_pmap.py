"""partitioner.pmap against jax.pmap (seed 000).

Every numeric test runs the same function through ``partitioner.pmap`` and
``jax.pmap`` on the same inputs and compares values and shard placement (which
device holds which slice), under both of XLA's partitioners (``partitioner_mode``)
where the lowering differs.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import pmap, sharding_spec_of
from partitioner.sharding_spec import Chunked, NoSharding, ShardedAxis, ShardingSpec

N = 8  # every map is over N devices
pytestmark = pytest.mark.needs_devices(N)

X = np.arange(N * 4 * 3, dtype=np.float32).reshape(N, 4, 3) / 17
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


def assert_same(ours: Any, theirs: Any, atol: float = 1e-5) -> None:
    """Same pytree, same values, and each device holds the same slice."""
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert isinstance(a, jax.Array) and a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)
        mine = {s.device: np.asarray(s.data) for s in a.addressable_shards}
        for shard in b.addressable_shards:
            if shard.device in mine:
                np.testing.assert_allclose(mine[shard.device], np.asarray(shard.data), atol=atol)


def both(fun: Any, *args: Any, **pmap_kwargs: Any) -> tuple[Any, Any]:
    return pmap(fun, **pmap_kwargs)(*args), jax.pmap(fun, **pmap_kwargs)(*args)


# --- mapping ---


@pytest.mark.usefixtures("partitioner_mode")
@pytest.mark.parametrize(
    ("in_axes", "out_axes", "args"),
    [
        (0, 0, (X,)),
        (1, 0, (np.swapaxes(X, 0, 1),)),
        (-3, 1, (X,)),
        ((0, None), 0, (X, W)),
        ((None, 0), (0, None), (W, X)),
        (({"a": 0, "b": None},), 0, ({"a": X, "b": W},)),
        (0, 2, (X,)),
    ],
)
def test_in_axes_and_out_axes_match_jax_pmap(in_axes: Any, out_axes: Any, args: Any) -> None:
    def f(*a: Any) -> Any:
        leaves = jax.tree.leaves(a)
        first = leaves[0]
        if out_axes == (0, None):
            return first * 2, jax.lax.psum(jnp.sum(first), "i")
        return jnp.tanh(first + jnp.sum(leaves[-1])) if len(leaves) > 1 else first * 3

    ours, theirs = both(f, *args, axis_name="i", in_axes=in_axes, out_axes=out_axes)
    assert_same(ours, theirs)


@pytest.mark.usefixtures("partitioner_mode")
def test_keyword_arguments_are_mapped_over_their_leading_dimension() -> None:
    def f(x: Any, *, scale: Any) -> Any:
        return x * scale

    scale = np.arange(N, dtype=np.float32)[:, None, None]
    ours = pmap(f)(X, scale=scale)
    assert_same(ours, jax.pmap(f)(X, scale=scale))


@pytest.mark.usefixtures("partitioner_mode")
def test_static_broadcasted_arguments_and_axis_size() -> None:
    def f(x: Any, power: int) -> Any:
        return x**power + jax.lax.axis_index("i")

    g = pmap(f, "i", static_broadcasted_argnums=1)
    assert_same(g(X, 2), jax.pmap(f, "i", static_broadcasted_argnums=1)(X, 2))
    assert_same(g(X, 3), jax.pmap(f, "i", static_broadcasted_argnums=1)(X, 3))

    def no_mapped(w: Any) -> Any:
        return w * jax.lax.axis_index("i")

    # jax.pmap 0.10.2 refuses a call without a mapped argument; old jax.pmap (and ours)
    # map it over axis_size devices.
    ours = pmap(no_mapped, "i", in_axes=None, axis_size=4)(W)
    np.testing.assert_allclose(np.asarray(ours), np.stack([W * i for i in range(4)]))
    assert len(ours.sharding.device_set) == 4


def test_negative_out_axes_count_from_the_end_of_the_output() -> None:
    # jax.pmap 0.10.2 places out_axes=-1 on the leading dimension (its shard_map
    # conversion drops the sign); ours follows the documented meaning, as vmap does.
    np.testing.assert_array_equal(
        np.asarray(pmap(lambda x: x * 3, out_axes=-1)(X)),
        np.asarray(jax.pmap(lambda x: x * 3, out_axes=2)(X)),
    )


# --- collectives ---

COLLECTIVES = {
    "psum": lambda x: jax.lax.psum(x, "i"),
    "pmean": lambda x: jax.lax.pmean(x, "i"),
    "pmax": lambda x: jax.lax.pmax(x, "i"),
    "pmin": lambda x: jax.lax.pmin(x, "i"),
    "all_gather": lambda x: jax.lax.all_gather(x, "i"),
    "all_gather_tiled": lambda x: jax.lax.all_gather(x, "i", axis=1, tiled=True),
    "psum_scatter": lambda x: jax.lax.psum_scatter(jnp.tile(x[:1], (N, 1)), "i"),
    "psum_scatter_tiled": lambda x: jax.lax.psum_scatter(
        jnp.tile(x, (2, 1)), "i", scatter_dimension=0, tiled=True
    ),
    "ppermute": lambda x: jax.lax.ppermute(x, "i", [(j, (j + 3) % N) for j in range(N)]),
    "all_to_all": lambda x: jax.lax.all_to_all(
        jnp.tile(x[:1], (N, 1)), "i", split_axis=0, concat_axis=1
    ),
    "axis_index": lambda x: x * jax.lax.axis_index("i"),
}


@pytest.mark.usefixtures("partitioner_mode")
@pytest.mark.parametrize("name", sorted(COLLECTIVES))
@pytest.mark.slow
def test_collectives_match_jax_pmap(name: str) -> None:
    ours, theirs = both(COLLECTIVES[name], X, axis_name="i")
    assert_same(ours, theirs)


def test_an_unbound_axis_name_is_a_name_error() -> None:
    with pytest.raises(NameError, match="pmap <lambda>: .*unbound axis name: j"):
        pmap(lambda x: jax.lax.psum(x, "j"), "i")(X)


# --- vmap inside and around; transformations ---


@pytest.mark.usefixtures("partitioner_mode")
def test_vmap_inside_and_around() -> None:
    def inner(x: Any) -> Any:
        return jax.vmap(lambda row: jax.lax.psum(row * 2, "i"))(x)

    assert_same(*both(inner, X, axis_name="i"))
    batch = np.stack([X, X + 1, X * 2])

    def around(p: Any) -> Any:
        return jax.vmap(lambda x: p(lambda v: jax.lax.pmean(jnp.sin(v), "i"), "i")(x))(batch)

    np.testing.assert_allclose(np.asarray(around(pmap)), np.asarray(around(jax.pmap)), atol=1e-6)


def _loss(w: Any, x: Any) -> Any:
    return jax.lax.pmean(jnp.sum(jnp.tanh(x @ w) ** 2), "i")


@pytest.mark.usefixtures("partitioner_mode")
def test_pmap_of_grad_is_a_data_parallel_step() -> None:
    def step(w: Any, x: Any) -> Any:
        loss, g = jax.value_and_grad(_loss)(w, x)
        return w - 0.1 * jax.lax.pmean(g, "i"), loss

    ours, theirs = both(step, W, X, axis_name="i", in_axes=(None, 0), out_axes=None)
    assert_same(ours, theirs)


@pytest.mark.usefixtures("partitioner_mode")
@pytest.mark.parametrize("out_axes", [0, None])
@pytest.mark.slow
def test_grad_vjp_and_jvp_of_a_pmapped_function(out_axes: Any) -> None:
    def per_device(w: Any, x: Any) -> Any:
        return jax.lax.psum(jnp.tanh(x @ w), "i") * jax.lax.axis_index("i")

    def total(p: Any) -> Any:
        mapped = p(per_device, "i", in_axes=(None, 0), out_axes=out_axes)
        return lambda w, x: jnp.sum(mapped(w, x) ** 2)

    for argnums in (0, 1, (0, 1)):
        g_ours = jax.grad(total(pmap), argnums)(W, X)
        g_theirs = jax.grad(total(jax.pmap), argnums)(W, X)
        for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_theirs), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5)
    mapped = pmap(per_device, "i", in_axes=(None, 0), out_axes=out_axes)
    reference = jax.pmap(per_device, "i", in_axes=(None, 0), out_axes=out_axes)
    out, vjp = jax.vjp(mapped, W, X)
    out_r, vjp_r = jax.vjp(reference, W, X)
    ct = np.ones_like(np.asarray(out_r))
    for a, b in zip(vjp(ct), vjp_r(ct), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5)
    tangents = (np.ones_like(W), np.ones_like(X))
    (_, t), (_, t_r) = jax.jvp(mapped, (W, X), tangents), jax.jvp(reference, (W, X), tangents)
    np.testing.assert_allclose(np.asarray(t), np.asarray(t_r), atol=1e-4, rtol=1e-5)


@pytest.mark.usefixtures("jax_partitioner_mode")
def test_jax_jit_around_pmap() -> None:
    def f(x: Any) -> Any:
        return jax.lax.all_gather(x, "i")

    ours = jax.jit(lambda x: pmap(f, "i")(x) + 1)(X)
    theirs = jax.jit(lambda x: jax.pmap(f, "i")(x) + 1)(X)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-6)


def test_checkpoint_around_a_pmapped_function_under_grad() -> None:
    mapped = pmap(lambda w, x: jnp.tanh(x @ w), "i", in_axes=(None, 0))

    def loss(p: Any) -> Any:
        return lambda w: jnp.sum(jax.checkpoint(p)(w, X) ** 2)

    reference = jax.pmap(lambda w, x: jnp.tanh(x @ w), "i", in_axes=(None, 0))
    np.testing.assert_allclose(
        np.asarray(jax.grad(loss(mapped))(W)), np.asarray(jax.grad(loss(reference))(W)), atol=1e-4
    )


# --- outputs, layouts and dispatch ---


def test_outputs_are_jax_arrays_with_a_sharding_spec_and_feed_the_next_call_in_place() -> None:
    double = pmap(lambda x: x * 2)
    y = double(X)
    assert isinstance(y, jax.Array) and y.shape == X.shape
    assert sharding_spec_of(y) == ShardingSpec(
        sharding=(Chunked((N,)), NoSharding(), NoSharding()), mesh_mapping=(ShardedAxis(0),)
    )
    assert [s.device for s in y.addressable_shards] == jax.devices()[:N]
    pointers = {s.device: s.data.unsafe_buffer_pointer() for s in y.addressable_shards}
    identity = pmap(lambda x: x)
    seen: list[int] = []
    z = identity(y)
    seen = [s.data.unsafe_buffer_pointer() for s in z.addressable_shards]
    np.testing.assert_array_equal(np.asarray(z), X * 2)
    # The input was used where it was: pmap passed its shards through, no copy was made.
    mapped_in = pmap(lambda x: x + 0, donate_argnums=0)
    w = double(X)
    before = [s.data.unsafe_buffer_pointer() for s in w.addressable_shards]
    out = mapped_in(w)
    assert w.is_deleted()
    assert [s.data.unsafe_buffer_pointer() for s in out.addressable_shards] == before
    assert pointers and seen


def test_cached_calls_do_not_trace_or_compile_again_and_clear_caches_drops_them() -> None:
    f = pmap(lambda x: jax.lax.psum(x, "i"), "i")
    f(X).block_until_ready()
    with partitioner.recording() as counts:
        for _ in range(3):
            f(X).block_until_ready()
    assert "trace" not in counts and "compile" not in counts, dict(counts)
    partitioner.clear_caches()
    with partitioner.recording() as again:
        f(X).block_until_ready()
    assert again.get("compile") == 1


def test_lower_shows_a_manual_computation(partitioner_mode: str) -> None:
    text = pmap(lambda x: jax.lax.psum(x, "i"), "i").lower(X).as_text()
    if partitioner_mode == "shardy":
        assert "sdy.manual_computation" in text and 'manual_axes={"i"}' in text
    else:
        assert "SPMDFullToShardShape" in text and "SPMDShardToFullShape" in text
    assert "all_reduce" in text


# --- errors ---


def test_mapped_axis_sizes_that_differ_name_the_arguments() -> None:
    with pytest.raises(
        ValueError,
        match=r"sizes differ: args\[0\] has 8 at dimension 0, args\[1\]\['b'\] has 4 at dimension 0",
    ):
        pmap(lambda x, d: x)(X, {"b": np.ones((4, 2))})


def test_an_axis_larger_than_the_device_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="size 16, larger than the 8 available cpu devices"):
        pmap(lambda x: x)(np.ones((16, 2)))


def test_in_axes_that_are_not_a_prefix_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="in_axes .* is not a pytree prefix of the arguments"):
        pmap(lambda x, y: x, in_axes=(0, 0, 0))(X, X)
    with pytest.raises(
        ValueError, match=r"in_axes 3 for argument args\[0\] of rank 3 is out of range"
    ):
        pmap(lambda x: x, in_axes=3)(X)


def test_an_unhashable_static_argument_is_a_type_error() -> None:
    with pytest.raises(
        (TypeError, ValueError),
        match="(static argument 1 of type list is not hashable|Non-hashable static arguments)",
    ):
        pmap(lambda x, s: x, static_broadcasted_argnums=1)(X, [1, 2])


def test_bad_pmap_arguments() -> None:
    with pytest.raises(TypeError, match="Expected a callable value"):
        pmap(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no argument is mapped .* give axis_size"):
        pmap(lambda w: w, in_axes=None)(W)
    with pytest.raises(ValueError, match="devices lists 4 devices"):
        pmap(lambda x: x, devices=jax.devices()[:4])(X)


# --- nested pmap ---


@pytest.mark.usefixtures("partitioner_mode")
@pytest.mark.slow
def test_nested_pmap_maps_two_axes_over_a_device_grid() -> None:
    # jax.pmap 0.10.2 cannot nest (its shard_map conversion rejects the inner mesh);
    # the reference is the same body under two named vmaps, and the classic layout:
    # inner index j of outer index i runs on device i * 4 + j.
    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)

    def body(v: Any) -> Any:
        return (
            jax.lax.psum(v, "j") * jax.lax.axis_index("i")
            + jax.lax.pmax(v, "i")
            + jax.lax.axis_index("j")
        )

    out = pmap(pmap(body, "j"), "i")(x)
    want = jax.vmap(jax.vmap(body, axis_name="j"), axis_name="i")(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-6)
    devices = jax.devices()
    for shard in out.addressable_shards:
        i, j = shard.index[0].start, shard.index[1].start
        assert shard.device == devices[i * 4 + j], (shard.device, shard.index)
        np.testing.assert_allclose(np.asarray(shard.data)[0, 0], np.asarray(want)[i, j], atol=1e-6)

    grad = jax.grad(
        lambda x: jnp.sum(pmap(pmap(lambda v: jnp.sin(v) * jax.lax.psum(v, "i"), "j"), "i")(x) ** 2)
    )(x)
    grad_want = jax.grad(
        lambda x: jnp.sum(
            jax.vmap(
                jax.vmap(lambda v: jnp.sin(v) * jax.lax.psum(v, "i"), axis_name="j"), axis_name="i"
            )(x)
            ** 2
        )
    )(x)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(grad_want), atol=1e-5)


def test_nested_maps_that_need_more_devices_than_there_are() -> None:
    with pytest.raises(ValueError, match=r"nested maps over \{'i': 4, 'j': 4\} need 16 devices"):
        pmap(pmap(lambda v: v, "j"), "i")(np.ones((4, 4, 2)))


def test_threads_calling_a_new_pmap_at_once_compile_it_once() -> None:
    f = pmap(lambda x: jax.lax.pmax(x, "i") - x, "i")
    partitioner.clear_caches()
    results: list[Any] = [None] * 8
    start = threading.Barrier(8)

    def call(k: int) -> None:
        start.wait()
        results[k] = np.asarray(f(X))

    with partitioner.recording() as counts:
        threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert counts.get("compile") == 1, dict(counts)
    want = np.asarray(jax.pmap(lambda x: jax.lax.pmax(x, "i") - x, "i")(X))
    for r in results:
        np.testing.assert_allclose(r, want)


def test_a_non_jax_argument_and_ordered_effects_are_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"argument args\[1\] of type str is not a valid JAX type"):
        pmap(lambda x, s: x)(X, "config")

    def tapped(x: Any) -> Any:
        jax.debug.callback(lambda v: None, x, ordered=True)
        return x

    with pytest.raises(ValueError, match="ordered effects .* not supported"):
        pmap(tapped)(X)

    # id_tap is the ordered effect a pmap body supports: it taps per device
    # (tests/host_callback/test_dropin.py).


def test_a_stacked_numpy_argument_is_sent_split_not_whole_to_every_device() -> None:
    # The one host-to-device transfer of the argument names the split layout as its
    # destination: jax slices the host array per device (each device gets its row),
    # with no full copy per device and no device-side reshard.
    f = pmap(lambda v: v + 1, "rows")
    f(X)
    with jax.transfer_guard("disallow"), pytest.raises(Exception) as info:
        f(X)
    message = str(info.value)
    assert "host-to-device transfer" in message and "float32[8,4,3]" in message
    assert "spec=P('rows',)" in message


def test_a_pmap_nested_inside_control_flow_of_a_pmap_is_a_clear_error() -> None:
    inner = pmap(lambda v: jax.lax.psum(v, "j"), "j")

    def body(v: Any) -> Any:
        return jax.lax.cond(True, inner, lambda u: u, v)

    with pytest.raises(ValueError, match="nested inside control flow"):
        pmap(body, "i")(np.ones((2, 4, 3), np.float32))


# --- the classic jax.pmap's corner cases ---


@pytest.mark.usefixtures("partitioner_mode")
@pytest.mark.slow
def test_a_map_of_one_device_runs() -> None:
    one = X[:1]
    assert_same(*both(lambda x: x + 1, one))
    assert_same(*both(lambda x: jax.lax.psum(x, "i") * jax.lax.axis_index("i"), one, axis_name="i"))
    device = jax.devices()[1]
    out = pmap(lambda x: x * 2, devices=[device])(one)
    np.testing.assert_array_equal(np.asarray(out), one * 2)
    assert out.sharding.device_set == {device}

    def loss(w: Any) -> Any:
        f = pmap(jax.checkpoint(lambda x: jnp.tanh(x @ w)), devices=[device])
        return f(one).sum()

    want = jax.grad(lambda w: jnp.tanh(one @ w).sum())(W)
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(W)), np.asarray(want), atol=1e-5)
    donated = jnp.asarray(one)
    out = pmap(lambda x: x - 1, donate_argnums=0)(donated)
    np.testing.assert_allclose(np.asarray(out), one - 1)
    nested = pmap(pmap(lambda x: jax.lax.psum(x, "j") + jax.lax.axis_index("i"), "j"), "i")
    np.testing.assert_allclose(np.asarray(nested(X[:1, :1])), X[:1, :1])


@pytest.mark.parametrize(
    "kwargs",
    [{"in_axes": False}, {"in_axes": (True,)}, {"out_axes": True}, {"in_axes": np.int64(0)}],
    ids=["in_axes=False", "in_axes=(True,)", "out_axes=True", "numpy int"],
)
def test_in_axes_and_out_axes_leaves_must_be_ints_as_in_jax(kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="must be an int, None, or"):
        jax.pmap(lambda x: x, **kwargs)(X)
    with pytest.raises(TypeError, match="must be an int, None, or"):
        pmap(lambda x: x, **kwargs)(X)


def test_float0_inputs_and_outputs() -> None:
    zeros = np.zeros(N, jax.dtypes.float0)
    for _ in range(2):  # the second call takes the fast path
        ours, theirs = both(lambda x, t: (x * 2, t), X, zeros)
        assert ours[1].dtype == theirs[1].dtype == jax.dtypes.float0
        assert ours[1].shape == theirs[1].shape
        assert_same(ours[0], theirs[0])
    grads = jax.grad(lambda x, n: pmap(lambda a, b: a * b)(x, n).sum(), (0, 1), allow_int=True)
    g_x, g_n = grads(X[:, 0, 0], np.arange(N))
    np.testing.assert_allclose(np.asarray(g_x), np.arange(N))
    assert g_n.dtype == jax.dtypes.float0


def test_collectives_under_disable_jit_run_eagerly_with_the_same_values() -> None:
    def f(x: Any, k: int) -> Any:
        return jax.lax.psum(x, "i") * k + jax.lax.axis_index("i"), jax.lax.all_gather(x, "i")

    with jax.disable_jit():
        ours = pmap(f, "i", static_broadcasted_argnums=1)(X[:4, 0], 3)
        theirs = jax.pmap(f, "i", static_broadcasted_argnums=1)(X[:4, 0], 3)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_devices_of_the_outer_map_of_a_nest_are_those_of_the_whole_nest() -> None:
    devices = jax.devices()[::-1]
    nested = pmap(pmap(lambda x: jax.lax.psum(x, "j"), "j"), "i", devices=devices)
    x = X[:, 0, 0].reshape(4, 2)
    out = nested(x)
    np.testing.assert_allclose(np.asarray(out), np.repeat(x.sum(1, keepdims=True), 2, 1))
    for shard in out.addressable_shards:
        i, j = (s.start for s in shard.index)
        assert shard.device == devices[i * 2 + j]
    with pytest.raises(ValueError, match="the map needs 4 devices .* devices lists 8"):
        pmap(pmap(lambda x: x, "j"), "i", devices=devices)(x[:2])


# --- pmap's warnings and errors speak of pmap, not of the pjit it is built on ---


def _pmap_donation_warning() -> list[warnings.WarningMessage]:
    f = partitioner.pmap(lambda v: v.sum(), "i", donate_argnums=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(np.ones((8, 3), np.float32)).block_until_ready()  # the (8,) result cannot reuse it
    return [w for w in caught if "donated" in str(w.message)]


def test_pmap_warnings_name_pmap_and_the_callers_line() -> None:
    partitioner.clear_caches()
    (w,) = _pmap_donation_warning()
    assert "pmap <lambda>" in str(w.message) and "pjit" not in str(w.message)
    assert w.filename == __file__, (w.filename, str(w.message))


def test_pmap_errors_never_say_pjit() -> None:
    f = partitioner.pmap(lambda v: v * 2.0, "i", donate_argnums=0)
    y = f(np.ones((8, 3), np.float32))
    z = f(y)  # consumes y
    messages = []
    for bad in (
        lambda: f(y),  # consumed by the donation
        lambda: f.lower(z).compile()(np.ones((8, 4), np.float32)),  # other shape
        lambda: f.lower(z).compile()(z, z),  # other structure
    ):
        with pytest.raises((RuntimeError, TypeError, ValueError)) as info:
            bad()
        messages.append(str(info.value))
    for message in messages:
        assert "pmap" in message and "pjit" not in message, message

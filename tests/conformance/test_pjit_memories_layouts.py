"""Conformance: memory kinds, layouts and sharding leaf types, as jax's current tests use them.

Scenarios adapted from jax's ``tests/memories_test.py``, ``tests/layout_test.py`` and
``tests/pjit_test.py`` (our own code; jax's expected behaviour). Every case runs the
program through ``partitioner.pjit`` (and ``partitioner.jit`` where present) *and*
``jax.jit`` in the same test and compares
values, shardings (memory kinds included), formats and errors. Where jax.jit leaves a
sharding unspecified, pjit is given the sharding jax.jit ends up with (or a
PartitionSpec leaf, which states no memory kind, under the mesh). Both of XLA's
partitioners run every case (``partitioner_mode``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import partitioner
from partitioner import pjit

pytestmark = [pytest.mark.usefixtures("partitioner_mode"), pytest.mark.slow]

#: The front doors every case runs through: pjit, and partitioner.jit where this
#: checkout has it (jax.jit's signature; the cases pass explicit shardings).
FRONT_DOORS = {"pjit": pjit, **({"jit": partitioner.jit} if hasattr(partitioner, "jit") else {})}


@pytest.fixture(params=sorted(FRONT_DOORS))
def front(request: pytest.FixtureRequest) -> Any:
    """The partitioner front door under test."""
    return FRONT_DOORS[request.param]


AUTO = jax.sharding.AxisType.Auto
MESH = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AUTO, AUTO), devices=jax.devices()[:4])
NP = np.arange(16).reshape(8, 2)
S_DEV = NamedSharding(MESH, P("x", "y"))
S_HOST = S_DEV.with_memory_kind("pinned_host")


def _check(ours: Any, theirs: Any, want: Any = None) -> None:
    """Same values (and ``want`` if given), same shardings and memory kinds, leaf by leaf."""
    lo, lt = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert len(lo) == len(lt)
    for a, b in zip(lo, lt, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding == b.sharding, (a.sharding, b.sharding)
        assert a.sharding.memory_kind == b.sharding.memory_kind
        for sa in a.addressable_shards:  # each shard lives where the array says
            assert sa.data.sharding.memory_kind == a.sharding.memory_kind
    if want is not None:
        for a, w in zip(lo, jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), w)


# --- memories_test.py ---


def test_identity_host_to_device_and_back(front: Any) -> None:
    arr_host, arr_dev = jax.device_put(NP, S_HOST), jax.device_put(NP, S_DEV)
    for arg, out_s in ((arr_host, S_DEV), (arr_dev, S_HOST)):
        ours = front(lambda x: x, in_shardings=arg.sharding, out_shardings=out_s)(arg)
        theirs = jax.jit(lambda x: x, out_shardings=out_s)(arg)
        _check(ours, theirs, NP)
        assert ours.sharding == out_s


def test_parameter_streaming(front: Any) -> None:
    inp_host, inp_dev = jax.device_put(NP, S_HOST), jax.device_put(NP, S_DEV)

    def f(a: Any, b: Any) -> Any:
        z = (b * 2) * jax.device_put(a, S_DEV)
        return z * 4, z

    ours = front(f, in_shardings=(S_HOST, S_DEV), out_shardings=S_HOST)
    theirs = jax.jit(f, out_shardings=S_HOST)
    _check(ours(inp_host, inp_dev), theirs(inp_host, inp_dev), (NP * NP * 8, NP * NP * 2))
    assert ours.lower(inp_host, inp_dev).compile().as_text()  # compiles


def test_parameter_streaming_with_scalar_and_constant(front: Any) -> None:
    s_host = NamedSharding(MESH, P(), memory_kind="pinned_host")

    def f(scalar: Any) -> Any:
        return jax.device_put(scalar, s_host), jax.device_put(2, s_host)

    ours = front(f, in_shardings=P(), out_shardings=s_host)
    with jax.set_mesh(MESH):
        got = ours(1)
    _check(got, jax.jit(f, out_shardings=s_host)(1), (1, 2))


def test_parameter_and_output_streaming_with_array(front: Any) -> None:
    inp_host = jax.device_put(NP, S_HOST)
    ours = front(lambda x: (x, x), in_shardings=S_HOST, out_shardings=(S_HOST, S_HOST))
    theirs = jax.jit(lambda x: (x, x), out_shardings=(S_HOST, S_HOST))
    _check(ours(inp_host), theirs(inp_host), (NP, NP))


def test_output_streaming(front: Any) -> None:
    arr = jax.device_put(NP.astype(np.float32), S_DEV)
    ours = front(lambda x: x + 1.0, in_shardings=S_DEV, out_shardings=S_HOST)
    theirs = jax.jit(lambda x: x + 1.0, out_shardings=S_HOST)
    _check(ours(arr), theirs(arr), NP + 1.0)


def test_weight_offload_with_device_put_on_the_output(front: Any) -> None:
    seen = []

    def f(x: Any) -> Any:
        x = x * 2
        y = jax.device_put(x, S_HOST)
        seen.append((jax.typeof(x).memory_space, jax.typeof(y).memory_space))
        return y

    arr = jax.device_put(NP, S_DEV)
    with jax.set_mesh(MESH):
        ours = front(f, in_shardings=P("x", "y"), out_shardings=P("x", "y"))(arr)
    theirs = jax.jit(f)(arr)
    _check(ours, theirs, NP * 2)
    space = jax.memory.Space
    assert seen == [(space.Device, space.Host)] * 2  # traced once by each


def test_output_streaming_inside_scan(front: Any) -> None:
    mesh = jax.make_mesh((1, 1, 2), ("x", "y", "z"), axis_types=(AUTO,) * 3)
    np_inp = np.arange(512).reshape(8, 8, 8)
    arr = jax.device_put(np_inp, NamedSharding(mesh, P(None, "y", "z")))
    host_s = NamedSharding(mesh, P("y", "z"), memory_kind="pinned_host")

    def f(xs: Any) -> Any:
        def body(carry: Any, x: Any) -> Any:
            return carry, jax.device_put(x + carry, host_s)

        return jax.lax.scan(body, 1, xs)[1]

    with jax.set_mesh(mesh):
        ours = front(f, in_shardings=P(None, "y", "z"), out_shardings=P(None, "y", "z"))(arr)
    theirs = jax.jit(f)(arr)
    np.testing.assert_array_equal(np.asarray(ours), np_inp + 1)
    np.testing.assert_array_equal(np.asarray(theirs), np_inp + 1)
    assert ours.sharding.memory_kind == theirs.sharding.memory_kind == "pinned_host"


def test_parameter_streaming_inside_scan(front: Any) -> None:
    mesh = jax.make_mesh((1, 1, 2), ("x", "y", "z"), axis_types=(AUTO,) * 3)
    np_inp = np.arange(512.0).reshape(8, 8, 8)
    arr_host = jax.device_put(np_inp, NamedSharding(mesh, P("x", "y", "z"), "pinned_host"))

    def f(xs: Any) -> Any:
        def body(carry: Any, x: Any) -> Any:
            return carry, jax.device_put(x, jax.memory.Space.Device) + carry

        return jax.lax.scan(body, 1.0, xs)

    out_s = NamedSharding(mesh, P(None, None, "z"))
    # A bare P() beside NamedShardings needs a mesh in context, as in jax.jit.
    scalar_s = NamedSharding(mesh, P())
    ours = front(f, in_shardings=arr_host.sharding, out_shardings=(scalar_s, out_s))(arr_host)
    theirs = jax.jit(f)(arr_host)
    _check(ours[1], theirs[1], np_inp + 1.0)
    assert ours[1].sharding == NamedSharding(mesh, P(None, None, "z"), memory_kind="device")


def test_mixing_memory_spaces_in_one_op_is_jax_error(front: Any) -> None:
    arr_dev = jax.device_put(NP.astype(np.float32), S_DEV)
    arr_host = jax.device_put(NP.astype(np.float32), S_HOST)
    with pytest.raises(ValueError, match="memory_space of all inputs.*must be the same"):
        jax.jit(lambda x, y: x + y)(arr_dev, arr_host)
    with (
        jax.set_mesh(MESH),
        pytest.raises(ValueError, match="memory_space of all inputs.*must be the same"),
    ):
        front(lambda x, y: x + y, in_shardings=P("x", "y"), out_shardings=P())(arr_dev, arr_host)


def test_host_multi_outputs(front: Any) -> None:
    s = NamedSharding(MESH, P("x"))
    inp = jax.device_put(NP.astype(np.float32), s)

    def f(x: Any, y: Any) -> Any:
        x, y = jnp.sin(x), jnp.cos(y)
        return jax.device_put(x, s.with_memory_kind("pinned_host")), jax.device_put(y, s)

    with jax.set_mesh(MESH):
        ours = front(f, in_shardings=P("x"), out_shardings=P("x"))(inp, inp)
    theirs = jax.jit(f)(inp, inp)
    _check(ours, theirs)
    assert [o.sharding for o in ours] == [s.with_memory_kind("pinned_host"), s]


def test_out_shardings_single_output(front: Any) -> None:
    out_s = NamedSharding(MESH, P(), memory_kind="pinned_host")
    inp = jax.device_put(NP, S_DEV)
    ours = front(lambda x: jnp.sum(x * 2), in_shardings=S_DEV, out_shardings=out_s)
    theirs = jax.jit(lambda x: jnp.sum(x * 2), out_shardings=out_s)
    _check(ours(inp), theirs(inp))
    assert ours(inp).sharding == out_s
    kinds = ours.lower(inp).compile().executable.loaded.get_output_memory_kinds()
    assert kinds == theirs.lower(inp).compile().runtime_executable().get_output_memory_kinds()

    def h(x: Any) -> Any:
        return jax.device_put(jnp.sum(x * 2), out_s)

    with jax.set_mesh(MESH):
        got = front(h, in_shardings=P("x", "y"), out_shardings=P())(inp)
    _check(got, jax.jit(h)(inp))


def test_in_shardings_with_another_memory_is_an_error(front: Any) -> None:
    host_in = S_DEV.with_memory_kind("pinned_host")
    theirs = jax.jit(lambda x: x * 2, in_shardings=host_in)
    ours = front(lambda x: x * 2, in_shardings=host_in, out_shardings=S_DEV)
    inp = jax.device_put(NP, S_DEV)
    uncommitted = jnp.arange(16).reshape(8, 2)
    for arg in (uncommitted, inp):  # uncommitted arrays too, as jax.jit
        with pytest.raises(ValueError, match="Memory kinds passed to jax.jit does not match"):
            theirs(arg)
        with pytest.raises(ValueError, match=r"memory kind 'pinned_host'.*lives in 'device'"):
            ours(arg)
    dev_in = S_DEV.with_memory_kind("device")
    _check(
        front(lambda x: x * 2, in_shardings=dev_in, out_shardings=dev_in)(inp),
        jax.jit(lambda x: x * 2, in_shardings=dev_in)(inp),
        NP * 2,
    )


@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_in_out_shardings_reduction(kind: str, front: Any) -> None:
    out_s = NamedSharding(MESH, P(), memory_kind=kind)
    inp = jax.device_put(NP, S_DEV)
    ours = front(jnp.sum, in_shardings=S_DEV, out_shardings=out_s)
    theirs = jax.jit(jnp.sum, in_shardings=S_DEV, out_shardings=out_s)
    _check(ours(inp), theirs(inp), NP.sum())
    c_ours, c_theirs = ours.lower(inp).compile(), theirs.lower(inp).compile()
    assert c_ours.output_shardings == c_theirs.output_shardings
    assert c_ours.input_shardings == c_theirs.input_shardings


def test_close_over_host_array_and_stream(front: Any) -> None:
    inp_host = jax.device_put(NP, S_HOST)

    def f() -> Any:
        return jax.device_put(inp_host, S_DEV) * 2

    ours = front(f, in_shardings=(), out_shardings=S_DEV)()
    _check(ours, jax.jit(f, out_shardings=S_DEV)(), NP * 2)


def test_device_put_inside_moves_host_inputs_to_device(front: Any) -> None:
    inp_host = jax.device_put(NP, S_HOST)

    def f(a: Any, b: Any) -> Any:
        x, y = jax.device_put((a, b), S_DEV)
        return x * y

    ours = front(f, in_shardings=S_HOST, out_shardings=S_DEV)(inp_host, inp_host)
    _check(ours, jax.jit(f)(inp_host, inp_host), NP * NP)


def test_default_and_stated_device_memory_share_one_executable(front: Any) -> None:
    s2 = NamedSharding(MESH, P("x", "y"), memory_kind="device")
    f = front(lambda x: x @ x.T, in_shardings=S_DEV, out_shardings=P())
    g = front(lambda x: x @ x.T, in_shardings=s2, out_shardings=P())
    partitioner.clear_caches()  # not an equal program an earlier case compiled
    with jax.set_mesh(MESH), partitioner.recording() as counts:
        out, out2 = f(NP), g(NP)
    assert counts["compile"] == 1
    want = jax.jit(lambda x: x @ x.T)(NP)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(want))


def test_no_donation_across_memory_kinds(front: Any) -> None:
    s_hbm = NamedSharding(MESH, P("x"))
    s_host = s_hbm.with_memory_kind("pinned_host")
    for make in (jax.jit, front):
        inp = jax.device_put(NP, s_hbm)
        f = make(lambda x: x * 2, in_shardings=s_hbm, out_shardings=s_host, donate_argnums=0)
        with pytest.warns(UserWarning, match="donated buffers were not usable"):
            f(inp)
            hlo = f.lower(inp).compiler_ir("hlo").as_hlo_text()
        assert not inp.is_deleted()
        assert "input_output_alias" not in hlo


def test_donation_in_default_memory(front: Any) -> None:
    s = NamedSharding(MESH, P())
    for make in (jax.jit, front):
        x = jax.device_put(NP, s)
        f = make(lambda x: x * 2, in_shardings=s, out_shardings=s, donate_argnums=0)
        assert "input_output_alias" in f.lower(x).compiler_ir("hlo").as_hlo_text()
        f(x)
        assert x.is_deleted()


def test_grad_through_a_device_put_to_device(front: Any) -> None:
    arr_host = jax.device_put(np.arange(8.0), NamedSharding(MESH, P("x"), "pinned_host"))
    device_s = arr_host.sharding.with_memory_kind("device")

    def loss(f: Any) -> Any:
        return jax.jit(jax.grad(lambda x: f(x).sum()))

    ours = front(lambda x: jax.device_put(x, device_s), in_shardings=arr_host.sharding,
                out_shardings=device_s)  # fmt: skip
    theirs = jax.jit(lambda x: jax.device_put(x, device_s))
    g_ours, g_theirs = loss(ours)(arr_host), loss(theirs)(arr_host)
    np.testing.assert_array_equal(np.asarray(g_ours), np.asarray(g_theirs))
    assert g_ours.sharding.memory_kind == g_theirs.sharding.memory_kind == "pinned_host"


# --- layout_test.py ---

S_XY = NamedSharding(MESH, P("x", "y"))
S_X = NamedSharding(MESH, P("x"))


def _lower_both(front: Any, fun: Any, *args: Any, **kw: Any) -> tuple[Any, Any]:
    return front(fun, **kw).lower(*args).compile(), jax.jit(fun, **kw).lower(*args).compile()


def test_auto_layout_round_trip(front: Any) -> None:
    np1 = np.arange(64 * 64, dtype=np.int32).reshape(64, 64)
    np2 = np1 + 1
    sds1 = jax.ShapeDtypeStruct(np1.shape, np1.dtype, sharding=S_XY)
    sds2 = jax.ShapeDtypeStruct(np2.shape, np2.dtype, sharding=S_X)
    auto = (Format(Layout.AUTO, S_XY), Format(Layout.AUTO, S_X))
    apply_o, apply_t = _lower_both(
        front, lambda x, y: (x.T, y.T), sds1, sds2, in_shardings=auto, out_shardings=auto
    )
    assert apply_o.input_formats == apply_t.input_formats
    assert apply_o.output_formats == apply_t.output_formats
    arg_formats, kw_formats = apply_o.input_formats
    assert kw_formats == {}

    init_o, init_t = _lower_both(
        front,
        lambda x, y: (x * 2, y * 2),
        sds1,
        sds2,
        in_shardings=(S_XY, S_X),
        out_shardings=arg_formats,
    )
    assert init_o.output_formats == init_t.output_formats
    arr1, arr2 = jax.device_put(np1, S_XY), jax.device_put(np2, S_X)
    init_out = init_o(arr1, arr2)
    assert [o.format for o in init_out] == list(init_o.output_formats)
    apply_out = apply_o(*init_out)
    apply_ref = apply_t(*init_t(arr1, arr2))
    for a, b in zip(apply_out, apply_ref, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.format == b.format
    np.testing.assert_array_equal(np.asarray(apply_out[0]), (np1 * 2).T)


def test_default_and_auto_layouts_of_a_transpose(front: Any) -> None:
    np_inp = np.arange(32, dtype=np.int32).reshape(4, 4, 2)
    sds = jax.ShapeDtypeStruct(np_inp.shape, np_inp.dtype, sharding=S_XY)
    out_s = NamedSharding(MESH, P(None, "y", "x"))
    plain_o, plain_t = _lower_both(
        front, lambda x: x.T, sds, in_shardings=S_XY, out_shardings=out_s
    )
    assert plain_o.input_formats == plain_t.input_formats
    assert plain_o.output_formats == plain_t.output_formats
    assert plain_o.input_formats[0][0].layout.major_to_minor[::-1] == (2, 1, 0)
    out = plain_o(jax.device_put(np_inp, S_XY))
    np.testing.assert_array_equal(np.asarray(out), np_inp.T)
    assert out.sharding == out_s

    auto_o, auto_t = _lower_both(
        front,
        lambda x: x.T, sds, in_shardings=Format(Layout.AUTO, S_XY),
        out_shardings=Format(Layout.AUTO, out_s),
    )  # fmt: skip
    assert auto_o.input_formats == auto_t.input_formats
    assert auto_o.output_formats == auto_t.output_formats


def test_bare_layout_is_an_error(front: Any) -> None:
    with pytest.raises(ValueError, match="does not accept device-local layouts directly"):
        jax.jit(lambda x: x, in_shardings=Layout.AUTO, out_shardings=Layout.AUTO).lower(NP)
    with pytest.raises(ValueError, match="does not accept device-local layouts directly"):
        front(lambda x: x, in_shardings=Layout.AUTO, out_shardings=Layout.AUTO)


def test_auto_output_layout_of_a_transpose(front: Any) -> None:
    arr = jax.device_put(np.arange(64).reshape(8, 8), S_XY)
    out_s = NamedSharding(MESH, P("y", "x"))
    c_o, c_t = _lower_both(
        front,
        lambda x: x.T, arr, in_shardings=Format(None, S_XY),
        out_shardings=Format(Layout.AUTO, out_s),
    )  # fmt: skip
    assert c_o.input_formats == c_t.input_formats
    assert c_o.output_formats == c_t.output_formats
    assert c_o.output_formats.layout.major_to_minor[::-1] == (0, 1)
    out = c_o(arr)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(arr).T)
    assert out.format == c_o.output_formats
    assert out.sharding == out_s


def test_auto_layouts_with_numpy_arguments(front: Any) -> None:
    np_inp = np.arange(32).reshape(4, 8)
    fmt = Format(Layout.AUTO, S_XY)
    c_o, c_t = _lower_both(
        front, lambda x: x.T, np_inp, in_shardings=fmt, out_shardings=Format(Layout.AUTO, S_XY)
    )
    assert c_o.input_formats == c_t.input_formats
    assert c_o.input_formats[0][0].layout.major_to_minor[::-1] == (1, 0)
    out = c_o(np_inp)
    np.testing.assert_array_equal(np.asarray(out), np_inp.T)
    assert out.sharding == c_t(np_inp).sharding == S_XY


def test_unused_arguments_keep_their_formats(front: Any) -> None:
    def f(x: Any, y: Any, z: Any, a: Any, b: Any, c: Any) -> Any:
        return z * 2, b.T

    s = NamedSharding(MESH, P())
    inps = [np.arange(16).reshape(8, 2)] * 6
    auto = Format(Layout.AUTO, s)
    c_o, c_t = _lower_both(front, f, *inps, in_shardings=auto, out_shardings=auto)
    arg_formats, _ = c_o.input_formats
    # The used arguments' layouts as jax's (jax.jit drops unused arguments,
    # keep_unused=False, and reports no format for them; pjit keeps every argument).
    for ours_fmt, theirs_fmt in zip(arg_formats, c_t.input_formats[0], strict=True):
        assert theirs_fmt.layout is None or ours_fmt.layout == theirs_fmt.layout
    assert [f.layout for f in c_t.input_formats[0]].count(None) == 4
    out1, out2 = c_o(*inps)
    again = front(f, in_shardings=arg_formats, out_shardings=s).lower(*inps).compile()
    assert again.input_formats[0] == arg_formats
    out3, out4 = again(*inps)
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(out3))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out4))
    arrs = [jax.device_put(i, fmt) for i, fmt in zip(inps, arg_formats, strict=True)]
    out5, _ = c_o(*arrs)
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(out5))


def test_concrete_output_layout(front: Any) -> None:
    np_inp = np.arange(16 * 128).reshape(16, 128)
    arr = jax.device_put(np_inp, S_X)
    custom = Layout(major_to_minor=(0, 1))
    out_fmt = Format(custom, NamedSharding(MESH, P(None, "x")))
    ours = front(lambda x: x.T, in_shardings=S_X, out_shardings=out_fmt)(arr)
    theirs = jax.jit(lambda x: x.T, out_shardings=out_fmt)(arr)
    np.testing.assert_array_equal(np.asarray(ours), np_inp.T)
    assert ours.format == theirs.format
    assert ours.format.layout.major_to_minor == custom.major_to_minor


def test_layout_of_the_wrong_rank(front: Any) -> None:
    fmt = Format(Layout(major_to_minor=(0, 1, 2)), SingleDeviceSharding(jax.devices()[0]))
    with pytest.raises(ValueError, match="Length of major_to_minor and the rank"):
        jax.jit(lambda x: x * 2, in_shardings=fmt)(np.arange(8))
    with pytest.raises(ValueError, match=r"orders 3 dimension\(s\).*shape \(8,\)"):
        front(lambda x: x * 2, in_shardings=fmt, out_shardings=None)(np.arange(8))


def test_concrete_input_layout(front: Any) -> None:
    np_inp = np.arange(16 * 128).reshape(16, 128)
    arr = jax.device_put(np_inp, S_XY)
    row_major = Layout(major_to_minor=(0, 1))
    ours = front(lambda x: x.T, in_shardings=Format(row_major, S_XY),
                out_shardings=Format(Layout.AUTO, NamedSharding(MESH, P("y", "x"))))  # fmt: skip
    theirs = jax.jit(lambda x: x.T, in_shardings=Format(row_major, S_XY),
                     out_shardings=Format(Layout.AUTO))  # fmt: skip
    a, b = ours(arr), theirs(arr)
    np.testing.assert_array_equal(np.asarray(a), np_inp.T)
    assert a.format.layout == b.format.layout
    assert a.format.layout.major_to_minor == row_major.major_to_minor[::-1]

    col_major = Layout(major_to_minor=(1, 0))
    with pytest.raises(ValueError, match="Layout passed to jit does not match"):
        jax.jit(lambda x: x.T, in_shardings=Format(col_major, S_XY))(arr)
    with pytest.raises(ValueError, match=r"asks for layout.*laid out as"):
        front(lambda x: x.T, in_shardings=Format(col_major, S_XY), out_shardings=None)(arr)


def test_input_layout_with_jnp_and_numpy_arguments(front: Any) -> None:
    major_last = Layout(major_to_minor=(1, 0))
    fmt = Format(major_last, SingleDeviceSharding(jax.devices()[0]))
    ours = front(lambda x: x + 1, in_shardings=fmt, out_shardings=fmt.sharding)
    theirs = jax.jit(lambda x: x + 1, in_shardings=fmt)
    arr = jnp.arange(8 * 128).reshape(8, 128)
    np_inp = np.arange(8 * 128).reshape(8, 128)
    for arg in (arr, arr, np_inp, np_inp):  # twice each: the cached path too
        _check(ours(arg), theirs(arg), np_inp + 1)


@pytest.mark.parametrize("layout", ["concrete", "matching-out"])
def test_layout_donation(layout: str, front: Any) -> None:
    np_inp = np.arange(16 * 128).reshape(16, 128)
    fmt = Format(Layout(major_to_minor=(0, 1)), S_XY)
    out = fmt if layout == "matching-out" else S_XY
    for make in (jax.jit, front):
        arr = jax.device_put(np_inp, fmt)
        make(lambda x: x * x, in_shardings=fmt, out_shardings=out, donate_argnums=0)(arr)
        assert arr.is_deleted()


def test_donation_with_auto_on_one_side_is_an_error(front: Any) -> None:
    for side, kw in (
        ("output", {"in_shardings": Format(Layout.AUTO, S_X), "out_shardings": S_X}),
        ("input", {"in_shardings": S_X, "out_shardings": Format(Layout.AUTO, S_X)}),
    ):
        sds = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=S_X)
        with pytest.raises(ValueError, match=f"Did you mean to set the.*{side} layout.*AUTO"):
            jax.jit(lambda x: x * 2, donate_argnums=0, **kw).lower(sds)
        with pytest.raises(ValueError, match=f"Did you mean to set the.*{side} layout.*AUTO"):
            front(lambda x: x * 2, donate_argnums=0, **kw).lower(sds)


def test_donation_into_the_default_layout_aliases(front: Any) -> None:
    np_inp = np.arange(256).reshape(16, 16)
    for make in (jax.jit, front):
        arr = jax.device_put(np_inp, S_XY)
        out_fmt = Format(arr.format.layout, S_XY)
        f = make(lambda x: x * 2, in_shardings=S_XY, out_shardings=out_fmt, donate_argnums=0)
        assert "tf.aliasing_output = 0" in f.lower(arr).as_text()
        out = f(arr)
        np.testing.assert_array_equal(np.asarray(out), np_inp * 2)
        assert out.format == out_fmt


def test_layout_on_a_shape_dtype_struct(front: Any) -> None:
    arr = jax.device_put(np.arange(16.0).reshape(8, 2), S_XY)
    out_format = (
        jax.jit(jnp.sin, out_shardings=Format(Layout(major_to_minor=(1, 0)), S_XY))
        .lower(arr)
        .compile()
        .output_formats
    )
    sds = jax.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=out_format)
    c_o, c_t = _lower_both(front, lambda x: x * 2, sds, in_shardings=S_XY, out_shardings=S_XY)
    assert c_o.input_formats[0][0] == out_format
    assert c_t.input_formats[0][0].layout == out_format.layout
    x = jax.device_put(np.asarray(arr), out_format)
    np.testing.assert_array_equal(np.asarray(c_o(x)), np.asarray(arr) * 2)
    with pytest.raises(ValueError, match="compiled for input layouts that disagree"):
        c_o(arr)  # the default layout, not the one it was compiled for


def test_arrays_in_another_layout_compile_again(front: Any) -> None:
    np_inp = np.arange(256).reshape(16, 16)
    arr = jax.device_put(np_inp, S_XY)
    arr2 = jax.device_put(np_inp, Format(Layout(arr.format.layout.major_to_minor[::-1]), S_XY))
    f = front(lambda x: x @ x.T, in_shardings=P("x", "y"), out_shardings=P("x", "y"))
    with jax.set_mesh(MESH):
        out, out2 = f(arr), f(arr2)
    want = np_inp @ np_inp.T
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(out2), want)


# --- pjit_test.py: SingleDeviceSharding and Compiled shardings ---


def test_single_device_sharding_add_and_cache(front: Any) -> None:
    s = SingleDeviceSharding(jax.devices()[0])
    a = jnp.array([1, 2, 3], dtype=jnp.float32)
    b = jnp.array([4, 5, 6], dtype=jnp.float32)
    ours = front(lambda x, y: x + y, in_shardings=s, out_shardings=s)
    theirs = jax.jit(lambda x, y: x + y, out_shardings=s)
    with partitioner.recording() as counts:
        o1, o2 = ours(a, b), ours(a, b)
    _check(o1, theirs(a, b), np.array([5.0, 7.0, 9.0]))
    _check(o2, o1)
    assert counts["compile"] <= 1
    assert isinstance(o1.sharding, SingleDeviceSharding)


def test_grad_of_pjit_single_device_sharding(front: Any) -> None:
    s = SingleDeviceSharding(jax.devices()[0])
    a = jnp.array(3.0)
    ours = jax.grad(front(lambda x: x * x, in_shardings=s, out_shardings=s))(a)
    theirs = jax.grad(jax.jit(lambda x: x * x, in_shardings=s, out_shardings=s))(a)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_vmap_pjit_single_device(front: Any) -> None:
    s = SingleDeviceSharding(jax.devices()[0])
    x = jnp.arange(12.0).reshape(3, 4)
    ours = jax.vmap(front(lambda v: v * 2, in_shardings=s, out_shardings=s))(x)
    theirs = jax.vmap(jax.jit(lambda v: v * 2, in_shardings=s, out_shardings=s))(x)
    _check(ours, theirs, np.arange(12.0).reshape(3, 4) * 2)


def test_single_device_sharding_preserved(front: Any) -> None:
    s0, s1 = (SingleDeviceSharding(d) for d in jax.devices()[:2])
    x = jnp.arange(8)
    y = jax.device_put(x, jax.devices()[1])
    for arg, s in ((x, s0), (y, s1)):
        got = front(lambda v: v, in_shardings=s, out_shardings=s)(arg)
        _check(got, jax.jit(lambda v: v)(arg), np.arange(8))
    moved = front(lambda v: v * 3, in_shardings=s1, out_shardings=s1)(x)
    _check(moved, jax.jit(lambda v: v * 3, out_shardings=s1)(x), np.arange(8) * 3)


def test_one_device_named_sharding_preserved(front: Any) -> None:
    s = NamedSharding(jax.sharding.Mesh([jax.devices()[0]], "x"), P("x"))
    inp = jax.device_put(np.arange(8), s)
    got = front(lambda x: x, in_shardings=s, out_shardings=s)(inp)
    _check(got, jax.jit(lambda x: x)(inp), np.arange(8))
    assert got.sharding == s


def test_input_shardings_single_device(front: Any) -> None:
    s0 = SingleDeviceSharding(jax.devices()[0])
    compiled = (
        front(lambda x: x * 2, in_shardings=s0, out_shardings=s0).lower(np.arange(8)).compile()
    )
    (ins,), _ = compiled.input_shardings
    assert ins == jax.jit(lambda x: x * 2).lower(np.arange(8)).compile().input_shardings[0][0]
    assert ins == s0


def test_device_put_in_default_memory_adds_nothing(front: Any) -> None:
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AUTO,), devices=jax.devices()[:2])
    arr = jax.device_put(np.arange(8), NamedSharding(mesh, P("x")))

    def f(x: Any) -> Any:
        return jax.device_put(x * 2, NamedSharding(mesh, P()))

    ours = front(f, in_shardings=arr.sharding, out_shardings=NamedSharding(mesh, P()))
    for text in (ours.lower(arr).as_text(), jax.jit(f).lower(arr).as_text()):
        assert "annotate_device_placement" not in text
        assert "memory_kind" not in text
    # (jax.jit treats this device_put as a no-op and keeps P('x'); pjit's output
    # spec is binding, so only values and memory are compared.)
    got, want = ours(arr), jax.jit(f)(arr)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.sharding.memory_kind == want.sharding.memory_kind == "device"


def test_compiled_shardings_are_jax_shardings(front: Any) -> None:
    inp = jax.device_put(NP, S_XY)
    out_s = NamedSharding(MESH, P("x"))
    c_o, c_t = _lower_both(front, lambda x: x * 2, inp, in_shardings=S_XY, out_shardings=out_s)
    assert c_o.input_shardings == c_t.input_shardings
    assert c_o.output_shardings == c_t.output_shardings
    assert c_o.output_shardings.spec == P("x")
    assert c_o.output_shardings.memory_kind == "device"
    assert c_o.output_shardings.is_equivalent_to(c_t.output_shardings, 2)
    assert c_o.output_specs == P("x")


def test_lowered_modules_agree_on_memory_attributes(front: Any) -> None:
    inp = jax.ShapeDtypeStruct((8, 2), jnp.int32, sharding=S_DEV)
    ours = front(lambda x: x * 2, in_shardings=S_DEV, out_shardings=S_HOST).lower(inp).as_text()
    theirs = jax.jit(lambda x: x * 2, in_shardings=S_DEV, out_shardings=S_HOST).lower(inp).as_text()
    for text in (ours, theirs):
        assert 'mhlo.memory_kind = "device"' in text
        assert 'mhlo.memory_kind = "pinned_host"' in text
        assert "annotate_device_placement" in text

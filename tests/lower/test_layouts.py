"""Spec leaf types beyond PartitionSpec: ``Format`` (layouts, ``Layout.AUTO``) and
``SingleDeviceSharding``, through pjit beside jax.jit (values, formats, errors)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout, with_layout_constraint
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import partitioner
from partitioner import pjit

pytestmark = pytest.mark.usefixtures("partitioner_mode")

MESH = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
S = NamedSharding(MESH, P("x", "y"))
ST = NamedSharding(MESH, P("y", "x"))
COL = Layout(major_to_minor=(1, 0))  # column-major for a 2-d value
X = np.arange(128.0, dtype=np.float32).reshape(8, 16)
SDS = jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=S)


def _both(fun: Any, **kw: Any) -> tuple[Any, Any]:
    return pjit(fun, **kw), jax.jit(fun, **kw)


def test_output_layout() -> None:
    ours, theirs = _both(lambda x: x.T * 2, in_shardings=S, out_shardings=Format(COL, ST))
    x = jax.device_put(X, S)
    a, b = ours(x), theirs(x)
    np.testing.assert_allclose(np.asarray(a), X.T * 2)
    assert a.format == b.format
    assert a.format.layout.major_to_minor == (1, 0)
    c_ours, c_theirs = ours.lower(x).compile(), theirs.lower(x).compile()
    assert c_ours.output_formats == c_theirs.output_formats
    assert c_ours.input_formats == c_theirs.input_formats
    assert 'mhlo.layout_mode = "{0,1}"' in ours.lower(x).as_text()


def test_input_layout_with_an_array_in_it() -> None:
    ours, theirs = _both(lambda x: x * 2, in_shardings=Format(COL, S), out_shardings=S)
    x = jax.device_put(X, Format(COL, S))
    np.testing.assert_allclose(np.asarray(ours(x)), X * 2)
    assert ours(x).sharding == theirs(x).sharding
    (fmt,), _ = ours.lower(x).compile().input_formats
    assert fmt.layout.major_to_minor == (1, 0)


def test_numpy_argument_is_laid_out_as_asked() -> None:
    ours, theirs = _both(lambda x: x + 1, in_shardings=Format(COL, S), out_shardings=S)
    np.testing.assert_allclose(np.asarray(ours(X)), np.asarray(theirs(X)))


def test_committed_argument_in_another_layout_is_an_error() -> None:
    ours, theirs = _both(lambda x: x, in_shardings=Format(COL, S), out_shardings=S)
    x = jax.device_put(X, S)  # row-major
    with pytest.raises(ValueError, match="Layout passed to jit does not match"):
        theirs(x)
    with pytest.raises(
        ValueError,
        match=r"(?s)^Layout passed to jit does not match.*argument x:.*Format\(layout, sharding\)",
    ):
        ours(x)


def test_auto_layouts_report_what_xla_chose() -> None:
    ours, theirs = _both(
        lambda x: x * 2, in_shardings=Format(Layout.AUTO, S), out_shardings=Format(Layout.AUTO, S)
    )
    c_ours, c_theirs = ours.lower(SDS).compile(), theirs.lower(SDS).compile()
    assert c_ours.input_formats == c_theirs.input_formats
    assert c_ours.output_formats == c_theirs.output_formats
    assert 'mhlo.layout_mode = "auto"' in ours.lower(SDS).as_text()
    (fmt,), _ = c_ours.input_formats
    x = jax.device_put(X, fmt)
    np.testing.assert_allclose(np.asarray(c_ours(x)), np.asarray(c_theirs(x)))


def test_auto_layout_with_a_concrete_array_is_an_error() -> None:
    ours, theirs = _both(lambda x: x, in_shardings=Format(Layout.AUTO, S), out_shardings=S)
    x = jax.device_put(X, S)
    with pytest.raises(ValueError, match="Layout.AUTO"):
        theirs(x)
    with pytest.raises(ValueError, match=r"Layout.AUTO.*ShapeDtypeStruct"):
        ours(x)


def test_layout_of_the_wrong_rank_is_an_error() -> None:
    bad = Format(Layout(major_to_minor=(0,)), S)
    ours, theirs = _both(lambda x: x, in_shardings=bad, out_shardings=S)
    x = jax.device_put(X, S)
    with pytest.raises(ValueError, match="major_to_minor"):
        theirs(x)
    with pytest.raises(
        ValueError,
        match=r"(?s)^Length of major_to_minor.*argument x:.*orders 1 dimension.*\(8, 16\)",
    ):
        ours(x)
    out_bad = pjit(lambda x: x, in_shardings=S, out_shardings=bad)
    with pytest.raises(ValueError, match=r"output.*orders 1 dimension"):
        out_bad(x)


def test_with_layout_constraint_inside() -> None:
    def f(x: Any) -> Any:
        return with_layout_constraint(x * 2, COL) + 1

    ours, theirs = _both(f, in_shardings=S, out_shardings=S)
    x = jax.device_put(X, S)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(theirs(x)))
    assert "LayoutConstraint" in ours.lower(x).as_text()


def test_format_carries_a_memory_kind() -> None:
    host = Format(COL, S.with_memory_kind("pinned_host"))
    ours, theirs = _both(lambda x: x * 2, in_shardings=S, out_shardings=host)
    x = jax.device_put(X, S)
    a, b = ours(x), theirs(x)
    assert a.format == b.format
    assert a.sharding.memory_kind == "pinned_host"


def test_single_device_sharding_leaves() -> None:
    d1 = SingleDeviceSharding(jax.devices()[1])
    ours, theirs = _both(lambda x: x + 1, in_shardings=d1, out_shardings=d1)
    a, b = ours(np.ones(4, np.float32)), theirs(np.ones(4, np.float32))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b))
    assert a.sharding == b.sharding
    assert isinstance(a.sharding, SingleDeviceSharding)
    sds = jax.ShapeDtypeStruct((4,), jnp.float32)
    c_ours, c_theirs = ours.lower(sds).compile(), theirs.lower(sds).compile()
    assert c_ours.input_shardings == c_theirs.input_shardings
    assert c_ours.output_shardings == c_theirs.output_shardings


def test_single_device_sharding_against_an_array_elsewhere() -> None:
    d1 = SingleDeviceSharding(jax.devices()[1])
    ours, theirs = _both(lambda x: x + 1, in_shardings=d1, out_shardings=d1)
    x = jax.device_put(X, S)
    with pytest.raises(ValueError):
        theirs(x)
    with pytest.raises(ValueError, match=r"argument x\b"):
        ours(x)


def test_constraint_with_a_format_leaf() -> None:
    fmt = Format(Layout(major_to_minor=(0, 1)), ST)

    def f(wsc: Any) -> Any:
        return lambda x: wsc(x.T, fmt) * 2

    ours = pjit(f(partitioner.with_sharding_constraint), in_shardings=S, out_shardings=ST)
    theirs = jax.jit(f(jax.lax.with_sharding_constraint))
    x = jax.device_put(X, S)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(theirs(x)))
    assert "LayoutConstraint" in ours.lower(x).as_text()
